"""No request body, however wrong, gets a 5xx from the front door: every body the OpenAI
schema does not allow is a 4xx with an OpenAI-style JSON error, and every other one is
served. Property tests over the chat and completion schemas, with a wrong type anywhere."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from router.http.server import RouterServer
from tests.http_support import MODEL, Spec, routed

EXAMPLES = 300

# ---- JSON values of every kind: what a wrong type anywhere may be -------------------------

_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),  # past 64 bits: orjson reads a float
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
ANY_JSON = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
_GONE = object()
"""Stands for a key taken out of its object."""

Path = tuple[str | int, ...]


def _paths(value: Any, at: Path = ()) -> list[Path]:
    """Every place in a JSON value: the value itself, each key's value, each item."""
    found = [at]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _paths(item, (*at, i))
    return found


def _replaced(value: Any, path: Path, new: Any) -> Any:
    """``value`` with the value at ``path`` replaced by ``new`` (or left out, for _GONE)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        copy = dict(value)
        changed = _replaced(copy[head], rest, new)
        if changed is _GONE:
            del copy[head]
        else:
            copy[head] = changed
        return copy
    items = list(value)
    assert isinstance(head, int)
    changed = _replaced(items[head], rest, new)
    if changed is _GONE:
        del items[head]
    else:
        items[head] = changed
    return items


@st.composite
def spoiled(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> Any:
    """A valid body with up to two places given a value of any type, or left out; the root
    may be replaced too (a body that is not an object at all)."""
    value = draw(valid)
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        path = draw(st.sampled_from(_paths(value)))
        new = draw(st.one_of(ANY_JSON, st.just(_GONE) if path else ANY_JSON))
        value = _replaced(value, path, new)
    return value


SMALL = st.integers(min_value=1, max_value=8)
TEXT = st.text(max_size=24)
PART = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
    st.fixed_dictionaries(
        {"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": TEXT})}
    ),
)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
        "content": st.one_of(TEXT, st.lists(PART, min_size=1, max_size=3)),
    },
    optional={"name": TEXT},
)
COMMON = {
    "max_tokens": SMALL,
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "temperature": st.floats(min_value=0, max_value=2),
    "top_p": st.floats(min_value=0, max_value=1),
    "n": st.just(1),
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=3)),
    "seed": st.integers(min_value=0, max_value=2**31),
    "user": TEXT,
    "priority": st.sampled_from(["high", "normal", "low", 0, 1, 2]),
    "gpurouter": st.fixed_dictionaries({"prompt_tokens": SMALL, "output_tokens": SMALL}),
}
CHAT = spoiled(
    st.fixed_dictionaries(
        {"model": st.just(MODEL), "messages": st.lists(MESSAGE, min_size=1, max_size=3)},
        optional=COMMON | {"max_completion_tokens": SMALL},
    )
)
COMPLETION = spoiled(
    st.fixed_dictionaries(
        {
            "model": st.just(MODEL),
            "prompt": st.one_of(
                TEXT,
                st.lists(TEXT, min_size=1, max_size=3),
                st.lists(st.integers(min_value=0, max_value=50_000), min_size=1, max_size=8),
            ),
        },
        optional=COMMON | {"echo": st.booleans(), "logprobs": st.integers(0, 5)},
    )
)
HEADERS = st.fixed_dictionaries(
    {},
    optional={
        "X-Priority": st.one_of(
            st.sampled_from(["high", "low", "2"]), st.text("abc012", min_size=1, max_size=5)
        ),
        "X-Session-ID": st.text("abcxyz-_0189", min_size=1, max_size=12),
        "X-Request-ID": st.text(
            st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=160
        ),
    },
)


def assert_no_5xx(response: httpx.Response) -> None:
    """A success, or a 4xx whose body is ``{"error": {"message", "type", "param", "code"}}``."""
    assert response.status_code < 500, response.text
    if response.status_code < 400:
        return
    assert response.headers["content-type"].startswith("application/json"), response.headers
    error = response.json()["error"]
    assert {"message", "type", "param", "code"} <= set(error), error
    assert isinstance(error["message"], str), error
    assert error["message"], error
    assert isinstance(error["type"], str), error


@pytest.fixture
async def server() -> AsyncIterator[RouterServer]:
    async with routed((Spec("a"),), time_scale=1000.0) as (router, _):
        yield router


@pytest.fixture
async def client(server: RouterServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.front_url, timeout=10) as http:
        yield http


PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same bodies every run
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _chat_with_part(text: Any) -> dict[str, Any]:
    part = {"type": "text", "text": text}
    return {"model": MODEL, "messages": [{"role": "user", "content": [part]}], "max_tokens": 1}


@PROPERTY
@given(data=CHAT, headers=HEADERS)
# Bodies that got a 500 once (a content part's text of another type than a string).
@example(data=_chat_with_part(7), headers={})
@example(data=_chat_with_part(None), headers={})
@example(data=_chat_with_part(True), headers={})
@example(data=_chat_with_part(2.5), headers={})
async def test_no_chat_body_gets_a_5xx(
    client: httpx.AsyncClient, data: Any, headers: dict[str, str]
) -> None:
    assert_no_5xx(await client.post("/v1/chat/completions", json=data, headers=headers))


@PROPERTY
@given(data=COMPLETION, headers=HEADERS)
async def test_no_completion_body_gets_a_5xx(
    client: httpx.AsyncClient, data: Any, headers: dict[str, str]
) -> None:
    assert_no_5xx(await client.post("/v1/completions", json=data, headers=headers))


@pytest.mark.parametrize("text", [7, None, True, 2.5, ["x"], {"t": "x"}])
async def test_a_text_part_whose_text_is_not_a_string_is_400_naming_it(
    client: httpx.AsyncClient, server: RouterServer, text: Any
) -> None:
    response = await client.post("/v1/chat/completions", json=_chat_with_part(text))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"] == "messages[0].content[0].text must be a string"
    assert (error["param"], error["code"]) == ("messages", "invalid_request")
    assert not server.core.outcomes  # refused at the door: never reached the core


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (5, "messages[0].content must be a string or a list of content parts"),
        ([5], "messages[0].content[0] must be an object with a `type`"),
        ([{"text": "x"}], "messages[0].content[0] must be an object with a `type`"),
    ],
)
async def test_content_of_another_shape_is_400_at_the_door(
    client: httpx.AsyncClient, server: RouterServer, content: Any, message: str
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == message
    assert not server.core.outcomes
