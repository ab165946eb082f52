"""BatchToolNode and BatchMiddleware inside real LangGraph graphs, with concurrent siblings."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.prebuilt import InjectedState, ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from langgraph_batch._context import SiblingInfo, current_sibling, sibling_scope
from langgraph_batch.tools import (
    BatchMiddleware,
    BatchToolNode,
    coalesce,
    coalesce_policy,
    coalescing,
    tool_stats,
)
from tests.fakes.chat_models import ScriptedToolModel, ask
from tests.fakes.fan_out import RecordingAdmission, react_graph, tool_call_ids, tool_messages

CITIES = ["paris", "tokyo", "lima"]


class Weather:
    """A counted `weather(city)` tool, optionally gated until N callers wait on it."""

    def __init__(self) -> None:
        self.executions: Counter[str] = Counter()
        self.seen_tools_active: list[int] = []
        self.release = asyncio.Event()
        self.release.set()

        @tool
        async def weather(city: str) -> str:
            """Weather for a city."""
            self.executions[city] += 1
            sibling = current_sibling()
            self.seen_tools_active.append(sibling.tools_active if sibling else -1)
            await self.release.wait()
            if city == "atlantis":
                raise ValueError("no such city: atlantis")
            return f"sunny in {city}"

        self.tool = weather


async def run_siblings(
    graph: Any,
    inputs: list[dict[str, Any]],
    *,
    group: str | None = None,
    admission: RecordingAdmission | None = None,
) -> tuple[str, list[Any], list[SiblingInfo]]:
    group = group or f"run-{uuid.uuid4().hex[:8]}"
    infos = [
        SiblingInfo(group=group, index=i, total=len(inputs), admission=admission)
        for i in range(len(inputs))
    ]

    async def one(i: int) -> Any:
        with sibling_scope(infos[i]):
            return await graph.ainvoke(inputs[i])

    # gather wraps each coroutine in its own task, each with a copied context.
    results = await asyncio.gather(*(one(i) for i in range(len(inputs))), return_exceptions=True)
    return group, results, infos


def check_own_ids(result: dict[str, Any]) -> None:
    """Every ToolMessage answers a tool call of this very conversation."""
    ids = tool_call_ids(result)
    msgs = tool_messages(result)
    assert msgs, "no tool message"
    assert sorted(m.tool_call_id for m in msgs) == sorted(ids)


async def test_siblings_share_executions_by_distinct_key() -> None:
    w = Weather()
    graph = react_graph(BatchToolNode([coalesce(w.tool)]))
    n = 12
    inputs = [ask(("weather", {"city": CITIES[i % 3]})) for i in range(n)]
    group, results, infos = await run_siblings(graph, inputs)

    assert sum(w.executions.values()) == 3  # tool executions == distinct keys
    assert set(w.executions) == set(CITIES)
    all_ids = set()
    for i, result in enumerate(results):
        check_own_ids(result)
        (msg,) = tool_messages(result)
        assert msg.content == f"sunny in {CITIES[i % 3]}"
        assert msg.name == "weather"
        assert result["messages"][-1].content == f"final:sunny in {CITIES[i % 3]}"
        all_ids.add(msg.tool_call_id)
    assert len(all_ids) == n
    stats = tool_stats(group)
    assert (stats.requested, stats.executed, stats.shared, stats.errors) == (n, 3, n - 3, 0)
    assert stats.by_tool["weather"].executed == 3
    assert all(info.tools_active == 0 for info in infos)


async def test_inflight_scope_shares_only_overlapping_calls() -> None:
    w = Weather()
    w.release.clear()
    coalesced = coalesce(w.tool, scope="inflight")
    policy = coalesce_policy(coalesced)
    live = coalescing(coalesced)
    assert live is not None
    assert policy is not None
    graph = react_graph(BatchToolNode([coalesced]))
    key = policy.call_key("weather", {"city": "paris"})

    n = 6
    run = asyncio.create_task(run_siblings(graph, [ask(("weather", {"city": "paris"}))] * n))
    for _ in range(10_000):  # event-coordinated: wait until all n callers wait on one execution
        if live.coalescer.waiting(key) == n:
            break
        await asyncio.sleep(0)
    assert live.coalescer.waiting(key) == n
    w.release.set()
    _, results, _ = await run
    for result in results:
        check_own_ids(result)
    assert w.executions["paris"] == 1
    # No run-scoped reuse: a later sibling of a finished run executes again.
    await run_siblings(graph, [ask(("weather", {"city": "paris"}))])
    assert w.executions["paris"] == 2


async def test_unmarked_tools_are_never_shared() -> None:
    w = Weather()
    graph = react_graph(BatchToolNode([w.tool]))
    group, results, _ = await run_siblings(graph, [ask(("weather", {"city": "paris"}))] * 5)
    assert w.executions["paris"] == 5
    for result in results:
        check_own_ids(result)
    stats = tool_stats(group)
    assert (stats.requested, stats.executed, stats.shared) == (5, 5, 0)


async def test_tool_errors_shared_as_error_messages_with_handle_tool_errors() -> None:
    w = Weather()
    w.release.clear()
    coalesced = coalesce(w.tool)
    policy = coalesce_policy(coalesced)
    live = coalescing(coalesced)
    assert live is not None
    assert policy is not None
    graph = react_graph(BatchToolNode([coalesced], handle_tool_errors=True))
    n = 5
    group = "run-errors"
    key = policy.call_key("weather", {"city": "atlantis"})
    run = asyncio.create_task(
        run_siblings(graph, [ask(("weather", {"city": "atlantis"}))] * n, group=group)
    )
    for _ in range(10_000):
        if live.coalescer.waiting(key, scope=group) == n:
            break
        await asyncio.sleep(0)
    w.release.set()
    _, results, _ = await run
    assert w.executions["atlantis"] == 1
    for result in results:
        check_own_ids(result)
        (msg,) = tool_messages(result)
        assert msg.status == "error"
        assert "no such city: atlantis" in str(msg.content)
    stats = tool_stats(group)
    assert (stats.executed, stats.errors, stats.shared) == (1, 1, n - 1)
    # An error is never kept for later callers of the run.
    _, (late,), _ = await run_siblings(graph, [ask(("weather", {"city": "atlantis"}))], group=group)
    assert w.executions["atlantis"] == 2
    assert tool_messages(late)[0].status == "error"


async def test_tool_errors_propagate_without_handling() -> None:
    w = Weather()
    graph = react_graph(BatchToolNode([coalesce(w.tool)], handle_tool_errors=False))
    _, results, _ = await run_siblings(graph, [ask(("weather", {"city": "atlantis"}))] * 3)
    assert all(isinstance(r, ValueError) for r in results)


async def test_share_errors_false_each_caller_runs_the_failing_tool() -> None:
    w = Weather()
    w.release.clear()
    coalesced = coalesce(w.tool, share_errors=False)
    policy = coalesce_policy(coalesced)
    live = coalescing(coalesced)
    assert live is not None
    assert policy is not None
    graph = react_graph(BatchToolNode([coalesced], handle_tool_errors=True))
    key = policy.call_key("weather", {"city": "atlantis"})
    run = asyncio.create_task(
        run_siblings(graph, [ask(("weather", {"city": "atlantis"}))] * 3, group="g-noshare")
    )
    for _ in range(10_000):
        if live.coalescer.waiting(key, scope="g-noshare") == 3:
            break
        await asyncio.sleep(0)
    w.release.set()
    _, results, _ = await run
    assert w.executions["atlantis"] == 3
    for result in results:
        check_own_ids(result)


async def test_command_results_are_not_shared() -> None:
    executions = 0

    @tool
    async def remember(fact: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Store a fact in the conversation."""
        nonlocal executions
        executions += 1
        return Command(
            update={"messages": [ToolMessage(f"noted {fact}", tool_call_id=tool_call_id)]}
        )

    graph = react_graph(BatchToolNode([coalesce(remember)]))
    group, results, _ = await run_siblings(graph, [ask(("remember", {"fact": "x"}))] * 4)
    assert executions == 4
    for result in results:
        check_own_ids(result)
        assert tool_messages(result)[0].content == "noted x"
    assert tool_stats(group).executed == 4


