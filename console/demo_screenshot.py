"""Export the dashboard of a busy emulated fleet as an SVG (the README's screenshot).

    python -m console.demo_screenshot examples/fleets/h100-a100-l4.yaml docs/images/dashboard.svg

The fleet runs on a virtual clock (:mod:`console.demo_load`) for a minute, one refresh per
virtual second so the sparklines have a history; one node's agent is silent (stale), one
replica is draining and one weight is pinned, so every kind of state is on the picture.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from console.app import ConsoleApp
from console.demo_load import FleetDriver
from router.config import load_fleet
from router.control import Drain, SetWeight


async def export(fleet_path: str, out: Path, size: tuple[int, int] = (120, 36)) -> None:
    fleet = load_fleet(fleet_path)
    stale = frozenset({fleet.nodes[-1].name})
    driver = FleetDriver(fleet, rate_rps=250.0, stale_nodes=stale)
    app = ConsoleApp(driver.backend(), auto_refresh=False)
    async with app.run_test(size=size) as pilot:
        for second in range(60):
            driver.advance(1.0)
            if second == 40:
                driver.control.apply(SetWeight(fleet.replicas[2].id, 2.6), actor="console")
                driver.control.apply(Drain(fleet.replicas[-1].id), actor="console")
            app.refresh_data(tick=True)
        await pilot.pause()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(app.export_screenshot(title="gpurouter console"))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write(__doc__ or "")
        return 2
    asyncio.run(export(argv[0], Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
