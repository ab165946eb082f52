"""fan_out in sync graphs (`graph.invoke` / `graph.stream`)."""

from __future__ import annotations

import threading
from typing import Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from langgraph_batch._context import current_sibling
from langgraph_batch.nodes import SiblingError, fan_out
from tests.unit.nodes.fakes import number_graph
from tests.unit.nodes.test_fan_out import parent_graph


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
