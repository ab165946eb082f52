"""The admission gate's resident-KV budget: fresh siblings wait while in-tool ones hold KV."""

from __future__ import annotations

import asyncio
import importlib

import pytest

from langgraph_batch._context import SiblingInfo
from langgraph_batch.backends.base import ChatResponse, Usage
from langgraph_batch.chat_model._request import record_context as _record_context
from langgraph_batch.nodes._admission import SiblingAdmission
from langgraph_batch.nodes._spec import check_gate_options
from langgraph_batch.scheduler._capacity import KVLedger


def sib(i: int, context: int = 0) -> SiblingInfo:
    return SiblingInfo(group="g", index=i, context_tokens=context)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_bad_budget_arguments() -> None:
    with pytest.raises(ValueError, match="capacity"):
        KVLedger(0)
    with pytest.raises(ValueError, match="kv_headroom"):
        check_gate_options(kv_headroom=0.0)
    with pytest.raises(ValueError, match="sibling_tokens"):
        check_gate_options(sibling_tokens=0)


async def test_in_tool_siblings_hold_budget_and_block_fresh_ones() -> None:
    # Budget 1000 tokens, estimate 300: three residents fit (900), a fourth does not.
    gate = SiblingAdmission(
        max_active=10, kv_ledger=KVLedger(1000), kv_headroom=1.0, sibling_tokens=300
    )
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


async def test_bookings_are_each_context_plus_one_turns_growth() -> None:
    gate = SiblingAdmission(kv_ledger=KVLedger(100_000), kv_headroom=1.0, sibling_tokens=1000)
    a, b = sib(0), sib(1)
    await gate.acquire(a, returning=False)
    await gate.acquire(b, returning=False)
    assert gate.resident_tokens() == 2 * 1000  # nothing learned: the prior, twice
    for s, first in ((a, 1200), (b, 1800)):
        s.context_tokens = first
        s.admission = gate
        await s.tool_enter("search")  # after its first call
    # First calls teach the first-call size (mean 1500) and, until a turn's growth
    # is seen, the growth too: each booking is its context + 1500.
    assert gate.sibling_estimate == 1500
    assert gate.resident_tokens() == (1200 + 1500) + (1800 + 1500)
    await a.tool_exit()
    a.context_tokens = 2000  # its second call added 800
    await a.tool_enter("search")
    assert gate.forecast.growth == 800
    assert gate.resident_tokens() == (2000 + 800) + (1800 + 800)
    gate.finish(a)
    assert gate.resident_tokens() == 1800 + 800
    assert gate.stats().resident == 1


async def test_explicit_max_active_is_not_changed_by_estimates() -> None:
    gate = SiblingAdmission(max_active=3, kv_ledger=KVLedger(1_000_000), sibling_tokens=500_000)
    s = sib(0)
    await gate.acquire(s, returning=False)
    s.context_tokens = 100
    gate.finish(s)
    assert gate.sibling_estimate == 100
    assert gate.max_active == 3
    for i in range(1, 4):
        await gate.acquire(sib(i), returning=False)
    blocked = asyncio.create_task(gate.acquire(sib(4), returning=False))
    await settle()
    assert not blocked.done()  # max_active still caps actives, the budget has room
    gate.finish(sib(1))
    await asyncio.wait_for(blocked, 10)
    assert gate.active == 3


async def test_returning_sibling_respects_max_active_but_not_budget() -> None:
    gate = SiblingAdmission(
        max_active=1, kv_ledger=KVLedger(1000), kv_headroom=1.0, sibling_tokens=400
    )
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
    gate = SiblingAdmission(kv_ledger=KVLedger(1000), kv_headroom=1.0, sibling_tokens=5000)
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


async def test_the_first_calls_replace_the_prior_without_the_shared_prefix() -> None:
    # 100 siblings of a 2048-token shared prompt and ~600 own tokens must all fit a
    # 374k budget once their first calls are seen, though 100 x 4096 would not.
    gate = SiblingAdmission(kv_ledger=KVLedger(440_000), kv_headroom=0.85, sibling_tokens=4096)
    sibs = [sib(i) for i in range(100)]
    for s in sibs[:91]:
        await asyncio.wait_for(gate.acquire(s, returning=False), 10)
    late = [asyncio.create_task(gate.acquire(s, returning=False)) for s in sibs[91:]]
    await settle()
    assert not any(t.done() for t in late)  # 91 x 4096 fills the budget
    for s in sibs[:91]:
        s.shared_tokens, s.context_tokens = 2048, 600
    gate.release(sibs[0])  # its first call is seen: 600 own tokens, the shared 2048 apart
    assert gate.sibling_estimate == 600
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
    assert gate.max_active is None  # the KV budget admits, not a cap on actives
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
    spec_module = importlib.import_module("langgraph_batch.nodes._run")

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


