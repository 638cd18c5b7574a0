"""The console flags a replica whose node agent names another card than the fleet file: its
GPU cell in the fleet table is drawn as a warning, and its detail says which card its
prior is modelled on."""

from __future__ import annotations

from pathlib import Path

from console.app import ConsoleApp
from console.view.fleet import COLUMNS
from console.view.format import Tone, fit
from console.widgets.fleet_table import FleetTable
from router.config.loader import load_fleet
from router.replica import Telemetry
from tests.console_helpers import detail_facts, drawn_text, loaded_rig

FLEET = (
    Path(__file__).resolve().parent.parent / "examples" / "fleets" / "untuned-four-generations.yaml"
)
FLAG = "NVML reports NVIDIA H100 80GB HBM3, fleet file says L4"


async def test_a_replica_on_another_card_than_declared_is_flagged_in_its_row_and_detail() -> None:
    rig = loaded_rig(load_fleet(FLEET))
    l4 = rig.core.replica("l4-0")
    l4.telemetry = Telemetry(0.5, rig.clock(), gpu_name="NVIDIA H100 80GB HBM3")
    rig.core.refresh_capacity()
    app = ConsoleApp(rig.backend, auto_refresh=False)
    async with app.run_test(size=(160, 40)) as pilot:  # wide and tall: every row drawn
        app.refresh_data(tick=True)
        await pilot.pause()
        table = app.query_one(FleetTable)
        assert drawn_text(table, "l4-node/0", "gpu") == "0 L4"
        gpu = [c.id for c in COLUMNS].index("gpu")
        cells = {row.key: row.cells[gpu] for row in table.rows_shown}
        assert cells["l4-node/0"] == (fit("0 L4", 12), Tone.WARN)
        assert cells["l4-node/1"] == (fit("1 L4", 12), Tone.NORMAL)
        facts = await detail_facts(app, pilot, "l4-0")
        assert f"card ⚠ {FLAG}: its prior is modelled on H100-SXM" in facts.splitlines()
