"""A router that goes away and comes back: the attached console says so, asks again after a
growing wait, resumes the event stream where it was, and never stops. The clock, the sleep
and the connection are injected; nothing here waits on wall time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from console.app import ConsoleApp
from console.attach.admin_http import AsyncAdmin
from console.attach.backend import DECISIONS_WANTED_POLLS, RemoteBackend, fetch_state
from console.attach.events import EventCursor, Opened, follow_events
from console.attach.link import Backoff, Link
from console.attach.state import fleet_from_json
from console.ctl.errors import UnreachableError
from console.widgets.events_pane import EventsPane
from console.widgets.header import DashboardHeader
from router import ControlSurface, ManualClock, RouterCore
from router.control import Event
from router.http.admin import AdminApi
from router.http.health import HealthMonitor
from router.request import Request
from tests.fleet_factory import make_fleet

URL = "http://127.0.0.1:8001"


class Unplugged(httpx.AsyncBaseTransport):
    """The real admin API in this process, behind a cable the test pulls (``down``)."""

    def __init__(self, api: AdminApi) -> None:
        self.inner = httpx.ASGITransport(app=api)
        self.down = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return await self.inner.handle_async_request(request)


class Counting(Unplugged):
    """The cable, counting the requests for each path."""

    def __init__(self, api: AdminApi) -> None:
        super().__init__(api)
        self.asked: dict[str, int] = {}
        self.replicas_asked: list[str] = []
        """The ``replica`` of each request for decisions."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.asked[request.url.path] = self.asked.get(request.url.path, 0) + 1
        if request.url.path == "/admin/decisions":
            self.replicas_asked.append(request.url.params.get("replica", ""))
        if request.url.params.get("running") == "1":
            self.asked["running"] = self.asked.get("running", 0) + 1
        return await super().handle_async_request(request)


async def remote(
    clock: ManualClock, core: RouterCore | None = None, **options: Any
) -> tuple[RemoteBackend, Counting]:
    """An attached backend on ``core``'s admin API (a fresh core of the test fleet if none)."""
    core = core or RouterCore(make_fleet(), clock=clock)
    api = AdminApi(core, ControlSurface(core), HealthMonitor(core, core.fleet.router.health))
    cable = Counting(api)
    admin = AsyncAdmin(URL, token="t", actor="test", transport=cable)
    fleet = fleet_from_json(await admin.get("/admin/fleet"))
    backend = RemoteBackend(
        admin, fleet, await fetch_state(admin), [], read_only=False, clock=clock, **options
    )
    return backend, cable


