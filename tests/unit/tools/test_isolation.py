"""Coalescing never crosses runs, threads or users unless the tool author says so.

A coalesced tool that reads its caller from the run (here: `user_id` from the
config, read with `get_config()`, which `coalesce()` cannot see) is shared only
within one fan_out run or, outside fan_out, one LangGraph root run.
"""

from __future__ import annotations

import asyncio
import gc
import operator
import tracemalloc
import uuid
from collections import Counter
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_config
from langgraph.graph import START, StateGraph
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Send

import langgraph_batch.tools._coalesce as policy_module
from langgraph_batch.nodes.fan_out import fan_out
from langgraph_batch.tools import BatchToolNode, coalesce, coalesce_policy
from tests.fakes.chat_models import ask
from tests.fakes.fan_out import react_graph, tool_messages


class UserTool:
    """`profile(field)`: answers for the run's user; held until `expect` callers arrived."""

    def __init__(self, expect: int = 1) -> None:
        self.executions: Counter[str] = Counter()
        self.arrived = 0
        self.expect = expect
        self.all_arrived = asyncio.Event()
        if expect <= 1:
            self.all_arrived.set()

        @tool
        async def profile(field: str) -> str:
            """The caller's profile field."""
            user = get_config()["configurable"]["user_id"]
            self.executions[user] += 1
            await self.all_arrived.wait()
            return f"{field} of {user}"

        self.tool = profile

    async def arrive(self, request: ToolCallRequest, execute: Any) -> Any:
        """A user `awrap_tool_call` that counts callers before they reach coalescing."""
        self.arrived += 1
        if self.arrived >= self.expect:
            self.all_arrived.set()
        return await execute(request)


def user_config(user: str, *, thread: bool = False) -> RunnableConfig:
    conf: dict[str, Any] = {"user_id": user}
    if thread:
        conf["thread_id"] = f"thread-{user}-{uuid.uuid4().hex[:6]}"
    return {"configurable": conf}


def answers(result: dict[str, Any]) -> list[str]:
    return [str(m.content) for m in tool_messages(result)]


# ---------------------------------------------------------------------------------------
# Outside fan_out: one LangGraph root run is the scope
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["run", "inflight"])
@pytest.mark.parametrize("thread", [False, True])
async def test_concurrent_root_runs_of_two_users_never_share(scope: str, thread: bool) -> None:
    users = UserTool(expect=2)
    marked = coalesce(users.tool, scope=scope)  # type: ignore[arg-type]
    node = BatchToolNode([marked], awrap_tool_call=users.arrive)
    graph = react_graph(node)
    if thread:
        graph = graph.builder.compile(checkpointer=InMemorySaver())
    alice, bob = await asyncio.gather(
        graph.ainvoke(ask(("profile", {"field": "email"})), user_config("alice", thread=thread)),
        graph.ainvoke(ask(("profile", {"field": "email"})), user_config("bob", thread=thread)),
    )
    assert answers(alice) == ["email of alice"]
    assert answers(bob) == ["email of bob"]
    assert users.executions == Counter({"alice": 1, "bob": 1})


async def test_ttl_does_not_carry_a_result_into_another_users_run() -> None:
    users = UserTool()
    graph = react_graph(BatchToolNode([coalesce(users.tool, ttl=600.0)]))
    first = await graph.ainvoke(ask(("profile", {"field": "email"})), user_config("alice"))
    second = await graph.ainvoke(ask(("profile", {"field": "email"})), user_config("bob"))
    assert answers(first) == ["email of alice"]
    assert answers(second) == ["email of bob"]


class MapState(TypedDict, total=False):
    fields: list[str]
    out: Annotated[list[str], operator.add]


def send_map_reduce(agent: Any) -> Any:
    """A plain `Send` map-reduce (no fan_out): one root run, N agent subgraphs."""

    async def run_agent(payload: dict[str, Any]) -> dict[str, Any]:
        final = await agent.ainvoke(ask(("profile", {"field": payload["field"]})))
        return {"out": answers(final)}

    builder = StateGraph(MapState)
    builder.add_node("agent", run_agent)
    builder.add_conditional_edges(
        START, lambda s: [Send("agent", {"field": f}) for f in s["fields"]], ["agent"]
    )
    return builder.compile()


async def test_one_root_run_shares_in_flight_results() -> None:
    users = UserTool(expect=4)
    marked = coalesce(users.tool)
    graph = send_map_reduce(react_graph(BatchToolNode([marked], awrap_tool_call=users.arrive)))
    out = await graph.ainvoke({"fields": ["email"] * 4}, user_config("carol"))
    assert out["out"] == ["email of carol"] * 4
    assert users.executions == Counter({"carol": 1})
    # Another root run (another user) executes again.
    out = await graph.ainvoke({"fields": ["email"]}, user_config("dave"))
    assert out["out"] == ["email of dave"]
    assert users.executions == Counter({"carol": 1, "dave": 1})


class TwoStepState(TypedDict, total=False):
    out: Annotated[list[str], operator.add]


async def test_one_root_run_reuses_completed_results_across_its_steps() -> None:
    users = UserTool()
    agent = react_graph(BatchToolNode([coalesce(users.tool)]))

    async def step(_: TwoStepState) -> dict[str, Any]:
        return {"out": answers(await agent.ainvoke(ask(("profile", {"field": "email"}))))}

    builder = StateGraph(TwoStepState)
    builder.add_node("first", step)
    builder.add_node("second", step)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    graph = builder.compile()
    out = await graph.ainvoke({}, user_config("erin"))
    assert out["out"] == ["email of erin"] * 2
    assert users.executions == Counter({"erin": 1})
    out = await graph.ainvoke({}, user_config("frank"))
    assert out["out"] == ["email of frank"] * 2
    assert users.executions == Counter({"erin": 1, "frank": 1})


