from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import START, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langgraph_batch._context import SiblingInfo, current_sibling
from langgraph_batch.errors import BackendServerError, SiblingFailedError
from langgraph_batch.nodes import SiblingError, fan_out
from tests.fakes.chat_models import ScriptedChatModel
from tests.fakes.fan_out import FakeQueue, number_graph, parent_graph


async def test_results_in_input_order_with_make_input_and_result() -> None:
    node = fan_out(
        number_graph(),
        items="xs",
        into="out",
        make_input=lambda item, i: {"x": item},
        result=lambda final: final["y"],
    )
    out = await parent_graph(node).ainvoke({"xs": [5, 3, 9, 0, 7]})
    assert out["out"] == [51, 31, 91, 1, 71]


async def test_default_input_is_the_item_and_default_result_the_final_state() -> None:
    node = fan_out(number_graph(), items=lambda s: [{"x": x} for x in s["xs"]], into="out")
    out = await parent_graph(node).ainvoke({"xs": [2, 4]})
    assert [final["y"] for final in out["out"]] == [21, 41]
    assert out["out"][0]["x"] == 2


async def test_empty_items_give_empty_results() -> None:
    out = await parent_graph(fan_out(number_graph(), items="xs", into="out")).ainvoke({"xs": []})
    assert out["out"] == []


async def test_non_mapping_items_without_make_input_fail_clearly() -> None:
    node = fan_out(number_graph(), items="xs", into="out")
    with pytest.raises(TypeError, match="make_input"):
        await parent_graph(node).ainvoke({"xs": [1, 2]})


async def test_missing_items_key_fails_clearly() -> None:
    node = fan_out(number_graph(), items="nope", into="out")
    with pytest.raises(KeyError, match="no key 'nope'"):
        await parent_graph(node).ainvoke({"xs": [1]})


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"into": ""}, ValueError),
        ({"on_error": "ignore"}, ValueError),
        ({"max_active": 0}, ValueError),
        ({"sibling_tokens": 0}, ValueError),
        ({"items": 3}, TypeError),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs: dict[str, Any], exc: type[Exception]) -> None:
    args: dict[str, Any] = {"items": "xs", "into": "out", **kwargs}
    with pytest.raises(exc):
        fan_out(number_graph(), **args)


def test_repr_names_the_node_and_subgraph() -> None:
    node = fan_out(number_graph(), items="xs", into="out", name="review")
    assert repr(node) == "FanOutNode(name='review', subgraph='numbers', into='out')"
    assert node.into == "out"


def test_subgraph_without_ainvoke_is_rejected() -> None:
    with pytest.raises(TypeError, match="ainvoke"):
        fan_out(object(), items="xs", into="out")


async def test_sibling_identity_reaches_async_and_sync_nodes_and_config() -> None:
    node = fan_out(number_graph(), items="xs", into="out", make_input=lambda x, i: {"x": x})
    out = await parent_graph(node).ainvoke({"xs": [10, 11, 12]})
    groups = set()
    for i, final in enumerate(out["out"]):
        first, second = final["trace"]
        assert first["index"] == i
        assert first["cfg_index"] == i
        assert first["total"] == 3
        assert second["sync_index"] == i
        groups.add(first["group"])
    assert len(groups) == 1
    (group,) = groups
    assert isinstance(group, str)
    assert len(group) == 8
    assert current_sibling() is None


async def test_each_invocation_gets_a_fresh_group() -> None:
    node = fan_out(number_graph(), items="xs", into="out", make_input=lambda x, i: {"x": x})
    g = parent_graph(node)
    a = await g.ainvoke({"xs": [1]})
    b = await g.ainvoke({"xs": [1]})
    assert a["out"][0]["trace"][0]["group"] != b["out"][0]["trace"][0]["group"]


