"""fan_out in sync graphs (`graph.invoke` / `graph.stream`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from langgraph_batch._context import current_sibling
from langgraph_batch.nodes import SiblingError, fan_out
from langgraph_batch.nodes.fan_out import SyncUnsupportedError
from tests.fakes.fan_out import number_graph, parent_graph


def test_sync_invoke_collects_results_in_order_and_isolates_failures() -> None:
    node = fan_out(
        number_graph(fail_on={2}),
        items="xs",
        into="out",
        make_input=lambda x, i: {"x": x},
        result=lambda final: final["y"],
    )
    out = parent_graph(node).invoke({"xs": [1, 2, 3]})
    assert out["out"][0] == 11
    assert isinstance(out["out"][1], SiblingError)
    assert out["out"][1].index == 1
    assert out["out"][2] == 31


def test_sync_nodes_inside_siblings_see_their_identity() -> None:
    seen: list[tuple[int, bool]] = []
    lock = threading.Lock()

    class S(TypedDict, total=False):
        x: int

    def record(state: S) -> S:
        info = current_sibling()
        assert info is not None
        with lock:
            seen.append((info.index, threading.current_thread() is threading.main_thread()))
        return {"x": state["x"]}

    b = StateGraph(S)
    b.add_node("record", record)
    b.add_edge(START, "record")
    node = fan_out(b.compile(), items="xs", into="out", make_input=lambda x, i: {"x": x})
    parent_graph(node).invoke({"xs": [0, 1, 2, 3]})
    assert sorted(i for i, _ in seen) == [0, 1, 2, 3]
    # Sync sibling nodes run in worker threads, never on the caller's thread.
    assert not any(on_main for _, on_main in seen)


def test_sync_stream_with_checkpointer_emits_progress_and_saves_results() -> None:
    node = fan_out(
        number_graph(),
        items="xs",
        into="out",
        make_input=lambda x, i: {"x": x},
        result=lambda final: final["y"],
        name="fan",
    )
    g = parent_graph(node, checkpointer=InMemorySaver())
    cfg: Any = {"configurable": {"thread_id": "sync-1"}}
    events = [
        c
        for mode, c in g.stream({"xs": [4, 5]}, cfg, stream_mode=["custom", "values"])
        if mode == "custom"
    ]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "started"
    assert kinds.count("sibling_finished") == 2
    assert kinds[-1] == "done"
    assert g.get_state(cfg).values["out"] == [41, 51]


def test_xray_still_finds_the_sibling_subgraph() -> None:
    node = fan_out(number_graph(), items="xs", into="out")
    drawn = parent_graph(node).get_graph(xray=True)
    assert {"fan:sibling:times_ten", "fan:sibling:plus_one"} <= set(drawn.nodes)


# ---------------------------------------------------------------------------------------
# A sync-only checkpointer (SqliteSaver): siblings run in threads with `invoke`
# ---------------------------------------------------------------------------------------


class Sub(TypedDict, total=False):
    x: int
    y: int
    seen: list[Any]


def sync_sibling_graph(fail_on: frozenset[int] = frozenset()) -> Any:
    def work(state: Sub) -> Sub:
        info = current_sibling()
        assert info is not None
        if state["x"] in fail_on:
            raise ValueError(f"bad x {state['x']}")
        return {"y": state["x"] * 10, "seen": [info.index, info.group, info.total]}

    b = StateGraph(Sub)
    b.add_node("work", work)
    b.add_edge(START, "work")
    return b.compile()


@pytest.fixture
def sqlite_saver(tmp_path: Path) -> Iterator[Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    with SqliteSaver.from_conn_string(str(tmp_path / "checkpoints.sqlite")) as saver:
        yield saver


def test_sync_invoke_with_a_sync_only_checkpointer(sqlite_saver: Any) -> None:
    node = fan_out(
        sync_sibling_graph(fail_on=frozenset({3})),
        items="xs",
        into="out",
        make_input=lambda x, i: {"x": x},
        result=lambda final: (final["y"], final["seen"]),
    )
    g = parent_graph(node, checkpointer=sqlite_saver)
    cfg: Any = {"configurable": {"thread_id": "sqlite-1"}}
    out = g.invoke({"xs": [5, 3, 9, 0]}, cfg)["out"]
    assert [r[0] if not isinstance(r, SiblingError) else "err" for r in out] == [
        50,
        "err",
        90,
        0,
    ]
    assert isinstance(out[1], SiblingError)
    assert (out[1].index, out[1].error_type) == (1, "ValueError")
    # Every sibling saw its own identity, and all belong to one run.
    seen = [r[1] for r in out if not isinstance(r, SiblingError)]
    assert [s[0] for s in seen] == [0, 2, 3]
    assert {s[1] for s in seen} == {seen[0][1]}
    assert {s[2] for s in seen} == {4}
    # The results are checkpointed: the thread's state has them.
    assert len(g.get_state(cfg).values["out"]) == 4


def test_sync_stream_with_a_sync_only_checkpointer_emits_progress(sqlite_saver: Any) -> None:
    node = fan_out(
        sync_sibling_graph(),
        items="xs",
        into="out",
        make_input=lambda x, i: {"x": x},
        result=lambda final: final["y"],
        name="fan",
    )
    g = parent_graph(node, checkpointer=sqlite_saver)
    cfg: Any = {"configurable": {"thread_id": "sqlite-2"}}
    events = [
        c
        for mode, c in g.stream({"xs": [1, 2, 3]}, cfg, stream_mode=["custom", "values"])
        if mode == "custom"
    ]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "started"
    assert kinds.count("sibling_started") == 3
    assert kinds.count("sibling_finished") == 3
    assert kinds[-1] == "done"
    assert events[-1]["done"] == 3
    assert g.get_state(cfg).values["out"] == [10, 20, 30]


def test_sync_only_checkpointer_keeps_max_active(sqlite_saver: Any) -> None:
    active = 0
    peak = 0
    lock = threading.Lock()
    both_tried = threading.Barrier(2, timeout=0.2)

    def work(state: Sub) -> Sub:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        # With max_active=1 the other sibling never gets here at the same time.
        with contextlib.suppress(threading.BrokenBarrierError):
            both_tried.wait()
        with lock:
            active -= 1
        return {"y": state["x"]}

    b = StateGraph(Sub)
    b.add_node("work", work)
    b.add_edge(START, "work")
    node = fan_out(
        b.compile(), items="xs", into="out", make_input=lambda x, i: {"x": x}, max_active=1
    )
    g = parent_graph(node, checkpointer=sqlite_saver)
    g.invoke({"xs": [1, 2, 3]}, {"configurable": {"thread_id": "sqlite-3"}})
    assert peak == 1


def test_async_only_sibling_with_a_sync_only_checkpointer_names_the_async_api(
    sqlite_saver: Any,
) -> None:
    async def work(state: Sub) -> Sub:
        return {"y": state["x"]}

    b = StateGraph(Sub)
    b.add_node("work", work)
    b.add_edge(START, "work")
    node = fan_out(b.compile(), items="xs", into="out", make_input=lambda x, i: {"x": x})
    g = parent_graph(node, checkpointer=sqlite_saver)
    with pytest.raises(SyncUnsupportedError) as info:
        g.invoke({"xs": [1, 2]}, {"configurable": {"thread_id": "sqlite-4"}})
    message = str(info.value)
    assert "ainvoke" in message
    assert "AsyncSqliteSaver" in message