async def test_growth_pauses_idle_siblings_latest_first_and_they_resume_before_fresh() -> None:
    gate = SiblingAdmission(kv_ledger=KVLedger(10_600), kv_headroom=1.0, sibling_tokens=1000)
    sibs = [sib(i) for i in range(4)]
    for s in sibs:
        s.admission = gate
        await gate.acquire(s, returning=False)
        s.context_tokens = 1000
    for s in sibs:
        await s.tool_enter("t")  # first calls seen: bookings 1000 + 1000 each, 8000
    assert gate.stats().paused == 0
    await sibs[0].tool_exit()
    sibs[0].context_tokens = 2500  # grew by 1500: the growth estimate is 1500 now
    await sibs[0].tool_enter("t")
    # 4000 + 3 x 2500 = 11,500 > 10,600: the latest admitted idle sibling is paused.
    assert gate.is_paused(sibs[3])
    assert gate.resident_tokens() == 4000 + 2500 + 2500
    await sibs[1].tool_exit()
    sibs[1].context_tokens = 2500
    await sibs[1].tool_enter("t")
    assert gate.resident_tokens() == 4000 + 4000 + 2500  # 10,500: nobody else paused
    assert not gate.is_paused(sibs[2])
    assert gate.stats().pauses == 1
    # It comes back: it waits for room (its booking, 2500), and so does a fresh one.
    order: list[str] = []
    back = asyncio.create_task(sibs[3].tool_exit())
    back.add_done_callback(lambda _: order.append("resumed"))
    fresh = asyncio.create_task(gate.acquire(sib(9), returning=False))
    fresh.add_done_callback(lambda _: order.append("fresh"))
    await settle()
    assert not back.done()
    assert not fresh.done()
    assert gate.stats().waiting_returning == 1
    gate.finish(sibs[0])  # 4000 freed: the paused sibling resumes first
    await asyncio.wait_for(asyncio.gather(back, fresh), 10)
    assert order == ["resumed", "fresh"]
    assert not gate.is_paused(sibs[3])
    assert gate.stats().paused == 0


async def test_a_long_wait_is_paused_before_a_later_admitted_sibling() -> None:
    clock = [0.0]
    gate = SiblingAdmission(
        kv_ledger=KVLedger(30_000), kv_headroom=1.0, sibling_tokens=1000, clock=lambda: clock[0]
    )
    for _ in range(10):  # the tool's latencies so far: about a second each
        gate.forecast.observe_tool("search", 1.0)
    early, late, grower = sib(0), sib(1), sib(2)
    for s in (early, late, grower):
        s.admission = gate
        await gate.acquire(s, returning=False)
    early.context_tokens = late.context_tokens = 4000
    await early.tool_enter("search")
    clock[0] = 29.5
    await late.tool_enter("search")
    clock[0] = 30.0  # the first wait is a long one by now (past 90% of the tool's calls)
    grower.context_tokens = 10_000
    await grower.tool_enter("search")
    # First calls 4000, 4000, 10,000: mean 6000, the growth estimate too. Bookings
    # 10,000 + 10,000 + 16,000 = 36,000 > 30,000: the long wait goes, not the latest.
    assert gate.is_paused(early)
    assert not gate.is_paused(late)
    assert not gate.is_paused(grower)
    back = asyncio.create_task(early.tool_exit())
    await settle()
    assert not back.done()  # 26,000 booked + its 10,000 do not fit
    gate.finish(grower)
    await asyncio.wait_for(back, 10)
    # Its 40 s wait was learned: a 29 s wait on this tool is long now, as it was before.
    assert gate.forecast.long_wait("search", 29.0)


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
            while there.stats().waiting_fresh == 0:  # noqa: ASYNC110 (a state, no event)
                await asyncio.sleep(0)
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