def test_backoff_doubles_from_half_a_second_to_at_most_ten() -> None:
    assert [Backoff().delay(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_the_link_says_when_it_was_lost_and_back_once_each() -> None:
    clock = ManualClock(50.0)
    link = Link(URL, clock)
    assert link.line() is None
    assert link.changed() is None
    assert link.failed("cannot connect") == 0.5
    clock.advance(0.2)
    assert link.line() == "✖ disconnected 200ms: cannot connect; retrying in 300ms"
    assert link.changed() == f"lost {URL}: cannot connect"
    assert link.changed() is None
    assert link.failed("cannot connect") == 1.0
    assert link.changed() is None  # still the same loss
    link.answered()
    assert link.line() is None
    assert link.changed() == f"reconnected to {URL}"
    assert link.changed() is None


async def test_the_event_stream_resumes_after_the_last_event_delivered() -> None:
    """The stream drops after two events; the next one asks for what came after the second,
    and an event delivered already is not delivered again."""
    asked: list[int] = []
    batches = [[1, 2], [2, 3], []]

    async def open_stream(since: int, _run: str | None) -> AsyncIterator[dict[str, Any]]:
        asked.append(since)
        for seq in batches[len(asked) - 1]:
            yield Event(seq, 0.0, "router", "state", {}, True, f"e{seq}").to_dict()
        if len(asked) == 1:
            raise UnreachableError("lost the connection")

    delivered: list[int] = []
    waits: list[float] = []
    lost: list[str] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await follow_events(
            open_stream,
            EventCursor(),
            lambda e: delivered.append(e.seq),
            sleep=sleep,
            lost=lost.append,
        )
    assert asked == [0, 2, 3]
    assert delivered == [1, 2, 3]
    # Each stream gave events before it ended: the wait starts over; the empty one doubles it.
    assert waits == [0.5, 0.5, 1.0]
    assert lost == ["lost the connection", *["the router closed the event stream"] * 2]


async def test_a_stream_in_a_new_run_starts_over_and_says_the_router_restarted() -> None:
    """Resumed after event 5 of run ``a``, the stream answers in run ``b``: its events 1 and
    2 are delivered, and the restart is heard before them; the next stream resumes in ``b``."""
    asked: list[tuple[int, str | None]] = []

    async def open_stream(since: int, run: str | None) -> AsyncIterator[Opened | dict[str, Any]]:
        asked.append((since, run))
        yield Opened("b")
        for seq in (1, 2) if len(asked) == 1 else ():
            yield Event(seq, 0.0, "router", "state", {}, True, f"e{seq}").to_dict()

    delivered: list[str] = []

    async def sleep(_seconds: float) -> None:
        if len(asked) == 2:
            raise asyncio.CancelledError

    cursor = EventCursor(5, "a")
    with pytest.raises(asyncio.CancelledError):
        await follow_events(
            open_stream,
            cursor,
            lambda e: delivered.append(f"{e.seq}"),
            sleep=sleep,
            restarted=lambda run: delivered.append(f"restarted {run}"),
        )
    assert asked == [(5, "a"), (2, "b")]
    assert delivered == ["restarted b", "1", "2"]
    assert (cursor.since, cursor.run) == (2, "b")


def test_the_first_run_heard_of_is_no_restart() -> None:
    cursor = EventCursor(3)
    assert not cursor.opened("a")
    assert (cursor.since, cursor.run) == (3, "a")
    assert not cursor.opened(None)  # a router too old to name its run
    assert cursor.opened("b")
    assert (cursor.since, cursor.run) == (0, "b")


def test_the_link_tells_a_restart_once_after_its_own_changes() -> None:
    link = Link(URL, ManualClock(0.0))
    link.failed("cannot connect")
    link.answered()
    link.restarted("b")
    assert link.changed() == f"reconnected to {URL}"
    assert link.changed() == f"router restarted: {URL} numbers its events from 1 (run b)"
    assert link.changed() is None


async def test_polls_back_off_while_the_router_is_away_and_return_to_the_refresh_rate() -> None:
    clock = ManualClock(10.0)
    waits: list[float] = []
    settled = asyncio.Event()

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        cable.down = len(waits) < 4
        if len(waits) == 5:
            settled.set()
            await asyncio.Event().wait()  # the test stops the loop here

    backend, cable = await remote(clock, sleep=sleep, interval=lambda: 2.0)
    cable.down = True
    task = asyncio.create_task(backend.poll_forever())
    try:
        await asyncio.wait_for(settled.wait(), timeout=10)
    finally:
        task.cancel()
        await backend.admin.aclose()
    assert waits == [0.5, 1.0, 2.0, 4.0, 2.0]
    assert backend.link.up


async def test_the_console_shows_a_lost_router_keeps_its_last_state_and_notes_its_return() -> None:
    clock = ManualClock(10.0)
    backend, cable = await remote(clock)
    app = ConsoleApp(backend, auto_refresh=False)
    try:
        async with app.run_test(size=(120, 32)) as pilot:
            before = app.last_snapshot
            cable.down = True
            assert await backend.poll() == 0.5
            clock.advance(0.2)
            app.refresh_data()
            await pilot.pause()
            header = app.query_one(DashboardHeader).plain
            assert header.startswith(
                "✖ disconnected 200ms: cannot connect to http://127.0.0.1:8001: "
                "Connection refused; retrying in 300ms"
            )
            assert app.last_snapshot == before  # the last word, not a blank screen
            written = app.query_one(EventsPane).lines_written
            assert any(f"lost {URL}: cannot connect" in line for line in written)
            cable.down = False
            assert await backend.poll() == 1.0
            app.refresh_data()
            await pilot.pause()
            assert "disconnected" not in app.query_one(DashboardHeader).plain
            written = app.query_one(EventsPane).lines_written
            assert any(f"reconnected to {URL}" in line for line in written)
    finally:
        await backend.admin.aclose()


async def test_a_command_while_the_router_is_away_is_reported_not_sent() -> None:
    clock = ManualClock(10.0)
    backend, cable = await remote(clock)
    app = ConsoleApp(backend, auto_refresh=False)
    try:
        async with app.run_test(size=(120, 32)):
            cable.down = True
            app.switch_strategy("round-robin")
            await app.workers.wait_for_complete()
            messages = [str(n.message) for n in app._notifications]
            assert any(m.startswith(f"cannot connect to {URL}") for m in messages)
    finally:
        await backend.admin.aclose()


async def test_decisions_are_fetched_while_a_detail_asks_for_them_and_not_after() -> None:
    """An open replica detail asks for its decisions at each refresh, and each poll fetches
    them; once nobody has asked for a while (the detail is closed), the polls stop fetching
    them, and only the open replica's: every replica's were hundreds of KB to rebuild each
    second on the console's loop."""
    clock = ManualClock(10.0)
    backend, cable = await remote(clock)
    try:
        assert backend.decisions("r0") is None  # not fetched yet: not "none chose it"
        for _ in range(3):  # the detail is open: it asks at each refresh
            backend.decisions("r0")
            await backend.poll()
            assert backend.decisions("r0") == []  # fetched: none chose it
            clock.advance(1.0)
        assert cable.asked["/admin/decisions"] == 3
        clock.advance(DECISIONS_WANTED_POLLS * backend.interval())  # closed: nobody asks
        for _ in range(3):
            await backend.poll()
            clock.advance(1.0)
        assert cable.asked["/admin/decisions"] == 3
        assert backend.decisions("r0") is None  # none kept from before
        assert cable.replicas_asked == ["r0"] * 3  # that replica's decisions only
    finally:
        await backend.admin.aclose()


async def test_the_selected_rows_decisions_are_fetched_before_its_detail_opens() -> None:
    """The dashboard names the selected row's replica at each refresh: the polls fetch its
    decisions at their own pace (no poll woken for it), so its detail opens with them. A
    replica selected and left again is not answered with another's decisions."""
    clock = ManualClock(10.0)
    core = RouterCore(make_fleet(batch_sizes=[64] * 4), clock=clock)
    for i in range(8):
        core.submit(Request(f"q{i}", 10, 10, arrival=clock()))
    first, second = sorted({d.chosen for d in core.decisions if d.chosen is not None})[:2]
    backend, cable = await remote(clock, core)
    try:
        backend.expect_detail(first)
        assert not backend._wake.is_set()  # the next poll fetches them, when it is due
        await backend.poll()
        shown = backend.decisions(first)  # the detail opens: drawn at once
        assert shown
        assert all(d.chosen == first for d in shown)
        assert not backend._wake.is_set()
        backend.expect_detail(second)  # the cursor moves on, and back before a poll
        assert backend.decisions(first) is None  # not "none chose it"
        assert cable.replicas_asked == [first]
    finally:
        await backend.admin.aclose()


async def test_the_dashboard_names_the_selected_rows_replica_and_a_dialog_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = ManualClock(10.0)
    backend, _cable = await remote(clock)
    expected: list[str] = []
    monkeypatch.setattr(backend, "expect_detail", expected.append)
    app = ConsoleApp(backend, auto_refresh=False)
    try:
        async with app.run_test(size=(120, 32)) as pilot:
            app._refresh_tick()
            assert expected == [app.selected_replica()] != [None]
            await pilot.press("question_mark")
            await pilot.pause()
            app._refresh_tick()  # help is open: no row's detail is next
            assert len(expected) == 1
    finally:
        await backend.admin.aclose()


async def test_running_requests_are_fetched_while_a_confirmation_asks_and_not_after() -> None:
    """A confirmation (drain, say) shows the replica's requests running, rebuilt at each
    refresh: while it asks, each poll fetches them; once nobody asks, the polls leave them
    out. At the demo's load they are 600-800 objects a second, whose garbage decided the
    console's slowest keys."""
    clock = ManualClock(10.0)
    backend, cable = await remote(clock)
    try:
        for _ in range(3):
            await backend.poll()
            clock.advance(1.0)
        assert cable.asked.get("running", 0) == 0  # nobody asked
        for _ in range(3):  # a confirmation is open: it asks at each refresh
            backend.in_flight("r0")
            await backend.poll()
            clock.advance(1.0)
        assert cable.asked["running"] == 3
        clock.advance(DECISIONS_WANTED_POLLS * backend.interval())  # closed
        for _ in range(3):
            await backend.poll()
            clock.advance(1.0)
        assert cable.asked["running"] == 3
    finally:
        await backend.admin.aclose()
