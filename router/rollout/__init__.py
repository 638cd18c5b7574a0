"""Model rollouts: moving every replica of a fleet to a new version without losing a request.

- ``templates``: the placeholders of update commands and requests, filled per replica.
- ``updaters``: how one replica is updated (a command, an HTTP request), with its outcome.
- ``plan``: rolling waves that keep the fleet's learned capacity above an operator's floor.
- ``executor``: the state machine that runs a plan on a live router, step by step, into the
  audit trail.
- ``manager``: one router's rollouts, one at a time, as the admin API steers them.
- ``split``: a share of a model's requests sent to its new version (the core's one hook).
- ``judge``: whether the new version does worse than the old one over a sliding window.
- ``canary``: a canary's steps, automatic rollback and promotion, through the executor.
- ``blue_green``: the fleet file's green set, switched in, drained out, released.
- ``splits``: one router's canary or blue-green split, as the admin API steers it.
- ``command_path``: how a rollout's drains, undrains and splits reach the routers: the way
  an operator's command is given to the router that runs it (docs/decisions/0007).

docs/rollouts.md describes what exists and what does not yet. The package's modules are
imported by name (``router.rollout.plan``); this one imports nothing, so the configuration
loader can use the templates without pulling in the router core.
"""

__all__: list[str] = []
