"""The gate's resident tokens are kept as sums: they always equal the bookings summed anew."""

from __future__ import annotations

import asyncio
import random

import pytest

from langgraph_batch._context import SiblingInfo
from langgraph_batch.nodes._admission import SiblingAdmission
from langgraph_batch.scheduler import KVLedger


def brute_force(gate: SiblingAdmission) -> int:
    booking = gate.forecast.booking
    return sum(booking(s.context_tokens) for s in gate._booked.values())


@pytest.mark.parametrize("seed", range(12))
async def test_resident_tokens_equal_the_bookings_summed_anew(seed: int) -> None:
    rng = random.Random(seed)
    # A small budget in half the seeds: siblings wait, and idle ones are paused.
    capacity = rng.choice([2_000, 6_000, 10_000_000])
    gate = SiblingAdmission(kv_ledger=KVLedger(capacity), kv_headroom=1.0, sibling_tokens=500)
    sibs = [SiblingInfo(group="g", index=i, admission=gate) for i in range(24)]
    waits: dict[int, asyncio.Task[None]] = {}
    in_tool: set[int] = set()
    done: set[int] = set()
    for _ in range(400):
        i = rng.randrange(len(sibs))
        s = sibs[i]
        if i in done or (i in waits and not waits[i].done()):
            continue
        op = rng.random()
        if gate.holds(s) and op < 0.4:
            s.record_context(s.context_tokens + rng.randint(50, 900))  # a call completed
        elif gate.holds(s) and op < 0.7:
            in_tool.add(i)
            gate.release(s)  # enters a tool
        elif gate.holds(s) and op < 0.8:
            gate.finish(s)
            done.add(i)
        elif not gate.holds(s):
            returning = i in in_tool
            in_tool.discard(i)
            waits[i] = asyncio.create_task(gate.acquire(s, returning=returning))
        for _ in range(3):
            await asyncio.sleep(0)
        assert gate.resident_tokens() == brute_force(gate)
    for task in waits.values():
        task.cancel()
    await asyncio.gather(*waits.values(), return_exceptions=True)
    for s in sibs:
        gate.finish(s)
    assert gate.resident_tokens() == brute_force(gate) == 0


async def test_a_context_set_outside_the_gate_counts_at_its_next_event() -> None:
    gate = SiblingAdmission(kv_ledger=KVLedger(10_000_000), sibling_tokens=500)
    s = SiblingInfo(group="g", index=0, admission=gate)
    await gate.acquire(s, returning=False)
    s.context_tokens = 1_200  # not through record_context
    gate.release(s)  # the gate reads it here
    assert gate.resident_tokens() == brute_force(gate) > 1_200
