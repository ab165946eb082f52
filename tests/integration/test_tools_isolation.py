"""Coalesced tools never cross users, against the emulator (real scheduler, real HTTP).

Two users run the same graph at the same time, with different thread ids and
a `user_id` in the config. Every sibling asks the emulated model about the
same key, so every tool call has the same arguments; the tool answers for
the run's user (read with `get_config()`, which `coalesce()` cannot see).
Each run shares its calls among its own siblings and never gets the other
user's answer, with `fan_out` and with a plain `Send` map-reduce.
"""

from __future__ import annotations

import asyncio
import operator
import uuid
from collections import Counter
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_config
from langgraph.graph import START, StateGraph
from langgraph.types import Send

from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.nodes import fan_out
from langgraph_batch.tools import BatchToolNode, coalesce

pytestmark = [
    pytest.mark.filterwarnings("ignore:create_react_agent has been moved"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

MODEL = "emulated-llama-3-8b"
SIBLINGS = 6


class Accounts:
    """`account(key)`: the run's user's record; executions counted per user."""

    def __init__(self) -> None:
        self.executions: Counter[str] = Counter()

        @tool
        async def account(key: str) -> str:
            """Look up the caller's account record for a key."""
            user = get_config()["configurable"]["user_id"]
            self.executions[user] += 1
            await asyncio.sleep(0.05)  # slow enough for the two runs to overlap
            return f"record {key} of {user}"

        self.tool = account


def agent(url: str, accounts: Accounts, scope: str) -> Any:
    from langgraph.prebuilt import create_react_agent

    llm = BatchedChatModel(
        model=MODEL,
        base_url=url.replace("http://", "vllm://"),
        max_tokens=64,
        extra_body={"emulator": {"output_tokens": 4}},
    )
    marked = coalesce(accounts.tool, scope=scope)  # type: ignore[arg-type]
    return create_react_agent(llm, tools=BatchToolNode([marked]))


def tool_answers(messages: list[Any]) -> list[str]:
    return [str(m.content) for m in messages if isinstance(m, ToolMessage)]


def config(user: str) -> Any:
    return {"configurable": {"user_id": user, "thread_id": f"{user}-{uuid.uuid4().hex[:8]}"}}


class FanState(TypedDict, total=False):
    docs: list[str]
    out: list[Any]


class SendState(TypedDict, total=False):
    docs: list[str]
    out: Annotated[list[Any], operator.add]


def fan_out_graph(sibling: Any) -> Any:
    b = StateGraph(FanState)
    b.add_node(
        "fan",
        fan_out(
            sibling,
            items="docs",
            into="out",
            make_input=lambda doc, i: {"messages": [HumanMessage(doc)]},
            result=lambda final: tool_answers(final["messages"]),
        ),
    )
    b.add_edge(START, "fan")
    return b.compile(checkpointer=InMemorySaver())


def send_graph(sibling: Any) -> Any:
    async def run(payload: dict[str, Any]) -> dict[str, Any]:
        final = await sibling.ainvoke({"messages": [HumanMessage(payload["doc"])]})
        return {"out": [tool_answers(final["messages"])]}

    b = StateGraph(SendState)
    b.add_node("agent", run)
    b.add_conditional_edges(START, lambda s: [Send("agent", {"doc": d}) for d in s["docs"]])
    return b.compile(checkpointer=InMemorySaver())


@pytest.mark.parametrize("scope", ["run", "inflight"])
@pytest.mark.parametrize("shape", ["fan_out", "send"])
async def test_two_users_at_once_never_get_each_others_tool_results(
    emulator_url: str, scope: str, shape: str
) -> None:
    accounts = Accounts()
    sibling = agent(emulator_url, accounts, scope)
    graph = fan_out_graph(sibling) if shape == "fan_out" else send_graph(sibling)
    docs = [f"check account #{i} key=plan" for i in range(SIBLINGS)]
    alice, bob = await asyncio.gather(
        graph.ainvoke({"docs": docs}, config("alice")),
        graph.ainvoke({"docs": docs}, config("bob")),
    )
    assert alice["out"] == [["record plan of alice"]] * SIBLINGS
    assert bob["out"] == [["record plan of bob"]] * SIBLINGS
    # Each run shared its identical calls among its own siblings.
    assert set(accounts.executions) == {"alice", "bob"}
    assert max(accounts.executions.values()) < SIBLINGS
