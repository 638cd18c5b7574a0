"""Updaters (router/rollout/updaters.py): a command without a shell, killed on its timeout;
an HTTP request judged by its status. Real processes, a real loopback server."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from router.config.schema import CommandUpdaterConfig, HttpUpdaterConfig, UpdaterConfig
from router.rollout.updaters import (
    CommandUpdater,
    HttpUpdater,
    Target,
    build_updater,
)

TARGET = Target("a100-0", "node-1", "http://127.0.0.1:18001", "org/model v2")
"""A version with a slash and a space: one argument, one encoded path segment."""
PY = sys.executable


async def test_a_command_gets_each_placeholder_as_one_argument_and_its_output_is_kept() -> None:
    run = f"{PY} -c 'import sys; print(sys.argv[1:])' {{replica}} --to {{version}} {{url}}"
    result = await CommandUpdater(CommandUpdaterConfig(run)).update(TARGET)
    assert result.ok
    assert result.summary == "exit 0"
    expected = ["a100-0", "--to", "org/model v2", "http://127.0.0.1:18001"]
    assert result.output.strip() == repr(expected)


async def test_a_shell_word_in_a_value_is_not_run() -> None:
    hostile = Target("a; echo pwned", "n", "http://h:1", "v")
    run = f"{PY} -c 'import sys; print(len(sys.argv))' {{replica}}"
    result = await CommandUpdater(CommandUpdaterConfig(run)).update(hostile)
    assert result.output.strip() == "2"


async def test_a_failing_command_is_a_failed_update_with_its_exit_code() -> None:
    run = f"{PY} -c 'import sys; print(\"no such unit\"); sys.exit(3)'"
    result = await CommandUpdater(CommandUpdaterConfig(run)).update(TARGET)
    assert not result.ok
    assert result.summary == "exit 3"
    assert "no such unit" in result.output


async def test_false_fails() -> None:
    result = await CommandUpdater(CommandUpdaterConfig("false")).update(TARGET)
    assert (result.ok, result.summary) == (False, "exit 1")


async def test_a_command_past_its_timeout_is_killed_with_its_children() -> None:
    """The shell and the sleep it started both die: the pipe closes and the call returns."""
    run = "sh -c 'echo started; sleep 60; echo never'"
    result = await CommandUpdater(CommandUpdaterConfig(run, timeout_s=0.3)).update(TARGET)
    assert not result.ok
    assert result.summary == "timed out after 0.3 s (killed)"
    assert result.output.strip() == "started"


async def test_a_command_that_cannot_start_says_why() -> None:
    run = "/nonexistent/updater {replica}"
    result = await CommandUpdater(CommandUpdaterConfig(run)).update(TARGET)
    assert not result.ok
    assert result.summary.startswith("cannot run:")


def test_the_audit_trail_shows_the_filled_command() -> None:
    updater = CommandUpdater(CommandUpdaterConfig("systemctl restart vllm@{replica}"))
    assert updater.describe(TARGET) == "systemctl restart vllm@a100-0"


@pytest.fixture
async def orchestrator() -> AsyncIterator[tuple[str, list[tuple[str, str, bytes]]]]:
    """A loopback HTTP server that records what it is sent; ``/fail`` answers 500."""
    seen: list[tuple[str, str, bytes]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append((request.method, request.raw_path, await request.read()))
        status = 500 if request.path.startswith("/fail") else 202
        return web.json_response({"accepted": status == 202}, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_an_http_updater_fills_url_and_body_and_checks_the_status(
    orchestrator: tuple[str, list[tuple[str, str, bytes]]],
) -> None:
    base, seen = orchestrator
    config = HttpUpdaterConfig(
        f"{base}/versions/{{replica}}?to={{version}}",
        body='{"version": "{version}", "node": "{node}"}',
        expect_status=202,
    )
    result = await HttpUpdater(config).update(TARGET)
    assert (result.ok, result.summary) == (True, "HTTP 202")
    method, path, body = seen[0]
    assert (method, path) == ("POST", "/versions/a100-0?to=org%2Fmodel%20v2")
    assert body == b'{"version": "org/model v2", "node": "node-1"}'


async def test_an_unexpected_status_is_a_failed_update(
    orchestrator: tuple[str, list[tuple[str, str, bytes]]],
) -> None:
    base, _ = orchestrator
    result = await HttpUpdater(HttpUpdaterConfig(f"{base}/fail/{{replica}}")).update(TARGET)
    assert not result.ok
    assert result.summary == "HTTP 500, expected 200"
    assert "accepted" in result.output


async def test_an_unreachable_orchestrator_is_a_failed_update() -> None:
    config = HttpUpdaterConfig("http://127.0.0.1:9/versions/{replica}", timeout_s=2.0)
    result = await HttpUpdater(config).update(TARGET)
    assert not result.ok
    assert result.summary.startswith("request failed:")


def test_the_configuration_names_the_updater() -> None:
    assert isinstance(
        build_updater(UpdaterConfig(command=CommandUpdaterConfig("x"))), CommandUpdater
    )
    http = UpdaterConfig(http=HttpUpdaterConfig("http://h:1/{replica}"))
    assert isinstance(build_updater(http), HttpUpdater)
