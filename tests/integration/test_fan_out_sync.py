"""A synchronous graph with a synchronous checkpointer, against the emulator.

`graph.invoke` on a graph compiled with `SqliteSaver` (no async API), whose
`fan_out` siblings are ReAct agents: `BatchedChatModel.invoke` in a sync
model node, a sync tool in a `BatchToolNode`. The siblings run in threads;
their model calls meet in one scheduler, each sibling's identity reaches its
model and tool calls, results come back in input order, and one failing
sibling fails alone.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any, TypedDict

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from langgraph_batch._context import current_sibling
from langgraph_batch._loop import background_loop
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.nodes import SiblingError, fan_out
from langgraph_batch.tools import BatchToolNode

MODEL = "emulated-llama-3-8b"
N = 8


class Parent(TypedDict, total=False):
    docs: list[str]
    out: list[Any]


def test_sync_graph_with_sqlite_saver_runs_batched_siblings(
    emulator_url: str, tmp_path: Path
) -> None:
    llm = BatchedChatModel(
        model=MODEL,
        base_url=emulator_url.replace("http://", "vllm://"),
        max_tokens=64,
        extra_body={"emulator": {"output_tokens": 4}},
    )
    lock = threading.Lock()
    tool_calls: Counter[int] = Counter()

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        sib = current_sibling()
        assert sib is not None, "the sibling identity did not reach the tool"
        with lock:
            tool_calls[sib.index] += 1
        if key == "k3":
            raise LookupError("no entry for k3")
        return f"value of {key}"

    bound = llm.bind_tools([lookup])

    def model(state: MessagesState) -> dict[str, Any]:
        assert current_sibling() is not None
        return {"messages": [bound.invoke(state["messages"])]}

    sub = StateGraph(MessagesState)
    sub.add_node("model", model)
    sub.add_node("tools", BatchToolNode([lookup], handle_tool_errors=False))
    sub.add_edge(START, "model")
    sub.add_conditional_edges("model", tools_condition, ["tools", END])
    sub.add_edge("tools", "model")

    b = StateGraph(Parent)
    b.add_node(
        "fan",
        fan_out(
            sub.compile(),
            items="docs",
            into="out",
            make_input=lambda doc, i: {"messages": [HumanMessage(doc)]},
            result=lambda final: [
                str(m.content) for m in final["messages"] if isinstance(m, ToolMessage)
            ],
            name="fan",
        ),
    )
    b.add_edge(START, "fan")
    events: list[dict[str, Any]] = []
    with SqliteSaver.from_conn_string(str(tmp_path / "ckpt.sqlite")) as saver:
        graph = b.compile(checkpointer=saver)
        cfg: Any = {"configurable": {"thread_id": "sync-emulator"}}
        for mode, chunk in graph.stream(
            {"docs": [f"review doc {i} key=k{i}" for i in range(N)]},
            cfg,
            stream_mode=["custom", "values"],
        ):
            if mode == "custom":
                events.append(chunk)
        out = graph.get_state(cfg).values["out"]
    # Sync model calls run on the shared background loop: its scheduler.
    stats = background_loop().call(lambda: llm.get_scheduler().stats())

    assert len(out) == N
    for i, result in enumerate(out):
        if i == 3:
            assert isinstance(result, SiblingError)
            assert result.error_type == "LookupError"
        else:
            assert result == [f"value of k{i}"]
    assert tool_calls == Counter(range(N))
    finished = [e for e in events if e["event"] == "sibling_finished"]
    # Each sibling's identity reached its model calls: two turns each.
    assert sorted(e["index"] for e in finished) == [i for i in range(N) if i != 3]
    assert {e["turns"] for e in finished} == {2}
    assert events[-1]["event"] == "done"
    assert events[-1]["failed"] == 1
    # All siblings' calls went through the one scheduler of the background loop.
    assert stats.completed >= 2 * (N - 1) + 1