async def test_sibling_marked_in_tool_and_admission_order() -> None:
    w = Weather()
    admission = RecordingAdmission()
    graph = react_graph(BatchToolNode([coalesce(w.tool)]))
    _, results, infos = await run_siblings(
        graph, [ask(("weather", {"city": "paris"}))], admission=admission
    )
    check_own_ids(results[0])
    assert w.seen_tools_active == [1]
    assert infos[0].tools_active == 0
    assert admission.events == [("release", 0, None), ("acquire", 0, True)]


async def test_parallel_tool_calls_release_once_and_reacquire_once() -> None:
    w = Weather()
    admission = RecordingAdmission()
    graph = react_graph(BatchToolNode([w.tool]))
    calls = [("weather", {"city": c}) for c in CITIES]
    _, results, infos = await run_siblings(graph, [ask(*calls)], admission=admission)
    check_own_ids(results[0])
    assert len(tool_messages(results[0])) == 3
    assert w.seen_tools_active == [3, 3, 3]  # the three calls run at once, all in-tool
    assert admission.events == [("release", 0, None), ("acquire", 0, True)]
    assert infos[0].tools_active == 0


async def test_works_outside_a_sibling() -> None:
    w = Weather()
    graph = react_graph(BatchToolNode([coalesce(w.tool)]))
    before = tool_stats()
    result = await graph.ainvoke(ask(("weather", {"city": "lima"})))
    check_own_ids(result)
    assert w.seen_tools_active == [-1]
    after = tool_stats()
    assert after.requested - before.requested == 1
    assert after.executed - before.executed == 1


