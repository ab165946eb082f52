"""The decode cap inside the pure policy core, driven with explicit clocks."""

from __future__ import annotations

import pytest

from langgraph_batch.backends.base import EngineMetrics
from langgraph_batch.scheduler._decode_gate import share
from langgraph_batch.scheduler._item import Outcome, PolicyItem
from langgraph_batch.scheduler._policy import BatchPolicy, Planner


def core(*, batching: bool = False, warming: bool = False, **kw: object) -> Planner:
    policy = BatchPolicy(**{"inflight_limit": 64, "inflight_cap": 256, **kw})  # type: ignore[arg-type]
    return Planner(policy, batching=batching, has_metrics=True, warming=warming)


def sample(
    generated: float, *, prompt: float | None = None, hits: float | None = None
) -> EngineMetrics:
    return EngineMetrics(
        num_requests_waiting=0,
        num_preemptions_total=0,
        generation_tokens_total=generated,
        prompt_tokens_total=prompt,
        prefix_cache_hits_total=hits,
    )


def agents(n: int, *, group: str | None = None, left: int | None = None) -> list[PolicyItem]:
    counter = (lambda: left) if left is not None else None
    return [PolicyItem(turn=0, group=group, left=counter) for _ in range(n)]  # type: ignore[arg-type,return-value]


def enqueue(c: Planner, its: list[PolicyItem], now: float = 0.0) -> list[PolicyItem]:
    for it in its:
        c.enqueue(it, now)
    return its


def test_the_cap_holds_from_the_first_request_until_the_engine_says_otherwise() -> None:
    c = core()
    assert c.decode_limit == 16  # provisional: no sample yet
    enqueue(c, agents(40))
    assert len(c.plan(0.0).dispatch) == 16
    c.on_metrics(EngineMetrics(num_requests_waiting=0), 0.5)  # no generation counter
    assert c.decode_limit is None
    assert c.decode_cap is None
    assert len(c.plan(0.5).dispatch) == 24  # the in-flight limit (64 here) alone


def test_a_counting_engine_keeps_the_cap() -> None:
    c = core()
    enqueue(c, agents(40))
    c.plan(0.0)
    c.on_metrics(sample(0), 0.5)
    assert c.decode_limit == 16
    assert c.decode_cap is not None
    assert c.decode_cap.active


def test_the_cap_stands_down_when_no_metrics_arrive() -> None:
    c = core(metrics_interval_s=0.25)  # grace: max(2 s, 4 intervals)
    enqueue(c, agents(40))
    assert len(c.plan(10.0).dispatch) == 16  # the grace starts with the first request
    assert len(c.plan(12.0).dispatch) == 0
    assert len(c.plan(12.01).dispatch) == 24
    assert c.decode_limit is None


def test_the_in_flight_limit_still_binds_under_the_cap() -> None:
    # The hard cap, and AIMD after preemptions, bind below the decode cap.
    c = core(inflight_limit=8, inflight_cap=8)
    enqueue(c, agents(20))
    c.on_metrics(sample(0), 0.0)
    assert len(c.plan(0.0).dispatch) == 8
    c = core(inflight_limit=64, inflight_cap=64, decrease_factor=0.5)
    c.on_metrics(sample(0, prompt=0, hits=0), 0.0)
    its = enqueue(c, agents(40))
    assert len(c.plan(0.0).dispatch) == 16
    c.on_metrics(
        EngineMetrics(num_preemptions_total=0, generation_tokens_total=10, num_requests_waiting=0),
        0.5,
    )
    c.on_metrics(
        EngineMetrics(num_preemptions_total=3, generation_tokens_total=20, num_requests_waiting=0),
        1.0,
    )
    assert c.limit == 32  # halved
    for it in its[:16]:
        c.on_complete(it, Outcome.OK, 1.1)
    c.on_metrics(
        EngineMetrics(num_preemptions_total=9, generation_tokens_total=30, num_requests_waiting=0),
        2.5,
    )
    assert c.limit == 16
    assert c.stats().decreases == 2
    assert len(c.plan(2.5).dispatch) == 16  # min(in-flight limit 16, decode cap 16)


@pytest.mark.parametrize(
    ("kw", "has_metrics"),
    [
        ({"decode_cap": False}, True),
        ({"adaptive": False}, True),
        ({}, False),
    ],
)
def test_decode_cap_off(kw: dict[str, object], has_metrics: bool) -> None:
    policy = BatchPolicy(inflight_limit=64, **kw)  # type: ignore[arg-type]
    c = Planner(policy, has_metrics=has_metrics)
    c.on_metrics(sample(0), 0.0)
    assert c.decode_cap is None
    assert c.decode_limit is None
    enqueue(c, agents(40))
    assert len(c.plan(0.0).dispatch) == 40


