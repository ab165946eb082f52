"""fan_out(executor=...): the parent keeps make_input, result, order, on_error and progress."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

from langgraph_batch import SiblingError, SiblingFailedError, fan_out
from langgraph_batch._observe.progress import extract_fan_out_event
from langgraph_batch.distributed import RemoteEvent, SiblingExecutor
from tests.fakes.fan_out import parent_graph


class Sub(TypedDict, total=False):
    x: int
    y: int


def _sub() -> Any:
    b = StateGraph(Sub)
    b.add_node("n", lambda s: {"y": s["x"] * 10})
    b.add_edge(START, "n")
    return b.compile()


class FakeExecutor:
    """Runs each input in reverse order, as remote workers might finish them."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, Any]] = []
        self.totals: list[int] = []

    async def run(
        self, subgraph: Any, inputs: Sequence[tuple[int, Any]], *, total: int, config: Any
    ) -> AsyncIterator[RemoteEvent]:
        self.seen, self.totals = list(inputs), [*self.totals, total]
        for index, value in reversed(inputs):
            yield RemoteEvent(index=index, kind="started")
            if value["x"] == 3:
                err = {"error_type": "ValueError", "message": "three", "retryable": False}
                yield RemoteEvent(index=index, kind="failed", value=err)
            else:
                yield RemoteEvent(index=index, kind="finished", value=await subgraph.ainvoke(value))
        yield RemoteEvent(index=0, kind="finished", value={"x": 0, "y": -1})  # duplicate: ignored


def _parent(ex: SiblingExecutor, **kwargs: Any) -> Any:
    def make_input(x: int, i: int) -> dict[str, int]:
        if x == 2:
            raise KeyError("no input for two")
        return {"x": x}

    def result(final: dict[str, int]) -> int:
        if final["x"] == 4:
            raise RuntimeError("result failed")
        return final["y"]

    node = fan_out(
        _sub(),
        items="xs",
        into="out",
        make_input=make_input,
        result=result,
        executor=ex,
        name="fan",
        **kwargs,
    )
    return parent_graph(node)


async def test_results_order_errors_and_progress_with_an_executor() -> None:
    ex = FakeExecutor()
    events = []
    out: list[Any] = []
    async for mode, chunk in _parent(ex).astream(
        {"xs": [0, 1, 2, 3, 4, 5]}, stream_mode=["custom", "values"]
    ):
        if mode == "custom":
            events.append(extract_fan_out_event(chunk))
        else:
            out = chunk.get("out", out)
    assert [i for i, _ in ex.seen] == [0, 1, 3, 4, 5]  # make_input ran here; 2 never sent
    assert ex.totals == [6]
    assert out[0] == 0
    assert out[1] == 10
    assert out[5] == 50
    for index, kind in ((2, "KeyError"), (3, "ValueError"), (4, "RuntimeError")):
        assert isinstance(out[index], SiblingError)
        assert (out[index].index, out[index].item, out[index].error_type) == (index, index, kind)
    names = [e["event"] for e in events]
    assert names[0] == "started"
    assert names[-1] == "done"
    assert names.count("sibling_started") == 5
    assert names.count("sibling_finished") == 3
    assert names.count("sibling_failed") == 3
    assert events[-1]["done"] == 6
    assert events[-1]["failed"] == 3


async def test_on_error_raise_with_an_executor() -> None:
    with pytest.raises(SiblingFailedError) as info:
        await _parent(FakeExecutor(), on_error="raise").ainvoke({"xs": [0, 3]})
    assert [e.index for e in info.value.errors] == [1]


def test_an_executor_needs_a_run_method() -> None:
    with pytest.raises(TypeError, match="SiblingExecutor"):
        fan_out(_sub(), items="xs", into="out", executor=object())  # type: ignore[arg-type]
    assert isinstance(FakeExecutor(), SiblingExecutor)