async def test_sync_tool_sees_sibling_and_is_coalesced() -> None:
    executions: list[int | None] = []

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        sibling = current_sibling()
        executions.append(sibling.tools_active if sibling else None)
        return a + b

    graph = react_graph(BatchToolNode([coalesce(add)]))
    _, results, _ = await run_siblings(graph, [ask(("add", {"a": 2, "b": 3}))] * 4)
    assert executions == [1]
    for result in results:
        check_own_ids(result)
        assert tool_messages(result)[0].content == "5"


async def test_user_awrap_tool_call_is_composed() -> None:
    w = Weather()
    seen: list[str] = []

    async def user_wrapper(request: ToolCallRequest, execute: Any) -> Any:
        sibling = current_sibling()
        seen.append(
            f"{request.tool_call['args']['city']}:{sibling.tools_active if sibling else -1}"
        )
        # Rewrite the arguments: coalescing keys on what actually runs.
        call = {**request.tool_call, "args": {"city": "paris"}}
        return await execute(request.override(tool_call=call))

    graph = react_graph(BatchToolNode([coalesce(w.tool)], awrap_tool_call=user_wrapper))
    _, results, _ = await run_siblings(
        graph, [ask(("weather", {"city": c})) for c in ("lima", "tokyo", "paris")]
    )
    assert sorted(seen) == ["lima:1", "paris:1", "tokyo:1"]
    assert w.executions == Counter({"paris": 1})
    for result in results:
        check_own_ids(result)
        assert tool_messages(result)[0].content == "sunny in paris"


async def test_user_sync_wrap_tool_call_is_composed() -> None:
    w = Weather()
    seen: list[str] = []

    def user_wrapper(request: ToolCallRequest, execute: Any) -> Any:
        seen.append(request.tool_call["args"]["city"])
        return execute(request)

    graph = react_graph(BatchToolNode([coalesce(w.tool)], wrap_tool_call=user_wrapper))
    _, results, _ = await run_siblings(graph, [ask(("weather", {"city": "tokyo"}))] * 3)
    assert seen == ["tokyo"] * 3
    assert w.executions == Counter({"tokyo": 1})
    for result in results:
        check_own_ids(result)


def test_sync_invoke_behaves_like_tool_node() -> None:
    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    graph = react_graph_sync(BatchToolNode([coalesce(echo)]))
    result = graph.invoke(ask(("echo", {"text": "hi"})))
    assert tool_messages(result)[0].content == "hi"


def react_graph_sync(tool_node: Any) -> Any:
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition

    llm = ScriptedToolModel()

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tool_node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile()


async def test_injected_state_reaches_unmarked_tool() -> None:
    @tool
    def count_messages(note: str, state: Annotated[dict, InjectedState]) -> str:
        """Count the messages so far."""
        return f"{note}:{len(state['messages'])}"

    graph = react_graph(BatchToolNode([count_messages]))
    _, (result,), _ = await run_siblings(graph, [ask(("count_messages", {"note": "n"}))])
    assert tool_messages(result)[0].content == "n:2"


