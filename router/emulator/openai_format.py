"""OpenAI response bodies and stream chunks, key for key as vLLM 0.32's OpenAI server writes
them (tests/contract/vllm-0.32.json is the recording they are held to).

A stream is Server-Sent Events: one ``data: {chunk}`` event per generated token, the last
token's chunk carrying ``finish_reason``, then (with ``stream_options.include_usage``) a chunk
with no choices and the usage, then ``data: [DONE]``; no other chunk has a ``usage`` key. A
chat stream opens with a chunk of the assistant's role and empty content. As vLLM does, the
last chunk before ``[DONE]`` carries ``system_fingerprint``, and the keys vLLM fills only for
features the emulator lacks (token ids, transfer parameters, reasoning, tool calls) are null.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from router.emulator.openai_request import Kind
from router.emulator.tokens import filler_text, filler_token

__all__ = [
    "DONE_EVENT",
    "EMULATED_VLLM_VERSION",
    "ResponseHeader",
    "StreamChunks",
    "completion_body",
    "models_body",
    "sse",
    "version_body",
]

EMULATED_VLLM_VERSION = "0.32.0"
"""The vLLM version whose answers the emulator keeps to (tests/contract/)."""

SYSTEM_FINGERPRINT = f"vllm-{EMULATED_VLLM_VERSION}-emulated"

DONE_EVENT = b"data: [DONE]\n\n"

_BODY_EXTRAS = dict.fromkeys(
    ("ec_transfer_params", "kv_transfer_params", "metrics", "service_tier"), None
)
"""Top-level keys of a whole response that vLLM sets only for features the emulator lacks."""
_CHAT_EXTRAS = dict.fromkeys(("prompt_logprobs", "prompt_text", "prompt_token_ids"), None)
_CHOICE_EXTRAS = dict.fromkeys(("routed_experts", "stop_reason", "token_ids"), None)
_MESSAGE_EXTRAS = dict.fromkeys(
    ("annotations", "audio", "function_call", "reasoning", "refusal"), None
)


def sse(chunk: dict[str, Any]) -> bytes:
    """One Server-Sent Event carrying ``chunk``."""
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
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
    choice: dict[str, Any] = {"index": 0}
    if head.kind == "chat":
        obj, extras = "chat.completion", _CHAT_EXTRAS
        choice["message"] = {"role": "assistant", "content": text, **_MESSAGE_EXTRAS}
    else:
        # A completion's choice carries the prompt's fields that a chat response keeps at the
        # top level.
        obj, extras = "text_completion", {}
        choice |= {"text": text, "prompt_logprobs": None, "prompt_token_ids": None}
    choice |= {"logprobs": None, "finish_reason": finish_reason, **_CHOICE_EXTRAS}
    details = {"prompt_tokens_details": None, "completion_tokens_details": None}
    usage = {**_usage(prompt_tokens, output_tokens), **details}
    return {
        **head.fields(obj),
        "choices": [choice],
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage,
        **_BODY_EXTRAS,
        **extras,
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
            out = self._role_event()
        if self._head.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "delta": {"content": filler_token(i)}}
        else:
            choice = {"index": 0, "text": filler_token(i), "prompt_token_ids": None}
            choice["stop_reason"] = None
        choice |= {"logprobs": None, "finish_reason": finish_reason, "token_ids": None}
        chunk = {**self._head.fields(self._obj), "choices": [choice]}
        if finish_reason is not None:
            choice["stop_reason"] = None
            if not self._include_usage:  # else the usage chunk carries it
                chunk["system_fingerprint"] = SYSTEM_FINGERPRINT
        return out + sse(chunk)

    def end(self, prompt_tokens: int, output_tokens: int) -> bytes:
        """The usage chunk (when asked for) and ``[DONE]``."""
        if not self._include_usage:
            return DONE_EVENT
        chunk = {**self._head.fields(self._obj), "choices": []}
        chunk["system_fingerprint"] = SYSTEM_FINGERPRINT
        chunk["usage"] = _usage(prompt_tokens, output_tokens)
        return sse(chunk) + DONE_EVENT

    def _role_event(self) -> bytes:
        delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        chunk = {**self._head.fields(self._obj), "choices": [choice]}
        return sse(chunk | {"prompt_text": None, "prompt_token_ids": None})


def models_body(
    model: str, max_model_len: int, created: int, aliases: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``GET /v1/models``: the model the replica serves, with vLLM's permission card; one card
    per served name, as vLLM lists each name of ``--served-model-name a b``, ``root`` being
    the model loaded (the first name here)."""
    permission = {
        "id": f"modelperm-{uuid.uuid4().hex}",
        "object": "model_permission",
        "created": int(time.time()),
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    cards = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": model,
            "parent": None,
            "max_model_len": max_model_len,
            "permission": [permission],
        }
        for name in (model, *aliases)
    ]
    return {"object": "list", "data": cards}


def version_body() -> dict[str, str]:
    """``GET /version``: the vLLM version the emulator answers as."""
    return {"version": EMULATED_VLLM_VERSION}
