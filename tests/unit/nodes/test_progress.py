from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langgraph.graph import START, StateGraph

from langgraph_batch._observe.progress import (
    FAN_OUT_EVENT,
    ProgressBar,
    extract_fan_out_event,
    fan_out_event,
    render_progress,
)
from langgraph_batch.nodes import fan_out
from tests.fakes.fan_out import Parent, number_graph, parent_graph


def graph(fail_on: set[int] | None = None) -> Any:
    node = fan_out(
        number_graph(fail_on),
        items="xs",
        into="out",
        make_input=lambda x, i: {"x": x},
        result=lambda f: f["y"],
        name="review",
    )
    return parent_graph(node, name="review")


async def test_progress_events_reach_the_custom_stream_with_subgraphs() -> None:
    events: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    final = None
    async for ns, mode, data in graph(fail_on={2}).astream(
        {"xs": [0, 1, 2, 3]}, stream_mode=["custom", "values"], subgraphs=True
    ):
        if mode == "custom":
            events.append((ns, data))
        elif ns == ():
            final = data
    assert final is not None
    assert final["out"][0] == 1
    kinds = [d["event"] for _, d in events]
    assert kinds[0] == "started"
    assert kinds[-1] == "done"
    assert kinds.count("sibling_started") == 4
    assert kinds.count("sibling_finished") == 3
    assert kinds.count("sibling_failed") == 1
    for _ns, d in events:
        assert d["type"] == FAN_OUT_EVENT
        assert d["node"] == "review"
        assert d["total"] == 4
        json.dumps(d)  # JSON-serialisable for Studio
    failed = next(d for _, d in events if d["event"] == "sibling_failed")
    assert failed["index"] == 2
    assert failed["error_type"] == "ValueError"
    done = events[-1][1]
    assert (done["done"], done["failed"]) == (4, 1)
    # written by the fan_out node: at most one level below the parent
    assert all(ns == () or (len(ns) == 1 and ns[0].startswith("review:")) for ns, _ in events)
    # the done counter only grows
    dones = [d["done"] for _, d in events]
    assert dones == sorted(dones)


async def test_render_progress_plain_lines_when_not_a_tty() -> None:
    out = io.StringIO()
    seen = []
    async for chunk in render_progress(
        graph(fail_on={1}).astream(
            {"xs": [0, 1, 2]}, stream_mode=["custom", "values"], subgraphs=True
        ),
        stream=out,
        min_interval=0.0,
    ):
        seen.append(chunk)
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("review [")
    assert "0/3" in lines[0]
    assert lines[-1].endswith("done")
    assert "3/3" in lines[-1]
    assert "1 failed" in lines[-1]
    assert any("sibling 1 failed: ValueError: bad x 1" in line for line in lines)
    assert any(c[1] == "values" and c[0] == () and "out" in c[2] for c in seen)


async def test_plain_lines_are_throttled() -> None:
    out = io.StringIO()
    bar = ProgressBar(stream=out, min_interval=3600)
    bar.update(fan_out_event("started", node="n", group="g", done=0, failed=0, total=100))
    for i in range(100):
        bar.update(
            fan_out_event("sibling_finished", node="n", group="g", done=i + 1, failed=0, total=100)
        )
    bar.update(fan_out_event("done", node="n", group="g", done=100, failed=0, total=100))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "100/100" in lines[1]


async def test_top_level_events_need_no_subgraphs_flag() -> None:
    kinds = [
        data["event"]
        async for data in graph().astream({"xs": [0, 1]}, stream_mode="custom")
        if isinstance(data, dict)
    ]
    assert kinds[0] == "started"
    assert kinds[-1] == "done"
    assert kinds.count("sibling_finished") == 2


def test_tty_redraws_one_line_in_place() -> None:
    out = io.StringIO()
    bar = ProgressBar(stream=out, tty=True, width=10)
    bar.update(fan_out_event("started", node="n", group="g", done=0, failed=0, total=4, active=0))
    bar.update(
        fan_out_event(
            "sibling_finished",
            node="n",
            group="g",
            done=2,
            failed=0,
            total=4,
            active=2,
            stats={"queued": 5, "in_flight": 3},
        )
    )
    text = out.getvalue()
    assert text.count("\r\x1b[2K") == 2
    assert "\n" not in text
    assert "n [#####-----] 2/4, 2 active, queued 5, in_flight 3" in text
    bar.close()
    assert out.getvalue().endswith("\n")


class TtyStream(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_tty_is_detected_from_the_stream() -> None:
    assert ProgressBar(stream=TtyStream()).is_tty
    assert not ProgressBar(stream=io.StringIO()).is_tty


def test_bad_bar_options() -> None:
    with pytest.raises(ValueError, match="width"):
        ProgressBar(width=0)
    with pytest.raises(ValueError, match="min_interval"):
        ProgressBar(min_interval=-1)


@pytest.mark.parametrize(
    "shape",
    [
        lambda e: e,
        lambda e: ("custom", e),
        lambda e: (("ns:1",), e),
        lambda e: (("ns:1",), "custom", e),
        lambda e: {"event": "custom", "data": e},
    ],
)
def test_extract_event_from_every_stream_shape(shape: Any) -> None:
    event = fan_out_event("done", node="n", group="g", done=1, failed=0, total=1)
    assert extract_fan_out_event(shape(event)) == event


def test_extract_ignores_other_chunks() -> None:
    event = fan_out_event("done", group="g")
    assert extract_fan_out_event(("values", event)) is None
    assert extract_fan_out_event({"foo": 1}) is None
    assert extract_fan_out_event(("custom", {"type": "other"})) is None
    assert extract_fan_out_event(42) is None


async def test_render_progress_closes_the_line_when_the_stream_fails() -> None:
    out = io.StringIO()

    async def broken() -> AsyncIterator[Any]:
        yield ("custom", fan_out_event("started", node="n", group="g", done=0, total=2))
        raise RuntimeError("stream broke")

    with pytest.raises(RuntimeError, match="stream broke"):
        async for _ in render_progress(broken(), stream=out, tty=True):
            pass
    assert out.getvalue().endswith("\n")


async def test_events_name_the_graph_node_when_no_name_is_given() -> None:
    node = fan_out(number_graph(), items="xs", into="out", make_input=lambda x, i: {"x": x})
    b = StateGraph(Parent)
    b.add_node("triage", node)
    b.add_edge(START, "triage")
    names = {
        data["node"]
        async for data in b.compile().astream({"xs": [1]}, stream_mode="custom")
        if isinstance(data, dict)
    }
    assert names == {"triage"}


async def test_closing_render_progress_early_closes_the_stream_it_wraps() -> None:
    """A consumer that stops reading (break, cancellation) must stop the graph run it
    was reading, not leave it running until garbage collection."""
    closed = False

    async def run() -> AsyncIterator[Any]:
        nonlocal closed
        try:
            for i in range(100):
                yield ("custom", fan_out_event("sibling_finished", node="n", done=i, total=100))
        finally:
            closed = True

    bar = render_progress(run(), stream=io.StringIO(), tty=False)
    async for _ in bar:
        break
    await bar.aclose()
    assert closed
