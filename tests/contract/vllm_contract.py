"""The contract between gpurouter's emulator and vLLM's OpenAI server, in one place.

:func:`probes` lists the requests: ``/v1/models``, ``/health``, ``/version``, completions and
chat (whole and streamed, with and without ``stream_options.include_usage``), bad requests of
several kinds, and ``/metrics`` last (so its histograms have seen requests). :func:`observe`
sends them, in order, to one server and reduces each answer to its status, media type and
shape (tests/contract/shape.py): the JSON keys and nesting, the SSE framing and where
``usage`` and ``delta.role`` appear, error bodies, the ``vllm:`` metric families with their
types and labels. Values that vary (ids, times, text, numbers) are not part of it. Last, one
request of a known length and how it moves the engine's counters (tests/contract/
metric_deltas.py): the numbers a request of that length fixes, whatever the engine.

The golden file ``vllm-<major>.<minor>.json`` beside this module is that observation taken from
a real vLLM engine. The emulator's test holds the emulator to the newest one; the real-engine
test holds real vLLM to it. For a new vLLM version, record it again from a running engine::

    python -m tests.contract.vllm_contract record http://127.0.0.1:8000 --model NAME

(or run the real-engine test with ``GPUROUTER_RECORD_CONTRACT=1``), review the diff of the new
golden file, and fix the emulator until its test passes. A vLLM family the emulator has no
meaning for is listed in :data:`NOT_EMULATED` with the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from tests.contract.metric_deltas import observe_deltas
from tests.contract.shape import differences, json_shape, media_type, metrics_shape, sse_shape

__all__ = [
    "GOLDEN_DIR",
    "NOT_EMULATED",
    "Probe",
    "compare",
    "golden_name",
    "latest_golden",
    "load_golden",
    "observe",
    "probes",
    "record",
]

GOLDEN_DIR = Path(__file__).parent

NOT_EMULATED: dict[str, str] = {}
"""``vllm:`` metric families the emulator leaves out, each with why."""

Read = Literal["json", "sse", "metrics", "text"]
"""How an answer's body is reduced to its shape."""

_TIMEOUT_S = 60.0
"""Per request: a CPU engine answers a 4-token request in well under a second; a cold one in
a few."""

_CHAT = "/v1/chat/completions"
_COMPLETIONS = "/v1/completions"

_MAX_TOKENS = 4
"""Long enough for a stream's first, middle and last chunks to differ."""


@dataclass(frozen=True, slots=True)
class Probe:
    """One request of the contract."""

    name: str
    path: str
    read: Read
    body: bytes | None = None
    """The JSON body to send."""
    method: str | None = None
    """None: POST with a body, GET without."""


def _json(base: dict[str, Any], **changes: Any) -> bytes:
    """``base`` with ``changes`` over it, as a JSON body."""
    return json.dumps({**base, **changes}).encode()