async def test_failing_sibling_becomes_sibling_error_in_place() -> None:
    node = fan_out(
        number_graph(fail_on={7}),
        items="xs",
        into="out",
        make_input=lambda x, i: {"x": x},
        result=lambda f: f["y"],
    )
    xs = list(range(20))
    out = await parent_graph(node).ainvoke({"xs": xs})
    res = out["out"]
    assert len(res) == 20
    err = res[7]
    assert isinstance(err, SiblingError)
    assert err.index == 7
    assert err.item == 7
    assert err.error_type == "ValueError"
    assert err.message == "bad x 7"
    assert err.retryable is False
    assert err.traceback is not None
    assert "bad x 7" in err.traceback
    assert [r for i, r in enumerate(res) if i != 7] == [x * 10 + 1 for x in xs if x != 7]


async def test_retryable_flag_comes_from_the_exception() -> None:
    exc = BackendServerError("HTTP 503 from server")
    err = SiblingError.from_exception(exc, index=3, item={"a": 1})
    assert err.retryable is True
    assert err.error_type == "BackendServerError"
    assert SiblingError.from_exception(ConnectionError("x"), index=0, item=None).retryable


async def test_on_error_raise_waits_for_everyone_and_attaches_all_errors() -> None:
    finished: list[int] = []

    def record(final: dict[str, Any]) -> int:
        finished.append(final["x"])
        return int(final["y"])

    node = fan_out(
        number_graph(fail_on={2, 5}),
        items="xs",
        into="out",
        make_input=lambda x, i: {"x": x},
        result=record,
        on_error="raise",
    )
    with pytest.raises(SiblingFailedError) as info:
        await parent_graph(node).ainvoke({"xs": list(range(8))})
    exc = info.value
    assert sorted(finished) == [0, 1, 3, 4, 6, 7]
    assert [e.index for e in exc.errors] == [2, 5]
    assert len(exc.results) == 8
    assert exc.results[3] == 31
    assert "2 of 8 siblings failed" in str(exc)


def test_sibling_error_round_trips_through_the_checkpoint_serializer() -> None:
    err = SiblingError(index=1, item={"doc": "a"}, error_type="ValueError", message="m")
    serde = JsonPlusSerializer()
    assert serde.loads_typed(serde.dumps_typed([err])) == [err]
    strict = JsonPlusSerializer(allowed_msgpack_modules=None)
    back = strict.loads_typed(strict.dumps_typed(err))
    assert SiblingError.from_dict(back) == err
    allowed = JsonPlusSerializer(
        allowed_msgpack_modules=[("langgraph_batch.nodes.fan_out", "SiblingError")]
    )
    assert allowed.loads_typed(allowed.dumps_typed(err)) == err


async def test_works_with_a_checkpointer_and_state_is_saved() -> None:
    node = fan_out(
        number_graph(fail_on={1}),
        items="xs",
        into="out",
        make_input=lambda x, i: {"x": x},
        result=lambda f: f["y"],
    )
    g = parent_graph(node, checkpointer=InMemorySaver())
    cfg = {"configurable": {"thread_id": "t1"}}
    out = await g.ainvoke({"xs": [1, 2, 3]}, cfg)
    assert out["out"][0].index == 0
    assert out["out"][0].item == 1
    snap = await g.aget_state(cfg)
    assert snap.values["out"][1:] == [21, 31]
    assert isinstance(snap.values["out"][0], SiblingError)


def test_xray_shows_the_sibling_subgraph() -> None:
    # Sync on purpose: xray reads node sources (inspect), which is file I/O that
    # blockbuster rightly forbids inside a running event loop.
    node = fan_out(number_graph(), items="xs", into="out", name="review")
    g = parent_graph(node)
    drawn = g.get_graph(xray=True)
    assert {"fan:sibling:times_ten", "fan:sibling:plus_one"} <= set(drawn.nodes)
    assert "fan" in g.get_graph().nodes


