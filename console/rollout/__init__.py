"""Model rollouts in the console (docs/rollouts.md): start one, watch it, steer it.

- ``model``: the rollout's preview and progress as the console reads them, from either
  backend (the in-process manager's dict and the admin API's JSON have one shape).
- ``form``: the version and the main settings, asked before anything is planned.
- ``confirm``: the plan (waves, capacity shares, what stays in service), then confirm.
- ``progress``: the live progress screen, with pause, resume, abort and rollback.
- ``split_model``: a traffic split (a canary, or the fleet file's blue-green set) as the
  console reads it, from either backend.
- ``canary_form``, ``share_input``, ``split_screen``: a canary's form, its share asked in
  percent, and the split's live screen; ``split_actions``: the app's ``g`` key that joins them,
  each step confirmed.
"""

__all__: list[str] = []
