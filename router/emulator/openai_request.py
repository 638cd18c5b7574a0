"""Parsing OpenAI completion and chat requests, and the errors they answer with.

Only what the emulator needs is read: the model, how long the prompt is, how many tokens to
generate, and how to stream. Other fields (temperature, stop, ...) are accepted and ignored,
as they would not change how long a real engine takes.

A client may tell the emulator the lengths outright, so that a benchmark's requests cost what
its trace says whatever their text::

    {"model": "...", "prompt": "...", "gpurouter": {"prompt_tokens": 900, "output_tokens": 120}}

vLLM ignores fields it does not know, so the same body works against real replicas.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from router.emulator.tokens import estimate_tokens
from router.errors import GpuRouterError

__all__ = ["ApiError", "CompletionRequest", "Kind", "parse_request"]

Kind = Literal["completion", "chat"]
"""``/v1/completions`` or ``/v1/chat/completions``."""


class ApiError(GpuRouterError):
    """A request the emulated replica answers with an OpenAI-style error body."""

    title = "request refused"

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    @property
    def type(self) -> str:
        """vLLM's name for the status: ``BadRequestError``, ``NotFoundError``, ..."""
        return _ERROR_TYPES.get(self.status, "InternalServerError")

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}`` as vLLM writes it: the code is
        the HTTP status."""
        error = {"message": self.message, "type": self.type, "param": self.param}
        return {"error": {**error, "code": self.status}}


_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """What the emulator takes from a completion or chat request."""

    kind: Kind
    model: str
    prompt_tokens: int
    """From the ``gpurouter.prompt_tokens`` hint, else estimated from the text."""
    max_tokens: int | None
    """``max_tokens`` (``max_completion_tokens`` first, for chat); None when not given."""
    output_hint: int | None
    """``gpurouter.output_tokens``: how many tokens the "model" would write before stopping."""
    stream: bool
    include_usage: bool
    """``stream_options.include_usage``: a last chunk carries the usage."""


def parse_request(kind: Kind, raw: bytes) -> CompletionRequest:
    """The request in ``raw``; ApiError (400) says what is wrong with it."""
    body = _json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a string", "model")
    hint_prompt, hint_output = _hints(body.get("gpurouter"))
    text: str | list[int]
    if kind == "chat":
        text = _messages_text(body.get("messages"))
        max_tokens = _opt_count(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _opt_count(body, "max_tokens")
    else:
        text = _prompt_text(body.get("prompt"))
        max_tokens = _opt_count(body, "max_tokens")
    prompt_tokens = hint_prompt or (len(text) if isinstance(text, list) else estimate_tokens(text))
    n = body.get("n", 1)
    if n not in (1, None):
        raise _bad("the emulator serves n = 1 only", "n")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be true or false", "stream")
    return CompletionRequest(
        kind=kind,
        model=model,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        output_hint=hint_output,
        stream=stream,
        include_usage=stream and _include_usage(body.get("stream_options")),
    )


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _bad("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object")
    return body


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _opt_count(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_count(value):
        raise _bad(f"'{key}' must be a whole number >= 1", key)
    return int(value)


def _hints(value: object) -> tuple[int | None, int | None]:
    if value is None:
        return None, None
    if not isinstance(value, dict):
        raise _bad("'gpurouter' must be an object", "gpurouter")
    hints = (value.get("prompt_tokens"), value.get("output_tokens"))
    for key, hint in zip(("prompt_tokens", "output_tokens"), hints, strict=True):
        if hint is not None and not _is_count(hint):
            raise _bad(f"'gpurouter.{key}' must be a whole number >= 1", f"gpurouter.{key}")
    return hints[0], hints[1]


def _prompt_text(prompt: object) -> str | list[int]:
    """The prompt as text, or as token ids when it is given as ids."""
    # OpenAI's prompt is a string, token ids, or a batch of either; the emulator serves
    # one prompt per request (as the router sends them), so a batch must hold exactly one.
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_token_id(t) for t in prompt):
        return list(prompt)
    raise _bad("'prompt' must be a string or a list of token ids (one prompt)", "prompt")


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _messages_text(messages: object) -> str:
    """Every message's text, concatenated (roles and images add nothing)."""
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list", "messages")
    parts: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _bad(f"messages[{i}] must be an object with a 'role'", f"messages[{i}]")
        parts.extend(_content_text(message.get("content"), i))
    return "".join(parts)


def _content_text(content: object, i: int) -> list[str]:
    if content is None or isinstance(content, str):
        return [content or ""]
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return [p["text"] for p in content if isinstance(p.get("text"), str)]
    message = f"messages[{i}].content must be a string or a list of parts"
    raise _bad(message, f"messages[{i}].content")


def _include_usage(options: object) -> bool:
    if options is None:
        return False
    if not isinstance(options, dict):
        raise _bad("'stream_options' must be an object", "stream_options")
    return options.get("include_usage") is True