async def test_nested_fan_out() -> None:
    class Mid(TypedDict, total=False):
        xs: list[int]
        out: list[Any]
        outer_index: int

    inner = fan_out(
        number_graph(),
        items="xs",
        into="out",
        make_input=lambda x, i: {"x": x},
        result=lambda f: (f["y"], f["trace"][0]["index"], f["trace"][0]["group"]),
    )
    mb = StateGraph(Mid)
    mb.add_node("inner", inner)
    mb.add_edge(START, "inner")
    mid = mb.compile(name="mid")
    outer = fan_out(
        mid,
        items="xs",
        into="out",
        make_input=lambda x, i: {"xs": [x, x + 1]},
        result=lambda f: f["out"],
    )
    out = await parent_graph(outer).ainvoke({"xs": [1, 5]})
    res = out["out"]
    assert [[y for y, _, _ in r] for r in res] == [[11, 21], [51, 61]]
    assert [[i for _, i, _ in r] for r in res] == [[0, 1], [0, 1]]
    inner_groups = {g for r in res for _, _, g in r}
    assert len(inner_groups) == 2  # one inner fan_out run per outer sibling


class AgentState(TypedDict):
    messages: Annotated[list[Any], operator.add]


def hand_built_agent(model: Any, tools: list[Any]) -> Any:
    async def call_model(state: AgentState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    b = StateGraph(AgentState)
    b.add_node("agent", call_model)
    b.add_node("tools", ToolNode(tools))
    b.add_edge(START, "agent")
    b.add_conditional_edges("agent", tools_condition)
    b.add_edge("tools", "agent")
    return b.compile(name="agent")


def make_lookup(seen: list[Any]) -> Any:
    @tool
    async def lookup(key: str) -> str:
        """Look a key up."""
        sib = current_sibling()
        seen.append(None if sib is None else (sib.index, sib.in_tool))
        return f"v:{key}"

    return lookup


def msg_input(item: Any, index: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(str(item))]}


async def test_hand_built_agent_siblings_see_their_identity_in_model_and_tools() -> None:
    queue = FakeQueue()
    seen: list[Any] = []
    agent = hand_built_agent(ScriptedChatModel(queue=queue), [make_lookup(seen)])
    node = fan_out(
        agent,
        items="xs",
        into="out",
        make_input=msg_input,
        result=lambda f: f["messages"][-1].content,
    )
    out = await parent_graph(node).ainvoke({"xs": ["a", "b", "c", "boom"]})
    assert out["out"][:3] == ["answer(a):v:a", "answer(b):v:b", "answer(c):v:c"]
    assert isinstance(out["out"][3], SiblingError)
    assert "model exploded" in out["out"][3].message
    # 2 model calls for each good sibling, 1 for the failing one; each saw its identity.
    assert queue.calls == 7
    by_index: dict[int, list[int]] = {}
    for s in queue.seen:
        group, index, total, turn = s["sibling"]
        assert s["cfg_index"] == index
        assert s["cfg_group"] == group
        assert total == 4
        by_index.setdefault(index, []).append(turn)
    assert by_index == {0: [0, 1], 1: [0, 1], 2: [0, 1], 3: [0]}
    assert sorted(i for i, _ in seen) == [0, 1, 2]


async def test_create_agent_subgraph() -> None:
    from langchain.agents import create_agent

    queue = FakeQueue()
    seen: list[Any] = []
    agent = create_agent(ScriptedChatModel(queue=queue), tools=[make_lookup(seen)])
    node = fan_out(
        agent,
        items="xs",
        into="out",
        make_input=msg_input,
        result=lambda f: f["messages"][-1].content,
    )
    out = await parent_graph(node).ainvoke({"xs": [f"k{i}" for i in range(6)]})
    assert out["out"] == [f"answer(k{i}):v:k{i}" for i in range(6)]
    assert sorted(i for i, _ in seen) == list(range(6))


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_create_react_agent_subgraph() -> None:
    from langgraph.prebuilt import create_react_agent

    seen: list[Any] = []
    agent = create_react_agent(ScriptedChatModel(), tools=[make_lookup(seen)])
    node = fan_out(
        agent,
        items="xs",
        into="out",
        make_input=msg_input,
        result=lambda f: f["messages"][-1].content,
    )
    out = await parent_graph(node).ainvoke({"xs": ["p", "q"]})
    assert out["out"] == ["answer(p):v:p", "answer(q):v:q"]


