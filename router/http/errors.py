"""OpenAI-style error responses: the one place HTTP errors are shaped.

Clients written against OpenAI or vLLM parse ``{"error": {"message", "type", "param",
"code"}}``; every refusal of the front door uses it, with the status a client expects.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from router.errors import GpuRouterError


@dataclass(frozen=True, slots=True)
class HttpError(GpuRouterError):
    """A request refused at the front door, rendered as an OpenAI error body."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    retry_after_s: float | None = None

    def __str__(self) -> str:
        return f"{self.status} {self.message}"

    def body(self) -> bytes:
        return orjson.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": self.type,
                    "param": self.param,
                    "code": self.code,
                }
            }
        )


def bad_request(message: str, param: str | None = None) -> HttpError:
    return HttpError(400, message, param=param, code="invalid_request")


def model_not_found(model: str, known: list[str]) -> HttpError:
    listed = ", ".join(known) or "none"
    return HttpError(
        404,
        f"The model `{model}` does not exist here; served: {listed}",
        param="model",
        code="model_not_found",
    )


def too_large(limit: int) -> HttpError:
    return HttpError(413, f"request body is larger than {limit} bytes", code="request_too_large")


def queue_full(retry_after_s: float) -> HttpError:
    return HttpError(
        429,
        "the router's queue is full; retry later",
        type="rate_limit_error",
        code="queue_full",
        retry_after_s=retry_after_s,
    )


def deadline_passed() -> HttpError:
    return HttpError(
        504,
        "the request's deadline passed while it waited",
        type="timeout_error",
        code="deadline_exceeded",
    )


def no_replica(reason: str) -> HttpError:
    return HttpError(503, reason, type="service_unavailable", code="no_healthy_replica")


def upstream_failed(reason: str) -> HttpError:
    return HttpError(
        502, f"upstream failed: {reason}", type="upstream_error", code="upstream_error"
    )