def test_a_ledger_shared_by_loops_is_read_while_another_loop_books_it() -> None:
    # Gates of two event loops (two threads) book one server's ledger. One loop
    # admits and finishes siblings and opens and closes runs (gates join and
    # leave) while the other asks the ledger what fits: the reads must never
    # see a gate's bookings or the ledger's members change under them
    # ("dictionary changed size during iteration" would fail a sibling, or be
    # lost in a wake callback, leaving its waiters asleep).
    import sys
    import threading

    ledger = KVLedger(10**9)
    stop = threading.Event()
    errors: list[BaseException] = []

    def booker() -> None:
        async def main() -> None:
            gate = SiblingAdmission(kv_ledger=ledger, kv_headroom=1.0, sibling_tokens=10)
            n = 0
            while not stop.is_set():
                sibs = [SiblingInfo(group="b", index=n + k) for k in range(20)]
                n += 20
                for s in sibs:
                    await gate.acquire(s, returning=False)
                for s in sibs:
                    gate.finish(s)
                for run in [SiblingAdmission(kv_ledger=ledger) for _ in range(5)]:
                    run.close()
            gate.close()

        try:
            asyncio.run(main())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            stop.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    t = threading.Thread(target=booker)
    t.start()
    try:
        reader = SiblingAdmission(kv_ledger=ledger, kv_headroom=1.0, sibling_tokens=10)
        for _ in range(20_000):
            if stop.is_set():
                break
            try:
                ledger.fits(10, headroom=1.0)
                ledger.active()
                reader.wake()
            except RuntimeError as exc:
                errors.append(exc)
                break
    finally:
        stop.set()
        t.join(30)
        sys.setswitchinterval(interval)
    assert errors == []
    assert ledger.resident_tokens() == 0


async def test_a_nested_fan_out_on_the_same_ledger_does_not_deadlock() -> None:
    # Outer siblings each run a fan_out of their own on the same server. Three
    # outer bookings (3 x 300) fill most of the 1000-token budget: the nested
    # siblings (300 each) never fit beside them, and the outer siblings finish
    # only when their nested runs do. A sibling waiting on its nested run lends
    # it its place and booking (paused), and resumes when the run is over.
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    from langgraph_batch.nodes import fan_out

    ledger = KVLedger(1000)

    class Sched:
        def stats(self) -> dict[str, int]:
            return {}

        async def kv_ledger(self) -> KVLedger:
            return ledger

    sched = Sched()

    class Leaf(TypedDict, total=False):
        x: int

    async def work(state: Leaf) -> Leaf:
        await asyncio.sleep(0.01)
        return {"x": state["x"] * 10}

    leaf = StateGraph(Leaf)
    leaf.add_node("work", work)
    leaf.add_edge(START, "work")
    leaf.add_edge("work", END)

    class Mid(TypedDict, total=False):
        xs: list[int]
        out: list[int]

    mid = StateGraph(Mid)
    mid.add_node(
        "inner",
        fan_out(
            leaf.compile(),
            items="xs",
            into="out",
            make_input=lambda x, i: {"x": x},
            result=lambda f: f["x"],
            scheduler=sched,
            sibling_tokens=300,
            kv_headroom=1.0,
        ),
    )
    mid.add_edge(START, "inner")
    mid.add_edge("inner", END)

    class P(TypedDict, total=False):
        xs: list[int]
        out: list[list[int]]

    parent = StateGraph(P)
    parent.add_node(
        "fan",
        fan_out(
            mid.compile(),
            items="xs",
            into="out",
            make_input=lambda x, i: {"xs": [x, x + 1]},
            result=lambda f: f["out"],
            scheduler=sched,
            sibling_tokens=300,
            kv_headroom=1.0,
        ),
    )
    parent.add_edge(START, "fan")
    parent.add_edge("fan", END)
    out = await asyncio.wait_for(parent.compile().ainvoke({"xs": [1, 2, 3, 4]}), 10)
    assert out["out"] == [[10, 20], [20, 30], [30, 40], [40, 50]]
    assert ledger.resident_tokens() == 0
    assert ledger.members == 0


async def test_a_sibling_lends_its_place_and_booking_and_takes_them_back() -> None:
    gate = SiblingAdmission(
        max_active=1, kv_ledger=KVLedger(1000), kv_headroom=1.0, sibling_tokens=600
    )
    parent, other = sib(0), sib(1)
    await gate.acquire(parent, returning=False)
    waiting = asyncio.create_task(gate.acquire(other, returning=False))
    await settle()
    assert not waiting.done()  # 600 + 600 > 1000, and max_active=1
    assert gate.lend(parent)  # it held a place: it must ask for it again
    assert gate.is_paused(parent)
    await asyncio.wait_for(waiting, 10)  # the place and the room went to the waiter
    back = asyncio.create_task(gate.acquire(parent, returning=True))
    await settle()
    assert not back.done()  # paused: it waits for room (and a place)
    gate.finish(other)
    await asyncio.wait_for(back, 10)
    assert gate.holds(parent)
    assert not gate.is_paused(parent)
    assert not gate.lend(sib(7))  # a sibling that holds nothing lends nothing