async def test_cancelling_the_run_cancels_every_sibling() -> None:
    queue = FakeQueue()
    queue.gate = asyncio.Event()
    queue.expect_waiting = 50
    agent = hand_built_agent(ScriptedChatModel(queue=queue), [make_lookup([])])
    node = fan_out(agent, items="xs", into="out", make_input=msg_input)
    g = parent_graph(node)
    before = asyncio.all_tasks()
    run = asyncio.create_task(g.ainvoke({"xs": [f"k{i}" for i in range(50)]}))
    await asyncio.wait_for(queue.all_waiting.wait(), 30)
    spawned = asyncio.all_tasks() - before - {run}
    assert len(spawned) >= 50
    assert queue.waiting == 50
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert queue.waiting == 0
    # every task the run spawned is finished, none is left running
    await asyncio.sleep(0)
    assert [t for t in spawned if not t.done()] == []
    leftover = asyncio.all_tasks() - before
    assert leftover == {asyncio.current_task()} or leftover == set()


async def test_interrupt_inside_a_sibling_pauses_and_resumes_only_that_sibling() -> None:
    from langgraph.types import Command, interrupt

    class S(TypedDict, total=False):
        x: int
        y: Any

    calls: list[int] = []

    def ask(state: S) -> dict[str, Any]:
        calls.append(state["x"])
        if state["x"] == 2:
            return {"y": f"approved:{interrupt('need approval')}"}
        return {"y": state["x"]}

    b = StateGraph(S)
    b.add_node("ask", ask)
    b.add_edge(START, "ask")
    node = fan_out(
        b.compile(),
        items="xs",
        into="out",
        make_input=lambda x, i: {"x": x},
        result=lambda f: f["y"],
    )
    g = parent_graph(node, checkpointer=InMemorySaver())
    cfg: Any = {"configurable": {"thread_id": "hitl"}}
    first = await g.ainvoke({"xs": [0, 1, 2, 3]}, cfg)
    assert [i.value for i in first["__interrupt__"]] == ["need approval"]
    assert "out" not in first
    resumed = await g.ainvoke(Command(resume="yes"), cfg)
    assert resumed["out"] == [0, 1, "approved:yes", 3]
    assert sorted(calls) == [0, 1, 2, 2, 3]  # only the interrupted sibling ran again


async def test_siblings_see_how_many_of_their_run_are_left() -> None:
    """`SiblingInfo.left` reads the run's live counter (the scheduler sizes its waves with it)."""
    seen: list[int] = []
    counters: list[Any] = []
    all_started = asyncio.Event()
    release = asyncio.Event()

    class S(TypedDict, total=False):
        x: int

    async def work(state: S) -> S:
        info = current_sibling()
        assert info is not None
        assert info.left is not None
        counters.append(info.left)
        seen.append(info.siblings_left)
        if len(seen) == 3:
            all_started.set()
        if state["x"] != 0:
            await release.wait()
        return {"x": state["x"]}

    b = StateGraph(S)
    b.add_node("work", work)
    b.add_edge(START, "work")
    node = fan_out(b.compile(), items="xs", into="out", make_input=lambda item, i: {"x": item})
    run = asyncio.create_task(parent_graph(node).ainvoke({"xs": [0, 1, 2]}))
    await all_started.wait()
    assert max(seen) == 3
    assert counters[0]() in (2, 3)  # sibling 0 may have finished already
    release.set()
    await run
    assert [c() for c in counters] == [0, 0, 0]  # read live: all finished now
    assert SiblingInfo(group="g", index=0).siblings_left == 0  # outside a fan_out: unknown
