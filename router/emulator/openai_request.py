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

    def __init__(
        self, status: int, message: str, *, param: str | None = None, error_type: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = error_type or _ERROR_TYPES.get(status, "InternalServerError")
        """vLLM's name for the status (``BadRequestError``, ``NotFoundError``, ...), or
        ``Bad Request`` for a body that fails its schema."""

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
    model: str | None
    """None: not given, which means the served model (as vLLM)."""
    prompt_tokens: int
    """From the ``gpurouter.prompt_tokens`` hint, else estimated from the text."""
    max_tokens: int | None
    """``max_tokens`` (``max_completion_tokens`` first, for chat); None when not given."""
    output_hint: int | None
    """``gpurouter.output_tokens``: how many tokens the "model" would write before stopping."""
    stream: bool
    include_usage: bool
    """``stream_options.include_usage``: a last chunk carries the usage."""
    refusal: ApiError | None = None
    """A value the body's schema allows but the engine refuses (``max_tokens: 0``, no
    prompt): vLLM checks the model first, so the replica raises this after its model check."""


def parse_request(kind: Kind, raw: bytes) -> CompletionRequest:
    """The request in ``raw``; ApiError (400) when its body fails the schema."""
    # Two kinds of 400, as vLLM: a body that fails the request schema (type "Bad Request",
    # param "body.<field>"), raised here at once; a value the engine refuses (type
    # "BadRequestError", param "<field>"), kept in ``refusal`` for after the model check.
    body = _json_object(raw)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _invalid("'model' must be a string", "model")
    refusals = _Refusals()
    hint_prompt, hint_output = _hints(body.get("gpurouter"), refusals)
    text: str | list[int]
    if kind == "chat":
        text = _messages_text(body.get("messages"), refusals)
        max_tokens = _opt_count(body, "max_completion_tokens", refusals)
        if max_tokens is None:
            max_tokens = _opt_count(body, "max_tokens", refusals)
    else:
        text = _prompt_text(body.get("prompt"), refusals)
        max_tokens = _opt_count(body, "max_tokens", refusals)
    prompt_tokens = hint_prompt or (len(text) if isinstance(text, list) else estimate_tokens(text))
    n = body.get("n")
    if n is not None and not _is_int(n):
        raise _invalid("'n' must be an integer", "n")
    if n not in (1, None):
        refusals.add("the emulator serves n = 1 only", "n")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _invalid("'stream' must be true or false", "stream")
    return CompletionRequest(
        kind=kind,
        model=model or None,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        output_hint=hint_output,
        stream=bool(stream),
        include_usage=bool(stream) and _include_usage(body.get("stream_options")),
        refusal=refusals.first,
    )


class _Refusals:
    """The first value the engine refuses."""

    def __init__(self) -> None:
        self.first: ApiError | None = None

    def add(self, message: str, param: str) -> None:
        if self.first is None:
            self.first = ApiError(400, message, param=param)


def _invalid(message: str, field: str | None = None) -> ApiError:
    """A body that fails the schema: vLLM names where, from the body down."""
    where = "body" if field is None else f"body.{field}"
    return ApiError(400, message, param=where, error_type="Bad Request")


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _invalid(f"the body is not valid JSON: {exc.msg}", str(exc.pos)) from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _invalid("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise _invalid("the body must be a JSON object")
    return body


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _opt_count(body: dict[str, Any], key: str, refusals: _Refusals) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_int(value):
        raise _invalid(f"'{key}' must be an integer", key)
    if value < 1:
        refusals.add(f"{key} must be at least 1, got {value}.", key)
        return None
    return int(value)


def _hints(value: object, refusals: _Refusals) -> tuple[int | None, int | None]:
    # vLLM ignores fields it does not know, so a wrong hint is the emulator's own refusal.
    if value is None:
        return None, None
    if not isinstance(value, dict):
        refusals.add("'gpurouter' must be an object", "gpurouter")
        return None, None
    hints: list[int | None] = []
    for key in ("prompt_tokens", "output_tokens"):
        hint = value.get(key)
        if hint is not None and not (_is_int(hint) and hint >= 1):
            refusals.add(f"'gpurouter.{key}' must be a whole number >= 1", f"gpurouter.{key}")
            hint = None
        hints.append(hint)
    return hints[0], hints[1]


def _prompt_text(prompt: object, refusals: _Refusals) -> str | list[int]:
    """The prompt as text, or as token ids when it is given as ids."""
    if prompt is None:
        refusals.add("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
        return ""
    # OpenAI's prompt is a string, token ids, or a batch of either; the emulator serves
    # one prompt per request (as the router sends them), so a batch must hold exactly one.
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(_is_token_id(t) for t in prompt):
        if not prompt:
            refusals.add("the prompt is empty", "prompt")
        return list(prompt)
    if isinstance(prompt, list) and all(isinstance(p, str | list) for p in prompt):
        refusals.add("the emulator serves one prompt per request", "prompt")
        return ""
    raise _invalid("'prompt' must be a string or token ids, or a list of them", "prompt")


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _messages_text(messages: object, refusals: _Refusals) -> str:
    """Every message's text, concatenated (roles and images add nothing)."""
    if not isinstance(messages, list):
        raise _invalid("'messages' is required and must be a list", "messages")
    if not messages:
        refusals.add("'messages' must not be empty", "messages")
    parts: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _invalid(f"messages[{i}] must be an object with a 'role'", f"messages.{i}")
        parts.extend(_content_text(message.get("content"), i))
    return "".join(parts)


def _content_text(content: object, i: int) -> list[str]:
    if content is None or isinstance(content, str):
        return [content or ""]
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return [p["text"] for p in content if isinstance(p.get("text"), str)]
    message = f"messages[{i}].content must be a string or a list of parts"
    raise _invalid(message, f"messages.{i}.content")


def _include_usage(options: object) -> bool:
    if options is None:
        return False
    if not isinstance(options, dict):
        raise _invalid("'stream_options' must be an object", "stream_options")
    return options.get("include_usage") is True
