"""The admission gate's resident-KV budget: fresh siblings wait while in-tool ones hold KV."""

from __future__ import annotations

import asyncio
import importlib

import pytest

from langgraph_batch._context import SiblingInfo
from langgraph_batch._request import record_context as _record_context
from langgraph_batch.backends.base import ChatResponse, Usage
from langgraph_batch.nodes._admission import SiblingAdmission
from langgraph_batch.scheduler._capacity import KVLedger


def sib(i: int, context: int = 0) -> SiblingInfo:
    return SiblingInfo(group="g", index=i, context_tokens=context)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_bad_budget_arguments() -> None:
    with pytest.raises(ValueError, match="kv_capacity"):
        SiblingAdmission(kv_capacity=0)
    with pytest.raises(ValueError, match="kv_headroom"):
        SiblingAdmission(kv_capacity=100, kv_headroom=0.0)
    with pytest.raises(ValueError, match="sibling_tokens"):
        SiblingAdmission(sibling_tokens=0)


async def test_in_tool_siblings_hold_budget_and_block_fresh_ones() -> None:
    # Budget 1000 tokens, estimate 300: three residents fit (900), a fourth does not.
    gate = SiblingAdmission(max_active=10, kv_capacity=1000, kv_headroom=1.0, sibling_tokens=300)
    sibs = [sib(i) for i in range(4)]
    for s in sibs[:3]:
        await gate.acquire(s, returning=False)
        s.admission = gate
        await s.tool_enter()  # releases the active place, KV stays resident
    assert gate.active == 0
    assert gate.stats().resident == 3
    assert gate.resident_tokens() == 900
    fresh = asyncio.create_task(gate.acquire(sibs[3], returning=False))
    await settle()
    assert not fresh.done()  # active places are free, but the KV budget is not
    assert gate.stats().waiting_fresh == 1
    # Returning siblings pass although the budget is full.
    await asyncio.wait_for(sibs[0].tool_exit(), 10)
    assert gate.holds(sibs[0])
    await settle()
    assert not fresh.done()
    # Finishing one frees its tokens: the fresh sibling gets in.
    gate.finish(sibs[0])
    await asyncio.wait_for(fresh, 10)
    assert gate.holds(sibs[3])
    assert gate.stats().resident == 3


async def test_resident_tokens_use_the_larger_of_context_and_estimate() -> None:
    gate = SiblingAdmission(kv_capacity=10_000, kv_headroom=1.0, sibling_tokens=1000)
    small, big = sib(0, context=200), sib(1, context=4000)
    await gate.acquire(small, returning=False)
    await gate.acquire(big, returning=False)
    assert gate.resident_tokens() == 1000 + 4000
    big.context_tokens = 5000  # grows after another LLM call
    assert gate.stats().resident_tokens == 6000
    # 6000 + 1000 fits 10_000; after that, 7000 + 1000 fits; 8000 + 1000 fits; 9000 + 1000 fits.
    for i in range(2, 6):
        await gate.acquire(sib(i), returning=False)
    blocked = asyncio.create_task(gate.acquire(sib(6), returning=False))
    await settle()
    assert not blocked.done()
    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    assert gate.stats().waiting_fresh == 0


async def test_estimate_is_learned_from_finished_siblings_and_sizes_max_active() -> None:
    gate = SiblingAdmission(kv_capacity=40_000, kv_headroom=1.0, sibling_tokens=4000)
    assert gate.sibling_estimate == 4000
    assert gate.max_active == 10
    finished = [sib(i) for i in range(10)]
    for s in finished:
        await gate.acquire(s, returning=False)
    for i, s in enumerate(finished):
        s.context_tokens = 1000 + 100 * i  # 1000 .. 1900
        gate.finish(s)
    # p90 of ten observations: the 9th smallest.
    assert gate.sibling_estimate == 1800
    assert gate.max_active == 10  # smaller contexts never raise the announced cap
    assert gate.stats().resident == 0
    # A sibling that failed before any LLM call teaches nothing.
    failed = sib(99)
    await gate.acquire(failed, returning=False)
    gate.finish(failed)
    assert gate.sibling_estimate == 1800
    # Huge observations raise the estimate, never below one place.
    tiny = SiblingAdmission(kv_capacity=100, sibling_tokens=10)
    huge = sib(0)
    await tiny.acquire(huge, returning=False)
    huge.context_tokens = 5000
    tiny.finish(huge)
    assert tiny.sibling_estimate == 5000
    assert tiny.max_active == 1


