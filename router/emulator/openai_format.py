"""OpenAI response bodies and stream chunks, as vLLM's OpenAI server writes them.

A stream is Server-Sent Events: one ``data: {chunk}`` event per generated token, the last
token's chunk carrying ``finish_reason``, then (with ``stream_options.include_usage``) a chunk
with no choices and the usage, then ``data: [DONE]``; no other chunk has a ``usage`` key.
Chat streams open with a chunk of the assistant's role and empty content. The contract test
(tests/contract/) holds these shapes to a recording of real vLLM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from router.emulator.openai_request import Kind
from router.emulator.tokens import filler_text, filler_token

__all__ = [
    "DONE_EVENT",
    "ResponseHeader",
    "StreamChunks",
    "completion_body",
    "models_body",
    "sse",
    "usage",
    "version_body",
]

EMULATED_VLLM_VERSION = "0.32.0"
"""The vLLM version whose answers the emulator keeps to (tests/contract/)."""

DONE_EVENT = b"data: [DONE]\n\n"


def sse(chunk: dict[str, Any]) -> bytes:
    """One Server-Sent Event carrying ``chunk``."""
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    """What every body and chunk of one response repeats."""

    kind: Kind
    id: str
    created: int
    model: str

    def fields(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def completion_body(
    head: ResponseHeader, output_tokens: int, finish_reason: str, prompt_tokens: int
) -> dict[str, Any]:
    """The whole (non-streamed) response."""
    text = filler_text(output_tokens)
    if head.kind == "chat":
        obj = "chat.completion"
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
    else:
        obj = "text_completion"
        choice = {"index": 0, "text": text}
    choice |= {"logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
    return {
        **head.fields(obj),
        "choices": [choice],
        "usage": usage(prompt_tokens, output_tokens),
    }


class StreamChunks:
    """The chunks of one streamed response, built as its tokens come out."""

    def __init__(self, head: ResponseHeader, include_usage: bool) -> None:
        self._head = head
        self._include_usage = include_usage
        self._obj = "chat.completion.chunk" if head.kind == "chat" else "text_completion"

    def token(self, i: int, finish_reason: str | None) -> bytes:
        """The event(s) for the ``i``-th token; ``finish_reason`` on the last one."""
        out = b""
        if i == 0 and self._head.kind == "chat":
            out = self._event({"role": "assistant", "content": ""}, None)
        body = {"content": filler_token(i)} if self._head.kind == "chat" else filler_token(i)
        return out + self._event(body, finish_reason)

    def end(self, prompt_tokens: int, output_tokens: int) -> bytes:
        """The usage chunk (when asked for) and ``[DONE]``."""
        if not self._include_usage:
            return DONE_EVENT
        chunk = {**self._head.fields(self._obj), "choices": []}
        chunk["usage"] = usage(prompt_tokens, output_tokens)
        return sse(chunk) + DONE_EVENT

    def _event(self, content: dict[str, str] | str, finish_reason: str | None) -> bytes:
        choice: dict[str, Any] = {"index": 0}
        if isinstance(content, dict):
            choice["delta"] = content
        else:
            choice["text"] = content
        choice |= {"logprobs": None, "finish_reason": finish_reason}
        # vLLM leaves usage out of every chunk but the last (OpenAI writes "usage": null).
        return sse({**self._head.fields(self._obj), "choices": [choice]})


def models_body(model: str, max_model_len: int, created: int) -> dict[str, Any]:
    """``GET /v1/models``: the one model the replica serves."""
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [],
    }
    return {"object": "list", "data": [card]}


def version_body() -> dict[str, str]:
    """``GET /version``: the vLLM version the emulator answers as."""
    return {"version": EMULATED_VLLM_VERSION}