@pytest.mark.filterwarnings("ignore::langgraph.warnings.LangGraphDeprecatedSinceV10")
async def test_prebuilt_create_react_agent_with_batch_tool_node() -> None:
    from langgraph.prebuilt import create_react_agent

    w = Weather()
    agent = create_react_agent(ScriptedToolModel(), BatchToolNode([coalesce(w.tool)]))
    group, results, _ = await run_siblings(
        agent, [ask(("weather", {"city": CITIES[i % 2]})) for i in range(8)]
    )
    assert sum(w.executions.values()) == 2
    for result in results:
        check_own_ids(result)
    assert tool_stats(group).shared == 6


async def test_create_agent_with_batch_middleware() -> None:
    w = Weather()
    admission = RecordingAdmission()
    agent = create_agent(ScriptedToolModel(), [coalesce(w.tool)], middleware=[BatchMiddleware()])
    n = 9
    group, results, infos = await run_siblings(
        agent, [ask(("weather", {"city": CITIES[i % 3]})) for i in range(n)], admission=admission
    )
    assert sum(w.executions.values()) == 3
    for i, result in enumerate(results):
        check_own_ids(result)
        assert tool_messages(result)[0].content == f"sunny in {CITIES[i % 3]}"
    assert set(w.seen_tools_active) == {1}
    assert all(info.tools_active == 0 for info in infos)
    for i in range(n):
        mine = [e for e in admission.events if e[1] == i]
        assert mine == [("release", i, None), ("acquire", i, True)]
    stats = tool_stats(group)
    assert (stats.requested, stats.executed, stats.shared) == (n, 3, n - 3)


async def test_create_agent_middleware_errors_and_commands() -> None:
    executions = Counter[str]()

    @tool
    async def remember(fact: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Store a fact."""
        executions["remember"] += 1
        return Command(update={"messages": [ToolMessage(f"ok {fact}", tool_call_id=tool_call_id)]})

    release = asyncio.Event()

    @tool
    async def explode(x: int) -> str:
        """Always fails."""
        executions["explode"] += 1
        await release.wait()
        raise ValueError("kaboom")

    agent = create_agent(
        ScriptedToolModel(),
        [coalesce(remember), coalesce(explode)],
        middleware=[BatchMiddleware()],
    )
    _, results, _ = await run_siblings(agent, [ask(("remember", {"fact": "a"}))] * 3)
    assert executions["remember"] == 3
    for result in results:
        check_own_ids(result)
    policy = coalesce_policy(agent.nodes["tools"].bound.tools_by_name["explode"])
    live = coalescing(agent.nodes["tools"].bound.tools_by_name["explode"])
    assert live is not None
    assert policy is not None
    key = policy.call_key("explode", {"x": 1})
    run = asyncio.create_task(
        run_siblings(agent, [ask(("explode", {"x": 1}))] * 3, group="g-explode")
    )
    for _ in range(10_000):
        if live.coalescer.waiting(key, scope="g-explode") == 3:
            break
        await asyncio.sleep(0)
    release.set()
    _, results, _ = await run
    assert all(isinstance(r, ValueError) for r in results)  # one error, shared
    assert executions["explode"] == 1


def test_create_agent_with_batch_middleware_sync_invoke() -> None:
    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    agent = create_agent(ScriptedToolModel(), [coalesce(echo)], middleware=[BatchMiddleware()])
    result = agent.invoke(ask(("echo", {"text": "yo"})))
    assert tool_messages(result)[0].content == "yo"


async def test_plain_tool_node_unchanged_for_reference() -> None:
    """The same graph with a plain ToolNode runs every call (the baseline we beat)."""
    w = Weather()
    graph = react_graph(ToolNode([coalesce(w.tool)]))
    await run_siblings(graph, [ask(("weather", {"city": "paris"}))] * 4)
    assert w.executions["paris"] == 4


async def test_shared_result_reused_twice_in_one_conversation_keeps_both_messages() -> None:
    """A stored result reused later must not carry the message id LangGraph gave the
    first copy (add_messages would then replace the earlier message)."""
    w = Weather()
    graph = react_graph(BatchToolNode([coalesce(w.tool)]))
    with sibling_scope(SiblingInfo(group="g-twice", index=0)):
        first = await graph.ainvoke(ask(("weather", {"city": "paris"})))
        again = first["messages"] + ask(("weather", {"city": "paris"}))["messages"]
        second = await graph.ainvoke({"messages": again})
    assert w.executions["paris"] == 1
    msgs = tool_messages(second)
    assert len(msgs) == 2
    assert len({m.id for m in msgs}) == 2
    check_own_ids(second)
