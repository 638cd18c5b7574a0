"""Reading an OpenAI request once: what the router needs to route it, and nothing more.

The body is parsed once (orjson) and forwarded upstream as the same bytes. The router needs
the model, a prompt-size estimate, ``max_tokens``, whether to stream, the priority and an
affinity key; priority and affinity may also come in headers (``X-Priority``,
``X-Session-ID``). Every problem is an :class:`~router.http.errors.HttpError` with status 400.
A client's ``X-Request-ID`` is checked here too (:func:`request_id`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from router.http.errors import HttpError, bad_request
from router.request import Priority

CHARS_PER_TOKEN = 4
"""Prompt tokens are estimated, not counted: a tokenizer per model is too slow for the hot
path, and the estimate only orders requests by size."""
MAX_REQUEST_ID = 128
"""Longest ``X-Request-ID`` taken: a UUID is 36 characters, a trace id 32 or 64."""
_REQUEST_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_REQUEST_ID}}}\Z")
"""Printable ASCII, no spaces: the id is sent upstream, echoed, logged and shown in tables."""


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    kind: str
    """``chat`` or ``completion``."""
    model: str
    stream: bool
    prompt_tokens: int
    max_tokens: int
    priority: Priority
    affinity_key: str | None


def parse_request(
    kind: str, body: bytes, headers: Mapping[str, str], default_max_tokens: int
) -> ParsedRequest:
    """Validate and summarise a chat or completion request body."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("`model` is required and must be a string", "model")
    chars = _chat_chars(data) if kind == "chat" else _prompt_chars(data)
    return ParsedRequest(
        kind=kind,
        model=model,
        stream=_stream(data),
        prompt_tokens=max(1, -(-chars // CHARS_PER_TOKEN)),
        max_tokens=_max_tokens(data, kind, default_max_tokens),
        priority=_priority(data, headers),
        affinity_key=_affinity(data, headers),
    )


def request_id(headers: Mapping[str, str]) -> str | None:
    """The client's ``X-Request-ID``; None when it sent none (or an empty one). A longer one
    than MAX_REQUEST_ID or one with spaces, control or non-ASCII characters is refused (400),
    not forwarded: the replica's own header limit would refuse it later, and every log line
    would carry it."""
    rid = headers.get("x-request-id")
    if not rid:
        return None
    if _REQUEST_ID.match(rid) is None:
        raise HttpError(
            400,
            f"X-Request-ID must be 1 to {MAX_REQUEST_ID} printable ASCII characters without "
            f"spaces; got {len(rid)} characters",
            param="X-Request-ID",
            code="invalid_request_id",
        )
    return rid


def _chat_chars(data: dict[str, Any]) -> int:
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` is required and must be a non-empty list", "messages")
    total = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a `role`", "messages")
        total += _content_chars(m.get("content"), i)
    return total


def _content_chars(content: object, i: int) -> int:
    """The characters of a message's text: its ``content`` string, or its text parts'."""
    if content is None:  # an assistant turn that only calls tools
        return 0
    if isinstance(content, str):
        return len(content)
    if not isinstance(content, list):
        raise bad_request(
            f"messages[{i}].content must be a string or a list of content parts", "messages"
        )
    total = 0
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad_request(
                f"messages[{i}].content[{j}] must be an object with a `type`", "messages"
            )
        text = part.get("text")
        if part["type"] == "text" and not isinstance(text, str):
            raise bad_request(f"messages[{i}].content[{j}].text must be a string", "messages")
        if isinstance(text, str):
            total += len(text)
    return total


def _prompt_chars(data: dict[str, Any]) -> int:
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return sum(len(p) for p in prompt)
        if all(isinstance(p, int) for p in prompt):  # token ids: count them as tokens
            return len(prompt) * CHARS_PER_TOKEN
    raise bad_request("`prompt` is required: a string, a list of strings or of token ids", "prompt")


def _max_tokens(data: dict[str, Any], kind: str, default: int) -> int:
    names = ("max_completion_tokens", "max_tokens") if kind == "chat" else ("max_tokens",)
    for name in names:
        value = data.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad_request(f"`{name}` must be a positive integer", name)
        return value
    return default


def _stream(data: dict[str, Any]) -> bool:
    value = data.get("stream", False)
    if not isinstance(value, bool):
        raise bad_request("`stream` must be true or false", "stream")
    return value


def _priority(data: dict[str, Any], headers: Mapping[str, str]) -> Priority:
    raw: object = headers.get("x-priority")
    if raw is None:
        raw = data.get("priority")
    if raw is None:
        return Priority.NORMAL
    try:
        if isinstance(raw, bool) or not isinstance(raw, str | int):
            raise ValueError(f"unknown priority {raw!r}")
        return Priority.parse(raw)
    except ValueError as exc:
        raise HttpError(400, str(exc), param="priority", code="invalid_priority") from None


def _affinity(data: dict[str, Any], headers: Mapping[str, str]) -> str | None:
    key = headers.get("x-session-id")
    if key:
        return key
    user = data.get("user")
    return user if isinstance(user, str) and user else None
