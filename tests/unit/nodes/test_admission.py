from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph

from langgraph_batch._context import SiblingInfo, current_sibling
from langgraph_batch.nodes import fan_out
from langgraph_batch.nodes._admission import SiblingAdmission
from langgraph_batch.nodes._spec import check_gate_options
from langgraph_batch.scheduler import ledger_of
from langgraph_batch.tools import BatchToolNode
from tests.fakes.chat_models import ScriptedChatModel
from tests.fakes.fan_out import FakeQueue, parent_graph
from tests.unit.nodes.test_fan_out import hand_built_agent


def sib(i: int) -> SiblingInfo:
    return SiblingInfo(group="g", index=i)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_bad_max_active() -> None:
    with pytest.raises(ValueError, match="max_active"):
        check_gate_options(max_active=0)


async def test_unlimited_admits_everyone() -> None:
    gate = SiblingAdmission()
    for i in range(100):
        await gate.acquire(sib(i), returning=False)
    assert gate.active == 100
    assert gate.stats().peak_active == 100


async def test_cap_and_release_wake_the_next_waiter() -> None:
    gate = SiblingAdmission(max_active=2)
    a, b, c = sib(0), sib(1), sib(2)
    await gate.acquire(a, returning=False)
    await gate.acquire(b, returning=False)
    waiter = asyncio.create_task(gate.acquire(c, returning=False))
    await settle()
    assert not waiter.done()
    assert gate.stats().waiting_fresh == 1
    gate.release(a)
    await asyncio.wait_for(waiter, 10)
    assert gate.holds(c)
    assert not gate.holds(a)
    assert gate.active == 2


async def test_returning_siblings_go_before_fresh_ones_fifo_within_each() -> None:
    gate = SiblingAdmission(max_active=1)
    holder = sib(0)
    await gate.acquire(holder, returning=False)
    order: list[int] = []

    async def wait(s: SiblingInfo, returning: bool) -> None:
        await gate.acquire(s, returning=returning)
        order.append(s.index)

    tasks = [
        asyncio.create_task(wait(sib(1), False)),
        asyncio.create_task(wait(sib(2), False)),
    ]
    await settle()
    tasks += [
        asyncio.create_task(wait(sib(3), True)),
        asyncio.create_task(wait(sib(4), True)),
    ]
    await settle()
    assert gate.stats().waiting_returning == 2
    current = holder
    for _ in range(4):
        gate.release(current)
        await settle()
        current = sib(order[-1])
    await asyncio.gather(*tasks)
    assert order == [3, 4, 1, 2]


async def test_fresh_arrival_does_not_overtake_a_returning_waiter() -> None:
    gate = SiblingAdmission(max_active=1)
    await gate.acquire(sib(0), returning=False)
    back = asyncio.create_task(gate.acquire(sib(1), returning=True))
    await settle()
    gate.release(sib(0))
    # the place went to the returning waiter, not to a newcomer
    fresh = asyncio.create_task(gate.acquire(sib(2), returning=False))
    await settle()
    assert back.done()
    assert not fresh.done()
    gate.release(sib(1))
    await asyncio.wait_for(fresh, 10)


async def test_cancelled_waiter_is_withdrawn() -> None:
    gate = SiblingAdmission(max_active=1)
    await gate.acquire(sib(0), returning=False)
    waiter = asyncio.create_task(gate.acquire(sib(1), returning=False))
    later = asyncio.create_task(gate.acquire(sib(2), returning=False))
    await settle()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert gate.stats().waiting_fresh == 1
    gate.release(sib(0))
    await asyncio.wait_for(later, 10)
    assert gate.holds(sib(2))
    assert not gate.holds(sib(1))


async def test_place_granted_while_cancelled_is_passed_on() -> None:
    gate = SiblingAdmission(max_active=1)
    await gate.acquire(sib(0), returning=False)
    waiter = asyncio.create_task(gate.acquire(sib(1), returning=False))
    later = asyncio.create_task(gate.acquire(sib(2), returning=False))
    await settle()
    gate.release(sib(0))  # grants sib(1): its future is resolved...
    waiter.cancel()  # ...but the task is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.wait_for(later, 10)
    assert gate.holds(sib(2))
    assert gate.active == 1


async def test_release_is_idempotent_and_acquire_while_holding_is_noop() -> None:
    gate = SiblingAdmission(max_active=1)
    s = sib(0)
    await gate.acquire(s, returning=False)
    await asyncio.wait_for(gate.acquire(s, returning=True), 10)
    gate.release(s)
    gate.release(s)
    assert gate.active == 0


