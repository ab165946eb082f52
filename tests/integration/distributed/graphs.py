"""Sibling graphs the distributed tests' workers import by path (`...distributed.graphs:x`).

Each appends one line per event to the file named by `LGB_TEST_EXEC_LOG`
(`<index> <pid> start|done|cancel`, `tool <key> <pid>`), so the tests count
executions outside Redis.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from typing_extensions import TypedDict

from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.tools import BatchToolNode, at_most_once, coalesce


def _append(line: str) -> None:
    path = os.environ.get("LGB_TEST_EXEC_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


async def log(line: str) -> None:
    await asyncio.to_thread(_append, line)


class Job(TypedDict, total=False):
    index: int
    x: int
    sleep: float
    fail: bool
    poison: bool
    pad: str
    y: int
    pid: int


async def work(state: Job) -> dict[str, Any]:
    index = state.get("index", -1)
    await log(f"{index} {os.getpid()} start")
    if state.get("poison"):
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        await asyncio.sleep(state.get("sleep", 0.0))
    except asyncio.CancelledError:
        await asyncio.shield(log(f"{index} {os.getpid()} cancel"))
        raise
    if state.get("fail"):
        raise ValueError(f"sibling {index} fails on purpose")
    await log(f"{index} {os.getpid()} done")
    return {"y": state.get("x", 0) * 2, "pid": os.getpid()}


def _sleepy() -> Any:
    b = StateGraph(Job)
    b.add_node("work", work)
    b.add_edge(START, "work")
    return b.compile(name="sleepy")


sleepy = _sleepy()


# -- one LLM call per sibling (the cluster in-flight cap test) -----------------------------


class Ask(TypedDict, total=False):
    prompt: str
    answer: str


_llm = BatchedChatModel(
    model="test-model",
    base_url=os.environ.get("LGB_TEST_LLM_URL", "http://127.0.0.1:9/v1"),
    max_tokens=int(os.environ.get("LGB_TEST_LLM_MAX_TOKENS", "8")),
    max_retries=0,
)


async def ask(state: Ask) -> dict[str, Any]:
    msg = await _llm.ainvoke(state["prompt"])
    return {"answer": str(msg.content)}


def _asker() -> Any:
    b = StateGraph(Ask)
    b.add_node("ask", ask)
    b.add_edge(START, "ask")
    return b.compile(name="asker")


asker = _asker()
asker_free = asker  # the same graph under a second path: workers of another pool


# -- a coalesced tool (cross-worker single flight) -----------------------------------------


@tool
async def lookup(q: str) -> str:
    """Look something up (slowly)."""
    await log(f"tool {q} {os.getpid()}")
    await asyncio.sleep(float(os.environ.get("LGB_TEST_TOOL_SLEEP", "0.4")))
    return f"result:{q}"


class Call(MessagesState, total=False):
    q: str


def make_call(state: Call) -> dict[str, Any]:
    call = {"name": "lookup", "args": {"q": state["q"]}, "id": "call-1", "type": "tool_call"}
    return {"messages": [AIMessage(content="", tool_calls=[call])]}


def _tooly() -> Any:
    b = StateGraph(Call)
    b.add_node("call", make_call)
    b.add_node("tools", BatchToolNode([coalesce(lookup)]))
    b.add_edge(START, "call")
    b.add_edge("call", "tools")
    b.add_edge("tools", END)
    return b.compile(name="tooly")


tooly = _tooly()


# -- an at-most-once tool whose host dies (the at-most-once tests) -----------------------


def _first_time(name: str) -> bool:
    """True the first time any process of the test asks (a marker file beside the log)."""
    path = os.environ.get("LGB_TEST_EXEC_LOG")
    if not path:
        return False
    try:
        with open(f"{path}.{name}", "x"):
            return True
    except FileExistsError:
        return False


@tool
async def charge(order: str) -> str:
    """Charge an order: an effect outside, logged once per execution."""
    await log(f"charge {order} {os.getpid()}")
    if order.endswith("-dies-in-tool") and _first_time(order):
        os.kill(os.getpid(), signal.SIGKILL)  # the host dies while the tool runs
    await asyncio.sleep(0.05)
    return f"charged:{order}"


class Order(MessagesState, total=False):
    index: int
    order: str
    answer: str


def place_order(state: Order) -> dict[str, Any]:
    call = {"name": "charge", "args": {"order": state["order"]}, "id": "c1", "type": "tool_call"}
    return {"messages": [AIMessage(content="", tool_calls=[call])]}


async def confirm(state: Order) -> dict[str, Any]:
    if state["order"].endswith("-dies-after") and _first_time(state["order"]):
        os.kill(os.getpid(), signal.SIGKILL)  # the host dies after the tool finished
    return {"answer": str(state["messages"][-1].content)}


def _orders() -> Any:
    b = StateGraph(Order)
    b.add_node("place", place_order)
    b.add_node("tools", BatchToolNode([at_most_once(charge)]))
    b.add_node("confirm", confirm)
    b.add_edge(START, "place")
    b.add_edge("place", "tools")
    b.add_edge("tools", "confirm")
    b.add_edge("confirm", END)
    return b.compile(name="orders")


orders = _orders()