def probes(model: str, max_model_len: int) -> list[Probe]:
    """The contract's requests to a server that serves ``model`` with a context of
    ``max_model_len`` tokens, in the order they are sent."""
    # One word more than the context: a word and its space are one or two tokens to any
    # tokenizer (1.5 to the emulator's count), so the prompt alone cannot fit.
    long_prompt = "hello " * (max_model_len + 1)
    # ignore_eos: a model with random weights may stop early, and a stop changes the shape of
    # the last chunk (finish_reason); vLLM reads it, the emulator ignores it.
    common = {"model": model, "max_tokens": _MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    completion = {**common, "prompt": "The quick brown fox jumps over"}
    chat = {**common, "messages": [{"role": "user", "content": "Say hello."}]}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    return [
        Probe("models", "/v1/models", "json"),
        Probe("health", "/health", "text"),
        Probe("version", "/version", "json"),
        Probe("completion", _COMPLETIONS, "json", _json(completion)),
        Probe("chat", _CHAT, "json", _json(chat)),
        Probe("completion_stream", _COMPLETIONS, "sse", _json(completion, stream=True)),
        Probe("completion_stream_usage", _COMPLETIONS, "sse", _json(completion, **usage)),
        Probe("chat_stream", _CHAT, "sse", _json(chat, stream=True)),
        Probe("chat_stream_usage", _CHAT, "sse", _json(chat, **usage)),
        # vLLM serves its model to a request that names none.
        Probe(
            "chat_no_model", _CHAT, "json", _json({k: v for k, v in chat.items() if k != "model"})
        ),
        Probe("error_unknown_model", _CHAT, "json", _json(chat, model="no-such-model")),
        Probe("error_not_json", _CHAT, "json", b"{not json"),
        Probe("error_not_an_object", _CHAT, "json", b"[1, 2]"),
        Probe("error_no_messages", _CHAT, "json", _json({"model": model})),
        Probe("error_no_prompt", _COMPLETIONS, "json", _json({"model": model}, max_tokens=4)),
        Probe("error_stream_not_bool", _CHAT, "json", _json(chat, stream="maybe")),
        Probe("error_max_tokens_zero", _COMPLETIONS, "json", _json(completion, max_tokens=0)),
        # More than any model's context: refused before it reaches the engine.
        Probe("error_too_long", _COMPLETIONS, "json", _json(completion, max_tokens=10**7)),
        Probe("error_prompt_too_long", _COMPLETIONS, "json", _json(completion, prompt=long_prompt)),
        Probe("error_unknown_path", "/v1/no-such-route", "json"),
        Probe("error_wrong_method", _COMPLETIONS, "json", method="GET"),
        Probe("metrics", "/metrics", "metrics"),
    ]


async def observe(base_url: str, model: str) -> dict[str, Any]:
    """Every probe's answer from the server at ``base_url``, reduced to its shape."""
    async with httpx.AsyncClient(base_url=base_url, timeout=_TIMEOUT_S) as client:
        max_model_len = await _max_model_len(client, model)
        observed = {p.name: await _observe_one(client, p) for p in probes(model, max_model_len)}
        observed["metric_deltas"] = await observe_deltas(client, model)
        return observed


async def _max_model_len(client: httpx.AsyncClient, model: str) -> int:
    response = await client.get("/v1/models")
    response.raise_for_status()
    for card in response.json().get("data", []):
        if card.get("id") == model and isinstance(card.get("max_model_len"), int):
            return int(card["max_model_len"])
    raise ValueError(f"{client.base_url}/v1/models lists no {model!r} with its max_model_len")


async def _observe_one(client: httpx.AsyncClient, probe: Probe) -> dict[str, Any]:
    method = probe.method or ("GET" if probe.body is None else "POST")
    headers = {} if probe.body is None else {"Content-Type": "application/json"}
    response = await client.request(method, probe.path, content=probe.body, headers=headers)
    return {
        "status": response.status_code,
        "content_type": media_type(response.headers.get("content-type")),
        "body": _body_shape(probe.read, response.text),
    }


def _body_shape(read: Read, text: str) -> Any:
    if read == "sse":
        return sse_shape(text)
    if read == "metrics":
        return metrics_shape(text)
    if read == "text":
        return "<empty>" if not text else "<text>"
    try:
        return json_shape(json.loads(text))
    except ValueError:
        return f"not JSON: {text[:60]!r}"


def compare(golden: dict[str, Any], observed: dict[str, Any], *, emulator: bool) -> list[str]:
    """Where ``observed`` departs from the golden file's probes (none: it keeps the contract).

    For the emulator, the metric families of :data:`NOT_EMULATED` are left out of both sides.
    """
    expected = golden["probes"]
    if emulator:
        expected = _without_not_emulated(expected)
        observed = _without_not_emulated(observed)
    return differences(expected, observed)


def _without_not_emulated(probed: dict[str, Any]) -> dict[str, Any]:
    metrics = probed.get("metrics")
    if not isinstance(metrics, dict) or not isinstance(metrics.get("body"), dict):
        return probed
    body = {k: v for k, v in metrics["body"].items() if k not in NOT_EMULATED}
    return {**probed, "metrics": {**metrics, "body": body}}


async def server_version(base_url: str) -> str:
    """What the server's ``/version`` says (vLLM: ``{"version": "0.32.0"}``)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=_TIMEOUT_S) as client:
        response = await client.get("/version")
        response.raise_for_status()
        version = response.json().get("version")
    if not isinstance(version, str):
        raise ValueError(f"{base_url}/version has no version string: {response.text[:80]!r}")
    return version


def golden_name(version: str) -> str:
    """``0.32.0+cpu`` -> ``vllm-0.32.json``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a vLLM version: {version!r}")
    return f"vllm-{match[1]}.{match[2]}.json"


def latest_golden(directory: Path = GOLDEN_DIR) -> Path:
    """The golden file of the newest vLLM version recorded."""
    found = sorted(directory.glob("vllm-*.json"), key=_version_key)
    if not found:
        raise FileNotFoundError(f"no vllm-*.json golden file in {directory}")
    return found[-1]


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path.stem))


def load_golden(path: Path | None = None) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((path or latest_golden()).read_text())
    return data


async def record(base_url: str, model: str, out: Path | None = None) -> Path:
    """Observe a real vLLM engine and write its golden file; the path written."""
    version = await server_version(base_url)
    observed = await observe(base_url, model)
    path = out or GOLDEN_DIR / golden_name(version)
    golden = {
        "engine": "vllm",
        "version": version,
        "how": "python -m tests.contract.vllm_contract record URL --model NAME",
        "probes": observed,
    }
    path.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.contract.vllm_contract",
        description="Record a vLLM server's contract golden file, or check a server against it.",
    )
    parser.add_argument("action", choices=("record", "check"))
    parser.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--out", type=Path, help="record: the file to write (default: by version)")
    parser.add_argument(
        "--emulator", action="store_true", help="check: leave out the families not emulated"
    )
    args = parser.parse_args(argv)
    if args.action == "record":
        print(f"wrote {asyncio.run(record(args.url, args.model, args.out))}")
        return 0
    golden = load_golden()
    found = compare(golden, asyncio.run(observe(args.url, args.model)), emulator=args.emulator)
    for line in found:
        print(line)
    print(f"{len(found)} differences from vLLM {golden['version']}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
