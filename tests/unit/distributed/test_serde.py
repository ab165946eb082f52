"""Strict payloads: what crosses Redis is rebuilt only from allowed types, within a size cap."""

from __future__ import annotations

import pickle
from typing import Annotated, Any

import ormsgpack
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from pydantic import BaseModel
from typing_extensions import TypedDict

from langgraph_batch.distributed import PayloadRejectedError, PayloadTooLargeError
from langgraph_batch.distributed._serde import Serde, graph_types, validate_input

CALLED: list[Any] = []


def boom(*args: Any) -> None:
    """What a crafted payload would like to run."""
    CALLED.append(args)


class Review(BaseModel):
    score: int


class State(TypedDict, total=False):
    index: int
    ratio: float
    tags: list[str]
    review: Review
    maybe: int | None
    messages: Annotated[list[Any], add_messages]


def _graph(schema: Any = State) -> Any:
    b = StateGraph(schema)
    b.add_node("n", lambda s: {})
    b.add_edge(START, "n")
    return b.compile()


def test_graph_types_come_from_the_state_schema() -> None:
    assert graph_types(_graph()) == {(__name__, "Review")}


def test_messages_and_schema_types_round_trip() -> None:
    serde = Serde.for_graph(_graph())
    value = {
        "messages": [HumanMessage("hi"), AIMessage("yo"), ToolMessage("r", tool_call_id="1")],
        "review": Review(score=3),
        "n": 1,
    }
    assert serde.loads(serde.dumps(value, what="result"), what="result") == value
    assert serde.loads(serde.dumps(None, what="result"), what="result") is None


def test_unlisted_types_are_refused() -> None:
    data = Serde.for_graph(_graph()).dumps({"review": Review(score=1)}, what="result")
    with pytest.raises(PayloadRejectedError) as info:
        Serde().loads(data, what="result")
    assert info.value.blocked == (f"{__name__}.Review",)
    assert "allowed_types" in str(info.value)
    # ... unless allowed explicitly.
    assert Serde(allowed=[Review]).loads(data, what="result") == {"review": Review(score=1)}


@pytest.mark.parametrize(
    "ext",
    [
        ormsgpack.Ext(0, ormsgpack.packb([__name__, "boom", "x"])),
        ormsgpack.Ext(1, ormsgpack.packb([__name__, "boom", ["x"]])),
        ormsgpack.Ext(2, ormsgpack.packb([__name__, "boom", {"a": 1}])),
        ormsgpack.Ext(3, ormsgpack.packb([__name__, "boom", "x", "__call__"])),
        ormsgpack.Ext(5, ormsgpack.packb([__name__, "boom", {"a": 1}, "model_validate"])),
        ormsgpack.Ext(1, ormsgpack.packb(["os", "system", ["true"]])),
    ],
)
def test_crafted_msgpack_is_rejected_and_calls_nothing(ext: ormsgpack.Ext) -> None:
    payload = b"msgpack\0" + ormsgpack.packb({"index": ext})
    with pytest.raises(PayloadRejectedError):
        Serde().loads(payload, what="input")
    assert CALLED == []


def test_pickle_json_and_unknown_formats_are_never_read() -> None:
    serde = Serde()
    for payload in (
        b"pickle\0" + pickle.dumps({"a": 1}),
        b'json\0{"lc": 2, "type": "constructor", "id": ["os", "system"], "args": ["x"]}',
        b"bytes\0abc",
        b"no separator",
    ):
        with pytest.raises(PayloadRejectedError, match="not a strict msgpack payload"):
            serde.loads(payload, what="input")
    with pytest.raises(PayloadRejectedError, match="could not be decoded"):
        serde.loads(b"msgpack\0\xc1", what="input")


def test_size_cap_on_both_sides() -> None:
    small = Serde(max_bytes=100)
    with pytest.raises(PayloadTooLargeError) as info:
        small.dumps({"text": "x" * 200}, what="input")
    assert (info.value.limit, info.value.what) == (100, "input")
    assert info.value.size > 100
    big = Serde().dumps({"text": "x" * 200}, what="result")
    with pytest.raises(PayloadTooLargeError):
        small.loads(big, what="result")
    with pytest.raises(ValueError, match="max_payload_bytes"):
        Serde(max_bytes=0)


def test_unserialisable_values_are_a_type_error() -> None:
    with pytest.raises(TypeError, match="cannot serialise the result"):
        Serde().dumps({"f": object()}, what="result")


def test_validate_input_like_langgraph_accepts_it() -> None:
    g = _graph()
    assert validate_input(g, {"index": 1, "ratio": 2, "tags": ["a"], "maybe": None}) == []
    assert validate_input(g, {"review": {"score": 1}}) == []  # the graph validates models
    assert validate_input(g, {"messages": "hi"}) == []  # a reducer decides
    assert validate_input(g, [1]) == ["the input must be a mapping for State, got list"]
    problems = validate_input(g, {"index": "1", "tags": "a", "bogus": 1, "ratio": True})
    assert problems == [
        "key 'index': a str does not fit int",
        "key 'tags': a str does not fit list",
        "unknown key 'bogus' (the input schema has: index, maybe, messages, ratio, review, tags)",
        "key 'ratio': a bool does not fit float",
    ]
    assert validate_input(_graph(MessagesState), {"messages": [("user", "hi")]}) == []


def test_validate_input_leaves_plain_runnables_alone() -> None:
    from langchain_core.runnables import RunnableLambda

    assert validate_input(RunnableLambda(lambda x: x), 42) == []