def test_agent_requests_are_held_at_the_cap_one_shot_ones_are_not() -> None:
    c = core()
    c.on_metrics(sample(0), 0.0)
    waiting = enqueue(c, agents(40))
    assert len(c.plan(0.0).dispatch) == 16
    # The fast path refuses an agent request too, but not a one-shot one.
    assert not c.try_acquire(PolicyItem(turn=3), 0.0)
    one_shot = PolicyItem(batchable=True)
    assert c.try_acquire(one_shot, 0.0) is False  # the queue is not empty: it queues
    c.enqueue(one_shot, 0.0)
    assert c.plan(0.0).dispatch == []  # behind the agents, in priority order
    c.withdraw(one_shot, 0.0)
    # A freed slot goes to the next agent; the cap holds.
    c.on_complete(waiting[0], Outcome.OK, 1.0)
    assert len(c.plan(1.0).dispatch) == 1
    assert c.in_flight == 16


def test_one_shot_requests_batch_past_the_cap() -> None:
    c = core(batching=True, batch_window_s=0.001, max_batch_size=64)
    c.on_metrics(sample(0), 0.0)
    enqueue(c, agents(20))
    enqueue(c, [PolicyItem(batchable=True) for _ in range(30)])
    plan = c.plan(0.01)
    assert len(plan.dispatch) == 16
    assert sum(len(b) for b in plan.batches) == 30
    assert c.in_flight == 46
    free = PolicyItem(batchable=True)
    assert c.try_acquire(free, 0.0) is False  # batchable: always through the batch queue


def test_with_an_empty_queue_the_fast_path_respects_the_cap() -> None:
    c = core()
    c.on_metrics(sample(0), 0.0)
    granted = [it for it in agents(20) if c.try_acquire(it, 0.0)]
    assert len(granted) == 16
    assert c.try_acquire(PolicyItem(batchable=True), 0.0)  # one-shot: only the limit


def test_what_a_run_has_left_goes_in_equal_waves() -> None:
    c = core()
    c.on_metrics(sample(0), 0.0)
    enqueue(c, agents(20, group="r1", left=20))
    assert len(c.plan(0.0).dispatch) == 20  # under two caps: at once

    c = core()
    c.on_metrics(sample(0), 0.0)
    enqueue(c, agents(100, group="r1", left=100))
    assert len(c.plan(0.0).dispatch) == 17  # waves of 17, none of 4

    c = core()
    c.on_metrics(sample(0), 0.0)
    enqueue(c, agents(20, group="r1", left=20) + agents(1))  # one of no known run
    assert len(c.plan(0.0).dispatch) == 16


def test_the_run_counter_is_read_when_the_cap_applies() -> None:
    left = {"n": 100}
    c = core()
    c.on_metrics(sample(0), 0.0)
    its = [PolicyItem(group="r", left=lambda: left["n"]) for _ in range(100)]
    enqueue(c, its)
    first = c.plan(0.0).dispatch
    assert len(first) == 17
    # Siblings finished meanwhile (their requests gone): what is left fits one wave.
    for it in its[17:87]:
        c.withdraw(it, 0.5)
    left["n"] = 30
    c.on_complete(first[0], Outcome.OK, 1.0)
    assert len(c.plan(1.0).dispatch) == 13  # every queued one: 29 at once, under a wave of 30
    assert c.queued == 0


def test_demand_is_forgotten_when_requests_leave() -> None:
    c = core(warming=True)
    c.on_metrics(sample(0), 0.0)
    solo = agents(1)
    enqueue(c, solo)  # a request of no known run: no rounding while it is there
    assert len(c.plan(0.0).dispatch) == 1
    c.on_complete(solo[0], Outcome.OK, 0.1)
    # Queued, held (prefix warming) and withdrawn, then drained: all gone again.
    queued = enqueue(c, agents(30, group="a", left=30), 0.2)
    held = [PolicyItem(group="b", left=lambda: 5, prefix="p") for _ in range(3)]
    enqueue(c, held, 0.2)
    for it in held:
        c.withdraw(it, 0.3)
    for it in queued[:10]:
        c.withdraw(it, 0.3)
    c.drain()
    # Nothing of those runs is left: a new run of 20 goes at once again.
    enqueue(c, agents(20, group="c", left=20), 1.0)
    assert len(c.plan(1.0).dispatch) == 20


def test_samples_teach_the_cap_and_it_steps_up_while_that_pays() -> None:
    c = core()
    c.on_metrics(sample(0), 0.0)
    enqueue(c, agents(100))
    assert len(c.plan(0.0).dispatch) == 16
    c.on_metrics(sample(0), 0.0)  # the interval starts with them in flight
    # 16 in flight the whole time, a backlog held back: 2,000 tokens/s.
    c.on_metrics(sample(1000), 0.5)
    c.on_metrics(sample(2000), 1.0)
    assert c.decode_cap is not None
    assert c.decode_cap.throughput(16) == pytest.approx(2000)
    assert c.decode_limit == 23
    assert len(c.plan(1.0).dispatch) == 7