async def test_global_scope_is_the_authors_explicit_choice() -> None:
    calls = Counter[str]()

    @tool
    async def exchange_rate(pair: str) -> str:
        """A public exchange rate: the same for every caller."""
        calls[pair] += 1
        return f"{pair}=1.1"

    graph = react_graph(BatchToolNode([coalesce(exchange_rate, scope="global", ttl=600.0)]))
    for user in ("alice", "bob"):
        out = await graph.ainvoke(ask(("exchange_rate", {"pair": "EURUSD"})), user_config(user))
        assert answers(out) == ["EURUSD=1.1"]
    assert calls == Counter({"EURUSD": 1})


# ---------------------------------------------------------------------------------------
# Under fan_out: one fan_out run is the scope
# ---------------------------------------------------------------------------------------


class Parent(TypedDict, total=False):
    fields: list[str]
    out: list[Any]


def fan_out_graph(agent: Any, *, checkpointer: Any = None) -> Any:
    builder = StateGraph(Parent)
    builder.add_node(
        "fan",
        fan_out(
            agent,
            items="fields",
            into="out",
            make_input=lambda field, i: ask(("profile", {"field": field})),
            result=answers,
        ),
    )
    builder.add_edge(START, "fan")
    return builder.compile(checkpointer=checkpointer)


@pytest.mark.parametrize("scope", ["run", "inflight"])
async def test_concurrent_fan_out_runs_of_two_users_never_share(scope: str) -> None:
    users = UserTool(expect=6)
    marked = coalesce(users.tool, scope=scope)  # type: ignore[arg-type]
    agent = react_graph(BatchToolNode([marked], awrap_tool_call=users.arrive))
    graph = fan_out_graph(agent, checkpointer=InMemorySaver())
    alice, bob = await asyncio.gather(
        graph.ainvoke({"fields": ["email"] * 3}, user_config("alice", thread=True)),
        graph.ainvoke({"fields": ["email"] * 3}, user_config("bob", thread=True)),
    )
    assert alice["out"] == [["email of alice"]] * 3
    assert bob["out"] == [["email of bob"]] * 3
    # Shared within each run, never across the two.
    assert users.executions == Counter({"alice": 1, "bob": 1})


# ---------------------------------------------------------------------------------------
# Tools whose result depends on the caller: refused, or keyed by what they read
# ---------------------------------------------------------------------------------------


def test_tool_taking_an_injected_config_is_refused_with_how_to_declare_the_key() -> None:
    @tool
    def account(field: str, config: RunnableConfig) -> str:
        """The caller's account field."""
        return f"{field} of {config['configurable']['user_id']}"

    with pytest.raises(ValueError, match=r"caller_key=") as info:
        coalesce(account)
    assert "config" in str(info.value)


async def test_caller_key_partitions_shared_calls_by_what_the_tool_reads() -> None:
    calls = Counter[str]()

    @tool
    async def account(field: str, config: RunnableConfig) -> str:
        """The caller's account field."""
        user = config["configurable"]["user_id"]
        calls[user] += 1
        return f"{field} of {user}"

    marked = coalesce(
        account,
        scope="global",
        ttl=600.0,
        caller_key=lambda request: request.runtime.config["configurable"]["user_id"],
    )
    graph = react_graph(BatchToolNode([marked]))
    for user in ("alice", "bob", "alice", "bob"):
        out = await graph.ainvoke(ask(("account", {"field": "plan"})), user_config(user))
        assert answers(out) == [f"plan of {user}"]
    assert calls == Counter({"alice": 1, "bob": 1})


def test_caller_key_must_be_callable_and_inflight_takes_no_ttl() -> None:
    with pytest.raises(ValueError, match="caller_key"):
        coalesce(UserTool().tool, caller_key="user_id")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="inflight"):
        coalesce(UserTool().tool, scope="inflight", ttl=10.0)


# ---------------------------------------------------------------------------------------
# The registry of policies does not grow with every coalesce() call
# ---------------------------------------------------------------------------------------


def test_policy_registry_does_not_grow_with_discarded_tools() -> None:
    @tool
    def lookup(q: str) -> str:
        """Look up."""
        return q

    def make_and_drop(n: int) -> None:
        for _ in range(n):
            marked = coalesce(lookup, max_concurrency=2)
            assert coalesce_policy(marked) is not None

    make_and_drop(50)  # warm up caches (pydantic, typing) outside the measurement
    gc.collect()
    registered = len(policy_module._LIVE)
    # Count only what is still allocated from inside make_and_drop (this file's
    # frames): threads left running by other tests allocate meanwhile too.
    tracemalloc.start(32)
    try:
        make_and_drop(500)
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    mine = snapshot.filter_traces([tracemalloc.Filter(True, __file__, all_frames=True)])
    kept = sum(stat.size for stat in mine.statistics("filename"))
    assert len(policy_module._LIVE) == registered
    # Was about 1.3 KB per call (650 KB here); now what remains is noise.
    assert kept < 32_000, f"{kept / 500:.0f} bytes per coalesce() call"


def test_a_kept_copy_of_a_coalesced_tool_keeps_its_policy() -> None:
    @tool
    def lookup(q: str) -> str:
        """Look up."""
        return q

    marked = coalesce(lookup)
    policy = coalesce_policy(marked)
    copy: BaseTool = marked.model_copy()
    assert coalesce_policy(copy) is policy
    del marked
    gc.collect()
    assert coalesce_policy(copy) is policy