async def test_tool_enter_and_exit_move_the_place() -> None:
    gate = SiblingAdmission(max_active=1)
    a = SiblingInfo(group="g", index=0, admission=gate)
    await gate.acquire(a, returning=False)
    await a.tool_enter()
    assert gate.active == 0
    b = SiblingInfo(group="g", index=1, admission=gate)
    await asyncio.wait_for(gate.acquire(b, returning=False), 10)
    back = asyncio.create_task(a.tool_exit())
    await settle()
    assert not back.done()
    gate.release(b)
    await asyncio.wait_for(back, 10)
    assert gate.holds(a)


def msg_input(item: Any, index: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(str(item))]}


async def test_fan_out_caps_active_siblings() -> None:
    queue = FakeQueue()
    queue.gate = asyncio.Event()
    queue.expect_waiting = 3
    agent = hand_built_agent(ScriptedChatModel(queue=queue, tool_turns=0), [])
    node = fan_out(agent, items="xs", into="out", make_input=msg_input, max_active=3)
    run = asyncio.create_task(parent_graph(node).ainvoke({"xs": [f"k{i}" for i in range(12)]}))
    await asyncio.wait_for(queue.all_waiting.wait(), 30)
    await settle()
    assert queue.waiting == 3  # the other 9 wait at the gate, not in the model
    queue.gate.set()
    out = await asyncio.wait_for(run, 30)
    assert len(out["out"]) == 12
    assert queue.calls == 12


async def test_sibling_in_a_tool_releases_its_place() -> None:
    """max_active=1: sibling 0's tool waits for sibling 1's model call; no deadlock."""
    other_called = asyncio.Event()
    queue = FakeQueue()
    active_in_tool: list[bool] = []

    class Model(ScriptedChatModel):
        async def _agenerate(self, messages: Any, *a: Any, **kw: Any) -> Any:
            s = current_sibling()
            assert s is not None
            assert s.admission is not None
            assert s.admission.holds(s)  # a model call always holds a place
            if s.index == 1:
                other_called.set()
            return await super()._agenerate(messages, *a, **kw)

    @tool
    async def lookup(key: str) -> str:
        """Look a key up."""
        s = current_sibling()
        assert s is not None
        assert s.admission is not None
        active_in_tool.append(s.admission.holds(s))
        if s.index == 0:
            await other_called.wait()
        return f"v:{key}"

    async def call_model(state: Any) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    from langgraph.prebuilt import tools_condition

    from tests.unit.nodes.test_fan_out import AgentState

    model = Model(queue=queue)
    b = StateGraph(AgentState)
    b.add_node("agent", call_model)
    b.add_node("tools", BatchToolNode([lookup]))
    b.add_edge(START, "agent")
    b.add_conditional_edges("agent", tools_condition)
    b.add_edge("tools", "agent")
    agent = b.compile()
    node = fan_out(
        agent,
        items="xs",
        into="out",
        make_input=msg_input,
        max_active=1,
        result=lambda f: f["messages"][-1].content,
    )
    out = await asyncio.wait_for(parent_graph(node).ainvoke({"xs": ["a", "b"]}), 30)
    assert out["out"] == ["answer(a):v:a", "answer(b):v:b"]
    assert active_in_tool == [False, False]  # no sibling holds a place while in its tool


class FakeMetrics:
    kv_capacity_tokens = 40_000


class FakeScheduler:
    latest_metrics = FakeMetrics()

    async def kv_capacity(self) -> int:
        return FakeMetrics.kv_capacity_tokens

    def stats(self) -> dict[str, Any]:
        return {"queued": 4, "in_flight": 7, "nested": {"x": 1}}


async def test_started_event_reports_the_cap_and_the_schedulers_stats() -> None:
    events: list[dict[str, Any]] = []
    agent = hand_built_agent(ScriptedChatModel(tool_turns=0), [])
    node = fan_out(
        agent,
        items="xs",
        into="out",
        make_input=msg_input,
        scheduler=FakeScheduler(),
        sibling_tokens=10_000,
    )
    async for _ns, _mode, data in parent_graph(node).astream(
        {"xs": ["a", "b"]}, stream_mode=["custom"], subgraphs=True
    ):
        events.append(data)
    started = next(e for e in events if e["event"] == "started")
    assert started["max_active"] is None  # no explicit cap: the KV budget admits
    assert started["stats"] == {"queued": 4, "in_flight": 7}
    no_sched = fan_out(agent, items="xs", into="out", make_input=msg_input)
    assert no_sched.spec.scheduler is None
    assert await ledger_of(None) is None  # no scheduler: no KV budget
