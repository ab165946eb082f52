"""The pure policy core, driven with explicit clocks."""

from __future__ import annotations

import pytest

from langgraph_batch.backends.base import ChatRequest, EngineMetrics, conversation_key
from langgraph_batch.scheduler._item import (
    DONE,
    QUEUED,
    RUNNING,
    WITHDRAWN,
    Outcome,
    Plan,
    PolicyItem,
)
from langgraph_batch.scheduler._policy import BatchPolicy, Planner


def core(**kw: object) -> Planner:
    batching = bool(kw.pop("batching", False))
    has_metrics = bool(kw.pop("has_metrics", False))
    return Planner(BatchPolicy(**kw), batching=batching, has_metrics=has_metrics)  # type: ignore[arg-type]


def items(*turns: int, **kw: object) -> list[PolicyItem]:
    return [PolicyItem(turn=t, **kw) for t in turns]  # type: ignore[arg-type]


# ------------------------------------------------------------------ BatchPolicy


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"inflight_limit": 0}, "inflight_limit=0"),
        ({"inflight_limit": True}, "inflight_limit=True"),
        ({"min_inflight": 0}, "min_inflight=0"),
        ({"min_inflight": 5, "inflight_limit": 4}, "min_inflight=5"),
        ({"inflight_cap": 0}, "inflight_cap=0"),
        ({"inflight_cap": 3, "inflight_limit": 4}, "inflight_cap=3"),
        ({"increase_step": 0}, "increase_step"),
        ({"decrease_factor": 1.0}, "decrease_factor"),
        ({"adapt_cooldown_s": -1}, "adapt_cooldown_s"),
        ({"metrics_interval_s": 0}, "metrics_interval_s"),
        ({"priority": "random"}, "priority='random'"),
        ({"batch_window_s": -0.1}, "batch_window_s"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"retry": 2}, "retry=2 must be a RetryPolicy"),
        ({"timeout": 0}, "timeout=0"),
        ({"stats_window": 0}, "stats_window"),
        ({"initial_inflight": 0}, "initial_inflight=0"),
        ({"initial_inflight": 3, "min_inflight": 4, "inflight_limit": 8}, "initial_inflight=3"),
        ({"initial_inflight": 9, "inflight_limit": 4, "inflight_cap": 8}, "initial_inflight=9"),
        ({"kv_tokens_per_request": 0}, "kv_tokens_per_request=0"),
    ],
)
def test_policy_rejects_bad_values(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BatchPolicy(**kw)  # type: ignore[arg-type]


def test_policy_hard_cap_and_from_dict() -> None:
    assert BatchPolicy(inflight_limit=8).hard_cap == 32
    assert BatchPolicy(inflight_limit=8, inflight_cap=10).hard_cap == 10
    assert BatchPolicy(inflight_limit=8, adaptive=False).hard_cap == 8
    p = BatchPolicy.from_dict({"inflight_limit": 3, "priority": "las", "timeout": 2.5})
    assert (p.inflight_limit, p.priority, p.timeout) == (3, "las", 2.5)
    with pytest.raises(ValueError, match=r"unknown BatchPolicy field\(s\) \['bogus'\]"):
        BatchPolicy.from_dict({"bogus": 1})


# --------------------------------------------------------------------- priority


def test_depth_first_order_and_fifo_among_equals() -> None:
    c = core(inflight_limit=10)
    a, b, d, e = items(0, 3, 1, 3)
    for i, it in enumerate((a, b, d, e)):
        c.enqueue(it, now=float(i))
    plan = c.plan(now=10.0)
    assert plan.dispatch == [b, e, d, a]
    assert plan.batches == []
    assert plan.wake_at is None
    assert all(it.state == RUNNING for it in (a, b, d, e))
    assert b.queued_s == 9.0
    assert a.queued_s == 10.0


def test_fifo_mode_ignores_turns() -> None:
    c = core(inflight_limit=10, priority="fifo")
    its = items(0, 3, 1, 3)
    for it in its:
        c.enqueue(it, now=0.0)
    assert c.plan(0.0).dispatch == its


def test_las_prefers_least_attained_service() -> None:
    c = core(inflight_limit=1, priority="las")
    long_ = PolicyItem(sibling_id="g/long")
    c.enqueue(long_, 0.0)
    assert c.plan(0.0).dispatch == [long_]
    c.on_complete(long_, Outcome.OK, now=5.0)  # 5 s of service
    short = PolicyItem(sibling_id="g/short")
    c.on_complete(_run_one(c, short, 5.0), Outcome.OK, now=6.0)  # 1 s of service
    assert c.priority.attained.get("g/long") == 5.0
    assert c.priority.attained.get("g/short") == 1.0
    # The long sibling asks first, but the short one is served first.
    nxt_long = PolicyItem(sibling_id="g/long")
    nxt_short = PolicyItem(sibling_id="g/short")
    anon = PolicyItem()
    c.enqueue(nxt_long, 7.0)
    c.enqueue(nxt_short, 8.0)
    c.enqueue(anon, 9.0)  # no sibling: its own program, no service yet
    assert c.plan(9.0).dispatch == [anon]
    c.on_complete(anon, Outcome.OK, 9.5)
    assert c.plan(9.5).dispatch == [nxt_short]
    c.on_complete(nxt_short, Outcome.OK, 10.0)
    assert c.plan(10.0).dispatch == [nxt_long]


def test_las_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import langgraph_batch.scheduler._priority as priority

    monkeypatch.setattr(priority, "LAS_MEMORY", 2)
    c = core(inflight_limit=1, priority="las")
    for sid in ("a", "b", "c"):
        c.on_complete(_run_one(c, PolicyItem(sibling_id=sid), 0.0), Outcome.OK, 1.0)
    assert c.priority.attained.get("a") == 0.0  # forgotten, oldest first
    assert c.priority.attained.get("c") == 1.0


def _run_one(c: Planner, item: PolicyItem, now: float) -> PolicyItem:
    c.enqueue(item, now)
    assert c.plan(now).dispatch == [item]
    return item


# ------------------------------------------------------------------- slots


def test_slots_bound_dispatch_and_release_refills() -> None:
    c = core(inflight_limit=2)
    its = items(0, 0, 0)
    for it in its:
        c.enqueue(it, 0.0)
    assert c.plan(0.0).dispatch == its[:2]
    assert (c.in_flight, c.queued, c.slots_free) == (2, 1, 0)
    assert c.plan(0.0).dispatch == []
    c.on_complete(its[0], Outcome.OK, 1.0)
    assert its[0].state == DONE
    assert c.plan(1.0).dispatch == [its[2]]


def test_try_acquire_only_when_uncontended() -> None:
    c = core(inflight_limit=1)
    a, b, d = items(0, 0, 0)
    assert c.try_acquire(a, 0.0)
    assert a.state == RUNNING
    assert c.in_flight == 1
    assert not c.try_acquire(b, 0.0)  # no slot
    c.enqueue(b, 0.0)
    c.on_complete(a, Outcome.OK, 1.0)
    assert not c.try_acquire(d, 1.0)  # a slot, but b is queued first
    assert c.plan(1.0).dispatch == [b]


def test_enqueue_and_complete_misuse() -> None:
    c = core()
    a = PolicyItem()
    c.enqueue(a, 0.0)
    with pytest.raises(ValueError, match="already queued or running"):
        c.enqueue(a, 0.0)
    with pytest.raises(ValueError, match="holds no slot"):
        c.on_complete(a, Outcome.OK, 0.0)


def test_retry_keeps_its_place() -> None:
    c = core(inflight_limit=1)
    a, b = items(0, 0)
    c.enqueue(a, 0.0)
    c.enqueue(b, 0.0)
    assert c.plan(0.0).dispatch == [a]
    c.on_complete(a, Outcome.ERROR, 1.0)
    c.enqueue(a, 1.0)  # re-queued after b, but keeps its earlier sequence number
    assert c.plan(1.0).dispatch == [a]


def test_withdraw_is_lazy_and_compacts() -> None:
    c = core(inflight_limit=1)
    keep = PolicyItem()
    gone = [PolicyItem() for _ in range(200)]
    for it in gone:
        c.enqueue(it, 0.0)
    c.enqueue(keep, 0.0)
    assert all(c.withdraw(it) for it in gone)
    assert not c.withdraw(gone[0])  # twice: not an error
    assert gone[0].state == WITHDRAWN
    assert c.queued == 1
    assert len(c._heap) < 200  # compacted
    assert c.plan(0.0).dispatch == [keep]
    assert not c.withdraw(keep)  # already running


def test_withdraw_skipped_at_the_top() -> None:
    c = core(inflight_limit=5)
    a, b = items(5, 0)
    c.enqueue(a, 0.0)
    c.enqueue(b, 0.0)
    c.withdraw(a)
    assert c.plan(0.0).dispatch == [b]
    assert c.queued == 0
    assert c._dead == 0


def test_drain_returns_queued_in_submission_order() -> None:
    c = core(inflight_limit=1, batching=True, max_batch_size=4)
    a, b, d = items(0, 9, 3)
    d.batchable = True
    for it in (a, b, d):
        c.enqueue(it, 0.0)
    c.withdraw(a)
    assert c.drain() == [b, d]
    assert c.queued == 0
    assert b.state == WITHDRAWN
    assert c.plan(0.0).dispatch == []


# ---------------------------------------------------------------- batching


def test_batch_window_collects_then_dispatches() -> None:
    c = core(inflight_limit=10, batching=True, batch_window_s=0.002, max_batch_size=8)
    bs = [PolicyItem(batchable=True) for _ in range(3)]
    c.enqueue(bs[0], 1.0)
    plan = c.plan(1.0)
    assert plan.dispatch == []
    assert plan.batches == []
    assert plan.wake_at == pytest.approx(1.002)
    c.enqueue(bs[1], 1.001)
    c.enqueue(bs[2], 1.001)
    assert c.plan(1.0015).wake_at == pytest.approx(1.002)
    plan = c.plan(1.002)
    assert plan.batches == [bs]
    assert plan.wake_at is None
    assert all(it.in_batch and it.state == RUNNING for it in bs)
    assert c.in_flight == 3  # one slot per member


def test_full_batch_goes_before_the_window_closes() -> None:
    c = core(inflight_limit=10, batching=True, batch_window_s=1.0, max_batch_size=4)
    bs = [PolicyItem(batchable=True) for _ in range(6)]
    for it in bs:
        c.enqueue(it, 0.0)
    plan = c.plan(0.0)
    assert plan.batches == [bs[:4]]
    assert plan.wake_at == 1.0  # the rest wait for the window
    assert c.plan(1.0).batches == [bs[4:]]


def test_batches_limited_by_free_slots_and_compete_on_priority() -> None:
    c = core(inflight_limit=3, batching=True, batch_window_s=0.01, max_batch_size=8)
    plain_low = PolicyItem(turn=0)
    plain_high = PolicyItem(turn=5)
    bs = [PolicyItem(turn=2, batchable=True) for _ in range(4)]
    c.enqueue(plain_low, 0.0)
    for it in bs:
        c.enqueue(it, 0.0)
    c.enqueue(plain_high, 0.0)
    plan = c.plan(0.0)  # window open: plain ones go, batchable wait
    assert plan.dispatch == [plain_high, plain_low]
    assert plan.batches == []
    plan = c.plan(0.02)
    assert plan.batches == [bs[:1]]  # one free slot left
    c.on_complete(plain_high, Outcome.OK, 0.03)
    c.on_complete(plain_low, Outcome.OK, 0.03)
    assert c.plan(0.03).batches == [bs[1:3]]  # two slots free


def test_batching_off_puts_batchable_in_the_plain_queue() -> None:
    c = core(inflight_limit=2, batching=False)
    a = PolicyItem(batchable=True)
    assert c.try_acquire(a, 0.0)
    b = PolicyItem(batchable=True)
    c.enqueue(b, 0.0)
    assert c.withdraw(b)
    assert c.queued == 0
    c2 = core(inflight_limit=2, batching=True)
    assert not c2.try_acquire(PolicyItem(batchable=True), 0.0)


def test_withdrawn_batch_members_close_the_window() -> None:
    c = core(inflight_limit=4, batching=True, batch_window_s=0.01, max_batch_size=8)
    a, b = PolicyItem(batchable=True), PolicyItem(batchable=True)
    c.enqueue(a, 0.0)
    c.enqueue(b, 0.0)
    c.withdraw(a)
    assert c.plan(0.02).batches == [[b]]
    d = PolicyItem(batchable=True)
    c.enqueue(d, 0.02)
    c.withdraw(d)
    plan = c.plan(0.05)
    assert plan == Plan()


# -------------------------------------------------------------- adaptation


def saturate(c: Planner, now: float, extra: int = 1) -> list[PolicyItem]:
    its = [PolicyItem() for _ in range(c.limit + extra)]
    for it in its:
        c.enqueue(it, now)
    c.plan(now)
    return its


def test_429_decreases_multiplicatively_once_per_cooldown_to_floor() -> None:
    c = core(inflight_limit=10, min_inflight=4, decrease_factor=0.5, adapt_cooldown_s=1.0)
    its = saturate(c, 0.0)
    c.on_complete(its[0], Outcome.RATE_LIMITED, 0.0)
    assert c.limit == 5
    c.on_complete(its[1], Outcome.OVERLOADED, 0.5)  # same burst: ignored
    assert c.limit == 5
    c.on_complete(its[2], Outcome.RATE_LIMITED, 2.0)
    assert c.limit == 4  # floor
    c.on_complete(its[3], Outcome.ERROR, 4.0)
    c.on_complete(its[4], Outcome.CANCELLED, 4.0)
    assert c.stats().limit_exact == 4.0


def test_recovers_towards_max_inflight_without_metrics() -> None:
    c = core(inflight_limit=4, decrease_factor=0.5, adapt_cooldown_s=0.0)
    its = saturate(c, 0.0, extra=20)
    c.on_complete(its[0], Outcome.RATE_LIMITED, 0.0)
    assert c.limit == 2
    t = 1.0
    for _ in range(30):
        for it in c.plan(t).dispatch:
            c.on_complete(it, Outcome.OK, t)
        for it in list(its):
            if it.state == RUNNING:
                c.on_complete(it, Outcome.OK, t)
        t += 1.0
        c.enqueue(PolicyItem(), t)
    assert c.limit == 4  # back to max_inflight, never beyond
    assert c.stats().limit_exact == 4.0


def test_metrics_grow_to_the_cap_while_server_has_no_queue() -> None:
    c = core(inflight_limit=4, inflight_cap=10, increase_step=4, has_metrics=True)
    saturate(c, 0.0, extra=50)
    idle = EngineMetrics(num_requests_waiting=0, num_preemptions_total=0)
    c.on_metrics(idle, 1.0)
    assert c.limit == 8
    assert c.latest_metrics is idle
    c.plan(1.0)
    c.on_metrics(idle, 2.0)
    assert c.limit == 10  # hard cap
    c.plan(2.0)
    c.on_metrics(EngineMetrics(num_requests_waiting=3, num_preemptions_total=0), 3.0)
    assert c.limit == 10  # server queues: no growth


def test_metrics_no_growth_when_not_limit_bound() -> None:
    c = core(inflight_limit=4, has_metrics=True)
    c.enqueue(PolicyItem(), 0.0)
    c.on_metrics(EngineMetrics(num_requests_waiting=0), 0.0)
    assert c.limit == 4
    c.on_metrics(EngineMetrics(), 0.0)  # nothing reported
    assert c.limit == 4


def test_rising_preemptions_shrink() -> None:
    c = core(inflight_limit=10, decrease_factor=0.5, adapt_cooldown_s=0.0, has_metrics=True)
    saturate(c, 0.0)
    c.on_metrics(EngineMetrics(num_preemptions_total=3, num_requests_waiting=5), 1.0)
    assert c.limit == 10  # first sample is the baseline
    c.on_metrics(EngineMetrics(num_preemptions_total=3, num_requests_waiting=5), 2.0)
    assert c.limit == 10
    c.on_metrics(EngineMetrics(num_preemptions_total=7, num_requests_waiting=0), 3.0)
    assert c.limit == 5


IDLE = EngineMetrics(num_requests_waiting=0, num_preemptions_total=0)
BUSY = EngineMetrics(num_requests_waiting=5, num_preemptions_total=0)


def test_slow_start_doubles_per_sample_while_limit_bound_up_to_the_cap() -> None:
    c = core(inflight_limit=100, initial_inflight=8, inflight_cap=100, has_metrics=True)
    assert c.limit == 8
    assert c.stats().slow_start
    saturate(c, 0.0, extra=200)
    t = 0.0
    seen = []
    for _ in range(6):
        t += 0.5
        c.on_metrics(IDLE, t)
        c.plan(t)  # fills the new slots; our queue stays non-empty
        seen.append(c.limit)
    assert seen == [16, 32, 64, 100, 100, 100]  # x2 per sample, then the hard cap
    assert c.in_flight == 100
    assert c.stats().increases == 4


def test_no_growth_while_the_engine_queues() -> None:
    c = core(inflight_limit=64, initial_inflight=8, has_metrics=True)
    saturate(c, 0.0, extra=50)
    c.on_metrics(BUSY, 0.5)
    c.on_metrics(EngineMetrics(), 1.0)  # waiting not reported
    assert c.limit == 8
    assert c.stats().slow_start  # a busy engine queue alone is no overload signal


def test_growth_counts_saturation_since_the_previous_sample() -> None:
    # Limit-bound at t=0.2, but at sample time a slot is momentarily free.
    c = core(inflight_limit=64, initial_inflight=4, has_metrics=True)
    its = saturate(c, 0.2, extra=1)
    c.on_complete(its[0], Outcome.OK, 0.4)
    assert (c.slots_free, c.ready) == (1, 1)
    c.on_metrics(IDLE, 0.5)
    assert c.limit == 8
    # The next sample sees no saturation since this one: no growth.
    c.plan(0.6)
    c.on_metrics(IDLE, 1.0)
    assert c.limit == 8


def test_fresh_idle_sample_grows_on_the_first_limit_bound_event() -> None:
    c = core(inflight_limit=64, initial_inflight=2, has_metrics=True, metrics_interval_s=0.5)
    c.on_metrics(IDLE, 0.0)  # not limit-bound now: growth stays available
    assert c.limit == 2
    its = [PolicyItem() for _ in range(5)]
    for it in its[:2]:
        c.enqueue(it, 0.1)
    assert len(c.plan(0.1).dispatch) == 2
    c.enqueue(its[2], 0.2)  # queued behind full slots, sample 0.2 s old: grow now
    assert c.limit == 4
    assert c.plan(0.2).dispatch == [its[2]]
    c.enqueue(its[3], 0.3)
    c.enqueue(its[4], 0.3)
    c.plan(0.3)
    assert c.limit == 4  # one increase per sample
    c.on_metrics(IDLE, 1.0)  # limit-bound since the last sample: grow at once
    assert c.limit == 8


def test_stale_idle_sample_does_not_grow_on_events() -> None:
    c = core(inflight_limit=64, initial_inflight=1, has_metrics=True, metrics_interval_s=0.5)
    c.on_metrics(IDLE, 0.0)
    saturate(c, 0.6, extra=3)  # 0.6 s after the sample: too old to act on
    assert c.limit == 1


def test_decrease_ends_slow_start_then_additive_increase() -> None:
    c = core(
        inflight_limit=64,
        initial_inflight=16,
        inflight_cap=64,
        decrease_factor=0.5,
        increase_step=4,
        adapt_cooldown_s=0.0,
        has_metrics=True,
    )
    its = saturate(c, 0.0, extra=100)
    c.on_metrics(IDLE, 0.5)
    assert c.limit == 32
    c.on_complete(its[0], Outcome.OVERLOADED, 0.6)  # HTTP 503
    assert c.limit == 16
    assert not c.stats().slow_start
    t = 0.6
    seen = []
    for _ in range(3):
        c.plan(t)
        t += 0.5
        c.on_metrics(IDLE, t)
        seen.append(c.limit)
    assert seen == [20, 24, 28]  # AIMD: + increase_step per sample
    assert c.stats().decreases == 1


def test_rising_preemptions_end_slow_start() -> None:
    # The in-flight limit alone (the decode cap would hold these agents at 16
    # before the engine's first sample: test_policy_decode.py).
    c = core(
        inflight_limit=64,
        initial_inflight=32,
        decrease_factor=0.5,
        has_metrics=True,
        decode_cap=False,
    )
    saturate(c, 0.0, extra=10)
    c.on_metrics(EngineMetrics(num_requests_waiting=0, num_preemptions_total=0), 0.5)
    assert c.limit == 64
    c.plan(0.5)
    c.on_metrics(EngineMetrics(num_requests_waiting=0, num_preemptions_total=2), 1.0)
    assert c.limit == 32
    assert not c.stats().slow_start


def test_engine_kv_capacity_sizes_the_starting_limit() -> None:
    c = core(
        inflight_limit=256,
        initial_inflight=64,
        inflight_cap=256,
        kv_tokens_per_request=3000,
        has_metrics=True,
    )
    c.on_metrics(EngineMetrics(kv_capacity_tokens=440_000, num_requests_waiting=0), 0.0)
    assert c.limit == 146  # 440k / 3k
    c.on_metrics(EngineMetrics(kv_capacity_tokens=10_000_000, num_requests_waiting=0), 0.5)
    assert c.limit == 146  # sized once
    small = core(inflight_limit=100, initial_inflight=64, inflight_cap=100, has_metrics=True)
    small.on_metrics(EngineMetrics(kv_capacity_tokens=4_000_000), 0.0)
    assert small.limit == 100  # clamped to the hard cap
    tiny = core(inflight_limit=256, initial_inflight=64, has_metrics=True)
    tiny.on_metrics(EngineMetrics(kv_capacity_tokens=40_000), 0.0)
    assert tiny.limit == 64  # only ever raises the start
    off = core(
        inflight_limit=256, initial_inflight=64, kv_tokens_per_request=None, has_metrics=True
    )
    off.on_metrics(EngineMetrics(kv_capacity_tokens=4_000_000), 0.0)
    assert off.limit == 64


def test_without_metrics_the_limit_is_max_inflight() -> None:
    c = core(inflight_limit=256, initial_inflight=64, inflight_cap=256, decrease_factor=0.5)
    assert c.limit == 256  # initial_inflight applies only with engine metrics
    its = saturate(c, 0.0, extra=10)
    c.on_metrics(IDLE, 0.5)  # a stray sample never grows a metrics-less core
    assert c.limit == 256
    c.on_complete(its[0], Outcome.RATE_LIMITED, 1.0)
    assert c.limit == 128


def test_not_adaptive_never_moves() -> None:
    c = core(inflight_limit=4, adaptive=False, adapt_cooldown_s=0.0, has_metrics=True)
    its = saturate(c, 0.0)
    c.on_complete(its[0], Outcome.RATE_LIMITED, 1.0)
    c.on_metrics(EngineMetrics(num_requests_waiting=0, num_preemptions_total=9), 2.0)
    assert c.limit == 4


# ------------------------------------------------------------ bookkeeping


def test_inflight_by_sibling() -> None:
    c = core(inflight_limit=5)
    a, b, d = (PolicyItem(sibling_id=sid) for sid in ("g/0", "g/0", "g/1"))
    for it in (a, b, d):
        c.enqueue(it, 0.0)
    c.plan(0.0)
    assert c.inflight_by_sibling() == {"g/0": 2, "g/1": 1}
    c.on_complete(a, Outcome.OK, 1.0)
    c.on_complete(d, Outcome.OK, 1.0)
    assert c.inflight_by_sibling() == {"g/0": 1}


def test_utilisation_is_time_weighted() -> None:
    c = core(inflight_limit=2)
    assert c.utilisation(0.0) == 0.0
    a, b = items(0, 0)
    c.enqueue(a, 0.0)
    c.enqueue(b, 0.0)
    c.plan(0.0)  # 2/2 from t=0
    c.on_complete(a, Outcome.OK, 1.0)  # 1/2 from t=1
    c.on_complete(b, Outcome.OK, 2.0)  # 0 from t=2
    assert c.utilisation(4.0) == pytest.approx((1.0 + 0.5) / 4.0)
    assert c.utilisation(4.0) == pytest.approx(0.375)  # same time: no double count


def test_item_repr_and_states() -> None:
    it = PolicyItem(turn=2, sibling_id="g/3")
    assert "turn=2" in repr(it)
    assert "'g/3'" in repr(it)
    c = core()
    c.enqueue(it, 0.0)
    assert it.state == QUEUED


def conversation_of(messages: list[dict[str, str]]) -> str:
    """The scheduler's name for the conversation that `messages` open."""
    return conversation_key(ChatRequest(model="m", messages=messages))


def test_depth_first_ties_go_to_the_conversation_served_most_recently() -> None:
    core = Planner(BatchPolicy(inflight_limit=1, decode_cap=False))
    convs = [
        conversation_of([{"role": "system", "content": "s"}, {"role": "user", "content": u}])
        for u in ("a", "b", "c")
    ]
    assert len(set(convs)) == 3
    # a, then c, then b complete a call each (in that order).
    for conv in (convs[0], convs[2], convs[1]):
        item = PolicyItem(turn=0, conversation=conv)
        core.enqueue(item, 0.0)
        (granted,) = core.plan(0.0).dispatch
        core.on_complete(granted, Outcome.OK, 0.0)
    # Their next calls, queued in a fixed order: b (most recent) first, then c, then a;
    # a deeper sibling still goes before all of them.
    items = [PolicyItem(turn=0, conversation=c) for c in convs]
    deep = PolicyItem(turn=1, conversation=("other", None))
    for item in [*items, deep]:
        core.enqueue(item, 1.0)
    order = []
    for _ in range(4):
        (granted,) = core.plan(1.0).dispatch
        order.append(granted)
        core.on_complete(granted, Outcome.OK, 1.0)
    assert order == [deep, items[1], items[2], items[0]]


def test_a_burst_of_known_conversations_is_gathered_then_sent_most_recent_first() -> None:
    core = Planner(BatchPolicy(inflight_limit=2, decode_cap=False, gather_window_s=0.01))
    convs = [
        conversation_of([{"role": "system", "content": "rules"}, {"role": "user", "content": u}])
        for u in ("agent 0", "agent 1", "agent 2")
    ]
    # Tick 1: nothing known yet, so the first call goes out at once (no window).
    first = PolicyItem(conversation=convs[0])
    assert core.try_acquire(first, 0.0)
    core.on_complete(first, Outcome.OK, 0.1)
    for conv in (convs[1], convs[2]):  # then agents 1 and 2 are served, in that order
        item = PolicyItem(conversation=conv)
        assert core.try_acquire(item, 0.2)
        core.on_complete(item, Outcome.OK, 0.3)
    # Tick 2 starts in agent order (0, 1, 2), nothing in flight: the first call of the
    # burst opens the window instead of going out, and so does everything after it.
    tick = [PolicyItem(conversation=c) for c in convs]
    assert not core.try_acquire(tick[0], 1.0)
    core.enqueue(tick[0], 1.0)
    for item in tick[1:]:
        assert not core.try_acquire(item, 1.005)
        core.enqueue(item, 1.005)
    held = core.plan(1.006)
    assert held.dispatch == []
    assert held.wake_at == pytest.approx(1.01)
    # The window closed: most recently served first (2, then 1; 0 waits for a slot).
    assert core.plan(1.011).dispatch == [tick[2], tick[1]]
    # A window is never opened while something is in flight.
    late = PolicyItem(conversation=convs[0])
    assert not core.try_acquire(late, 1.02)  # queued behind tick[0], slots full


def test_no_gather_window_with_other_priorities_or_when_off() -> None:
    conv = conversation_of([{"role": "user", "content": "x"}])
    for policy in (
        BatchPolicy(decode_cap=False, priority="fifo"),
        BatchPolicy(decode_cap=False, gather_window_s=0.0),
    ):
        core = Planner(policy)
        a = PolicyItem(conversation=conv)
        assert core.try_acquire(a, 0.0)
        core.on_complete(a, Outcome.OK, 0.1)
        assert core.try_acquire(PolicyItem(conversation=conv), 1.0)  # known, yet at once
    with pytest.raises(ValueError, match="gather_window_s"):
        BatchPolicy(gather_window_s=-1.0)


def test_a_conversation_has_one_stable_name_for_priority_and_routing() -> None:
    # Not Python's salted `hash`: every process (a distributed fan_out's workers
    # too) names a conversation alike, and a pool routes it by the same key.
    from langgraph_batch.backends.pool import affinity_key

    request = ChatRequest(
        model="m", messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    )
    assert conversation_key(request) == "prefix:5bb5788f7fa45759e9cd6c8a"
    assert affinity_key(request) == conversation_key(request)