async def test_explicit_max_active_is_not_changed_by_estimates() -> None:
    gate = SiblingAdmission(max_active=3, kv_capacity=1_000_000, sibling_tokens=500_000)
    s = sib(0)
    await gate.acquire(s, returning=False)
    s.context_tokens = 100
    gate.finish(s)
    assert gate.sibling_estimate == 100
    assert gate.max_active == 3  # not 1_000_000 // 100
    for i in range(1, 4):
        await gate.acquire(sib(i), returning=False)
    blocked = asyncio.create_task(gate.acquire(sib(4), returning=False))
    await settle()
    assert not blocked.done()  # max_active still caps actives, the budget has room
    gate.finish(sib(1))
    await asyncio.wait_for(blocked, 10)
    assert gate.active == 3


async def test_returning_sibling_respects_max_active_but_not_budget() -> None:
    gate = SiblingAdmission(max_active=1, kv_capacity=1000, kv_headroom=1.0, sibling_tokens=400)
    a, b, c = sib(0), sib(1), sib(2)
    await gate.acquire(a, returning=False)
    gate.release(a)  # a enters a tool: 400 tokens stay resident
    await gate.acquire(b, returning=False)  # 800 <= 1000
    gate.release(b)
    a.context_tokens = b.context_tokens = 700  # both grew: 1400 resident, over budget
    await asyncio.wait_for(gate.acquire(a, returning=True), 10)  # budget does not apply
    back_b = asyncio.create_task(gate.acquire(b, returning=True))
    fresh_c = asyncio.create_task(gate.acquire(c, returning=False))
    await settle()
    assert not back_b.done()  # max_active=1 still applies to returning siblings
    assert not fresh_c.done()
    gate.release(a)  # a enters another tool: the place goes to b, not to fresh c
    await asyncio.wait_for(back_b, 10)
    assert gate.holds(b)
    assert not fresh_c.done()
    gate.finish(a)
    gate.finish(b)  # both done: 0 resident, c fits
    await asyncio.wait_for(fresh_c, 10)
    assert gate.holds(c)


async def test_no_deadlock_when_one_sibling_alone_exceeds_budget() -> None:
    gate = SiblingAdmission(kv_capacity=1000, kv_headroom=1.0, sibling_tokens=5000)
    first, second = sib(0), sib(1)
    await asyncio.wait_for(gate.acquire(first, returning=False), 10)  # nothing resident: admitted
    assert gate.holds(first)
    waiting = asyncio.create_task(gate.acquire(second, returning=False))
    await settle()
    assert not waiting.done()
    gate.finish(first)
    await asyncio.wait_for(waiting, 10)
    assert gate.holds(second)


async def test_gate_without_capacity_has_no_budget() -> None:
    gate = SiblingAdmission(max_active=None, sibling_tokens=10**6)
    for i in range(50):
        await gate.acquire(sib(i, context=10**6), returning=False)
    assert gate.active == 50
    assert gate.kv_budget is None
    assert gate.max_active is None


def test_chat_model_records_the_siblings_context_size() -> None:
    s = sib(0)
    _record_context(
        s, ChatResponse(id="x", model="m", usage=Usage(prompt_tokens=1500, completion_tokens=40))
    )
    assert s.context_tokens == 1540
    _record_context(s, ChatResponse(id="y", model="m", usage=None))
    assert s.context_tokens == 1540  # no usage reported: keep the last known size


def test_the_shared_prefix_seen_on_the_first_call_is_not_counted_per_sibling() -> None:
    s = sib(0)
    s.turn = 1  # BatchedChatModel increments the turn before recording
    first = Usage(prompt_tokens=2548, completion_tokens=40, cached_tokens=2048)
    _record_context(s, ChatResponse(id="x", model="m", usage=first))
    assert (s.shared_tokens, s.context_tokens) == (2048, 540)
    # Later turns hit the sibling's own cached context too: only turn 1 defines the share.
    s.turn = 2
    second = Usage(prompt_tokens=2700, completion_tokens=200, cached_tokens=2588)
    _record_context(s, ChatResponse(id="y", model="m", usage=second))
    assert (s.shared_tokens, s.context_tokens) == (2048, 852)