def test_prefill_counters_reach_the_cap() -> None:
    c = core()
    c.on_metrics(sample(0, prompt=0, hits=0), 0.0)
    enqueue(c, agents(100))
    c.plan(0.0)
    c.on_metrics(sample(0, prompt=0, hits=0), 0.0)
    # Clean intervals, then prefill-heavy ones at the same concurrency.
    gen, prompt, hits = 0.0, 0.0, 0.0
    for i in range(1, 9):
        heavy = i % 2 == 0
        gen += 500 if heavy else 1000
        prompt += 30_000 if heavy else 0
        hits += 5_000 if heavy else 0
        c.on_metrics(sample(gen, prompt=prompt, hits=hits), 0.5 * i)
    assert c.decode_cap is not None
    # Half of a heavy interval (0.25 s) went to 25,000 computed tokens: 10 us each.
    assert c.decode_cap.prefill_s_per_token == pytest.approx(10e-6, rel=0.01)


def test_an_interval_with_nothing_in_flight_for_a_moment_teaches_nothing() -> None:
    c = core()
    c.on_metrics(sample(0), 0.0)
    (it,) = enqueue(c, agents(1))
    c.plan(0.0)
    c.on_complete(it, Outcome.OK, 0.2)  # idle from 0.2 on
    (it2,) = enqueue(c, agents(1), 0.3)
    c.plan(0.3)
    c.on_metrics(sample(500), 0.5)
    assert c.decode_cap is not None
    assert c.decode_cap.throughput(1) is None
    c.on_metrics(sample(1000), 1.0)  # busy all through this one
    assert c.decode_cap.throughput(1) == pytest.approx(1000)
    c.on_complete(it2, Outcome.OK, 1.1)


def test_the_mean_in_flight_over_the_interval_is_what_is_learned() -> None:
    c = core()
    c.on_metrics(sample(0), 0.0)
    its = enqueue(c, agents(16))
    c.plan(0.0)
    c.on_metrics(sample(0), 0.0)
    for it in its[:8]:
        c.on_complete(it, Outcome.OK, 0.25)  # 16 for 0.25 s, then 8 for 0.25 s: 12 on average
    c.on_metrics(sample(600), 0.5)
    assert c.decode_cap is not None
    assert c.decode_cap.throughput(12) == pytest.approx(1200)
    assert c.decode_cap.throughput(16) is None


def test_decode_elasticity_is_validated() -> None:
    for bad in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError, match="decode_elasticity"):
            BatchPolicy(decode_elasticity=bad)
    c = Planner(BatchPolicy(decode_elasticity=0.5), has_metrics=True)
    assert c.decode_cap is not None


def engine_sample(generated: float, *, running: int, waiting: int = 0) -> EngineMetrics:
    return EngineMetrics(
        num_requests_running=running,
        num_requests_waiting=waiting,
        num_preemptions_total=0,
        generation_tokens_total=generated,
    )


@pytest.mark.parametrize(
    ("cap", "foreign", "ours"), [(16, 0, 16), (16, 5, 11), (16, 8, 8), (16, 40, 8), (5, 9, 3)]
)
def test_other_clients_take_their_share_of_the_cap_down_to_half(
    cap: int, foreign: int, ours: int
) -> None:
    assert share(cap, foreign) == ours


def test_requests_of_other_clients_on_the_engine_shrink_our_part_of_the_cap() -> None:
    # Another worker of the same fan_out runs 6 requests on the engine: twice
    # seen (the engine counts 22 while we have 16 in flight), they hold 6 of the 16.
    c = core()
    c.on_metrics(engine_sample(0, running=0), 0.0)
    its = enqueue(c, agents(40))
    assert len(c.plan(0.0).dispatch) == 16
    c.on_metrics(engine_sample(100, running=20, waiting=6), 0.5)
    assert c._gate.foreign == 0  # one sample may be our own answers on the wire
    c.on_metrics(engine_sample(200, running=22), 1.0)
    assert c._gate.foreign == 6
    for it in its[:6]:
        c.on_complete(it, Outcome.OK, 1.1)
    assert c.in_flight == 10
    assert c.plan(1.1).dispatch == []  # 10 ours + 6 theirs: the cap is full
    # They finish: the next samples give the cap back.
    c.on_metrics(engine_sample(300, running=10), 1.5)
    c.on_metrics(engine_sample(400, running=10), 2.0)
    assert c._gate.foreign == 0
    assert len(c.plan(2.0).dispatch) == 6


def test_a_busy_neighbour_leaves_us_half_the_cap() -> None:
    c = core()
    enqueue(c, agents(40))
    for k in range(3):
        c.on_metrics(engine_sample(100 * k, running=100), 0.5 * k)
    assert c._gate.foreign == 100
    assert len(c.plan(1.0).dispatch) == 8


def test_an_engine_that_does_not_count_running_requests_has_no_neighbours() -> None:
    c = core()
    enqueue(c, agents(40))
    c.on_metrics(sample(0), 0.0)
    c.on_metrics(sample(100), 0.5)
    assert c._gate.foreign == 0
    assert len(c.plan(0.5).dispatch) == 16
