"""The console flags a replica that does not serve the model the fleet file declares for it:
its state reads ``mismatch`` in the fleet table, and its detail says what it serves."""

from __future__ import annotations

from console.app import ConsoleApp
from console.widgets.fleet_table import FleetTable
from router.http.served_models import ServedModels
from tests.console_helpers import detail_facts, drawn_text, loaded_rig

FLAG = "serves test-model-v2, fleet file says test-model"


async def test_a_mismatching_replica_is_flagged_in_the_table_and_its_detail() -> None:
    rig = loaded_rig()
    served = ServedModels(rig.core, interval_s=0)
    for r in rig.core.pool:  # what each replica's /v1/models said
        served.learn(r, ("test-model-v2",) if r.id == "r1" else ("test-model",))
    app = ConsoleApp(rig.backend, auto_refresh=False)
    async with app.run_test(size=(160, 30)) as pilot:  # wide: every column drawn
        app.refresh_data(tick=True)
        await pilot.pause()
        table = app.query_one(FleetTable)
        assert drawn_text(table, "node-0/1", "state") == "⚠ mismatch"
        assert drawn_text(table, "node-0/0", "state") == "● active"
        facts = await detail_facts(app, pilot, "r1")
        assert f"model ⚠ {FLAG}: none of test-model's requests go here" in facts.splitlines()
        await pilot.press("escape")
        served.learn(rig.core.replica("r1"), ("test-model", "test-model-v2"))
        app.refresh_data(tick=True)
        await pilot.pause()
        assert drawn_text(table, "node-0/1", "state") == "● active"