async def test_estimate_before_any_finish_leaves_out_the_shared_prefix() -> None:
    # 100 siblings of a 2048-token shared prompt and ~600 own tokens must all fit a
    # 374k budget once the share is known, though 100 x 4096 would not.
    gate = SiblingAdmission(kv_capacity=440_000, kv_headroom=0.85, sibling_tokens=4096)
    sibs = [sib(i) for i in range(100)]
    for s in sibs[:91]:
        await asyncio.wait_for(gate.acquire(s, returning=False), 10)
    late = [asyncio.create_task(gate.acquire(s, returning=False)) for s in sibs[91:]]
    await settle()
    assert not any(t.done() for t in late)  # 91 x 4096 fills the budget
    for s in sibs[:91]:
        s.shared_tokens, s.context_tokens = 2048, 600
    assert gate.sibling_estimate == 4096 - 2048
    gate.release(sibs[0])  # any wake-up lets the gate re-check the budget
    await asyncio.wait_for(asyncio.gather(*late), 10)
    assert gate.stats().resident == 100


async def test_sizing_admits_one_fresh_sibling_until_the_capacity_is_known() -> None:
    gate = SiblingAdmission(sibling_tokens=100, kv_headroom=1.0)
    gate.start_sizing()
    first = sib(0)
    await gate.acquire(first, returning=False)  # nothing resident: the probe goes in
    second = asyncio.create_task(gate.acquire(sib(1), returning=False))
    third = asyncio.create_task(gate.acquire(sib(2), returning=False))
    await settle()
    assert not second.done()
    assert gate.sizing
    # Capacity 250 at headroom 1.0: the probe (100) and one more (200) fit, not two more.
    gate.set_kv_ledger(KVLedger(250))
    await asyncio.wait_for(second, 10)
    await settle()
    assert not third.done()
    assert gate.max_active == 2
    assert gate.kv_budget == 250
    gate.finish(first)
    await asyncio.wait_for(third, 10)


async def test_sizing_ends_unbudgeted_when_the_probe_finishes_first() -> None:
    gate = SiblingAdmission()
    gate.start_sizing()
    probe = sib(0)
    await gate.acquire(probe, returning=False)
    waiters = [asyncio.create_task(gate.acquire(sib(i), returning=False)) for i in range(1, 5)]
    await settle()
    assert not any(w.done() for w in waiters)
    gate.finish(probe)  # e.g. a subgraph without a model: no capacity will come
    await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert gate.active == 4
    assert not gate.sizing


async def test_fan_out_finds_the_scheduler_its_siblings_create(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    from langgraph_batch.nodes import fan_out

    # Where fan_out looks for the schedulers of the running loop.
    spec_module = importlib.import_module("langgraph_batch.nodes._spec")

    class Metrics:
        kv_capacity_tokens = 1000

    class Sched:
        latest_metrics = Metrics()

        async def kv_capacity(self) -> int:
            return Metrics.kv_capacity_tokens

    class S(TypedDict, total=False):
        x: int
        peak: int

    class P(TypedDict, total=False):
        xs: list[int]
        out: list[int]

    live = {"now": 0, "peak": 0}
    created: list[Sched] = []
    # The registry's view of the loop: the scheduler appears once a model call made it.
    monkeypatch.setattr(spec_module, "loop_schedulers", lambda: list(created))

    from langgraph_batch.scheduler import registry

    async def work(state: S) -> S:
        # Like a model call: the first one "creates" the loop's scheduler, and the
        # registry announces it to whoever waits (fan_out's sizer: no polling).
        if not created:
            created.append(Sched())
            with registry._lock:
                waiters = registry._created_waiters.pop(asyncio.get_running_loop(), None)
            registry._wake(waiters, created[0])  # type: ignore[arg-type]
        live["now"] += 1
        live["peak"] = max(live["peak"], live["now"])
        await asyncio.sleep(0.05)
        live["now"] -= 1
        return {"x": state["x"]}

    sub = StateGraph(S)
    sub.add_node("work", work)
    sub.add_edge(START, "work")
    sub.add_edge("work", END)
    node = fan_out(
        sub.compile(),
        items="xs",
        into="out",
        make_input=lambda x, i: {"x": x},
        result=lambda s: s["x"],
        sibling_tokens=300,
        kv_headroom=1.0,
    )
    parent = StateGraph(P)
    parent.add_node("fan", node)
    parent.add_edge(START, "fan")
    parent.add_edge("fan", END)
    out = await asyncio.wait_for(parent.compile().ainvoke({"xs": list(range(12))}), 30)
    assert out["out"] == list(range(12))
    # 1000-token budget / 300-token estimate: at most 3 siblings resident at once.
    assert 1 <= live["peak"] <= 3


async def test_runs_on_one_ledger_share_its_token_budget() -> None:
    ledger = KVLedger(1000)
    a = SiblingAdmission(max_active=10, kv_ledger=ledger, kv_headroom=1.0, sibling_tokens=400)
    b = SiblingAdmission(max_active=10, kv_ledger=ledger, kv_headroom=1.0, sibling_tokens=400)
    a0, a1, a2, b0 = sib(0), sib(1), sib(2), SiblingInfo(group="h", index=0)
    await a.acquire(a0, returning=False)
    await a.acquire(a1, returning=False)  # 800 of 1000 resident, all run a's
    b_wait = asyncio.create_task(b.acquire(b0, returning=False))
    a_wait = asyncio.create_task(a.acquire(a2, returning=False))
    await settle()
    assert not b_wait.done()
    assert not a_wait.done()
    assert ledger.resident_tokens() == 800
    assert b.stats().server_resident_tokens == 800
    assert b.stats().resident_tokens == 0
    a.finish(a0)  # frees 400: the other run, waiting, goes first
    await asyncio.wait_for(b_wait, 10)
    await settle()
    assert not a_wait.done()
    b.close()  # b's run ends: its sibling stops counting, a's waiter fits
    await asyncio.wait_for(a_wait, 10)
    assert ledger.members == 1
    a.close()
    assert ledger.members == 0
    assert ledger.resident_tokens() == 0


async def test_a_derived_cap_counts_every_runs_active_siblings() -> None:
    ledger = KVLedger(1200)  # room for 3 siblings of 400
    a = SiblingAdmission(kv_ledger=ledger, kv_headroom=1.0, sibling_tokens=400)
    b = SiblingAdmission(kv_ledger=ledger, kv_headroom=1.0, sibling_tokens=400)
    assert a.max_active == b.max_active == 3
    sa = [sib(i) for i in range(2)]
    for s in sa:
        await a.acquire(s, returning=False)
    await b.acquire(SiblingInfo(group="h", index=0), returning=False)
    b1 = asyncio.create_task(b.acquire(SiblingInfo(group="h", index=1), returning=False))
    await settle()
    assert not b1.done()  # 3 active over both runs
    a.release(sa[0])
    # A place given up for a tool frees the shared cap, but not the token
    # budget: the in-tool sibling's KV stays resident (1200 of 1200).
    await settle()
    assert not b1.done()
    a.finish(sa[0])
    await asyncio.wait_for(b1, 10)
    # An explicit max_active is the run's own: not counted against others.
    own = SiblingAdmission(max_active=1, kv_ledger=KVLedger(10**6), sibling_tokens=10)
    other = SiblingAdmission(max_active=1, kv_ledger=own.kv_ledger, sibling_tokens=10)
    await own.acquire(sib(7), returning=False)
    await asyncio.wait_for(other.acquire(SiblingInfo(group="h", index=7), returning=False), 10)


def test_a_gate_in_another_loop_is_woken_in_its_own_loop() -> None:
    import threading

    ledger = KVLedger(1000)
    here = SiblingAdmission(kv_ledger=ledger, kv_headroom=1.0, sibling_tokens=600)
    holder = sib(0)
    asyncio.run(here.acquire(holder, returning=False))
    admitted = threading.Event()
    started = threading.Event()

    def other_thread() -> None:
        async def main() -> None:
            there = SiblingAdmission(kv_ledger=ledger, kv_headroom=1.0, sibling_tokens=600)
            waiting = asyncio.create_task(
                there.acquire(SiblingInfo(group="h", index=0), returning=False)
            )
            await asyncio.sleep(0.01)
            started.set()
            await asyncio.wait_for(waiting, 10)
            admitted.set()
            there.close()

        asyncio.run(main())

    t = threading.Thread(target=other_thread)
    t.start()
    assert started.wait(10)
    assert not admitted.is_set()
    here.finish(holder)  # from this thread: the other loop is woken thread-safely
    assert admitted.wait(10)
    t.join(10)
