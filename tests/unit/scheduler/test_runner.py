"""The async Scheduler against fake backends (coordination through events, no sleeps)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from langgraph_batch._context import SiblingInfo
from langgraph_batch.backends.base import BackendCapabilities, ChatChunk, EngineMetrics
from langgraph_batch.errors import (
    BackendBadRequestError,
    BackendConnectionError,
    BackendRateLimitError,
    BackendServerError,
    BackendStreamError,
    BatchTimeoutError,
    SchedulerClosedError,
    SchedulerDeadError,
    SchedulerError,
)
from langgraph_batch.scheduler import (
    BatchPolicy,
    RetryPolicy,
    Scheduler,
    SchedulerState,
    SchedulerStats,
)
from tests.fakes.backends import (
    BatchBackend,
    GatedBackend,
    InstantBackend,
    MetricsBackend,
    request,
    response,
)

FAST = {"retry": RetryPolicy(initial_interval=0.001, max_interval=0.002)}


async def wait_for(cond: object, sched: Scheduler) -> None:
    """Yield to the loop until `cond()` holds (bounded; loop turns, not wall time)."""
    for _ in range(10_000):
        if cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0)
    raise AssertionError(f"condition never held; {sched.stats()}")


async def test_max_inflight_respected_under_200_concurrent_submits() -> None:
    backend = GatedBackend()
    async with Scheduler(backend, policy=BatchPolicy(inflight_limit=8)) as s:
        tasks = [asyncio.create_task(s.submit(request(f"r{i}"))) for i in range(200)]
        await backend.wait_running(8)
        await wait_for(lambda: s.stats().queued == 192, s)
        st = s.stats()
        assert (st.in_flight, st.inflight_limit) == (8, 8)
        backend.gate.set()
        results = await asyncio.gather(*tasks)
    assert [r.request_id for r in results] == [f"r{i}" for i in range(200)]
    assert backend.max_running == 8
    st = s.stats()
    assert st.completed == 200
    assert st.in_flight == 0
    assert st.queued == 0
    assert st.prompt_tokens == 600
    assert st.completion_tokens == 400
    assert st.cached_tokens == 200
    assert 0.0 < st.slot_utilisation <= 1.0
    assert st.latency_p50 <= st.latency_p95 <= st.latency_p99
    assert st.queue_wait_p99 > 0.0


async def test_priority_depth_first_then_fifo() -> None:
    backend = GatedBackend()
    async with Scheduler(backend, policy=BatchPolicy(inflight_limit=1)) as s:
        first = asyncio.create_task(s.submit(request("first")))
        await backend.wait_running(1)
        tasks = [
            asyncio.create_task(s.submit(request(f"t{turn}-{i}"), turn=turn))
            for i, turn in enumerate([0, 3, 1, 3])
        ]
        await wait_for(lambda: s.stats().queued == 4, s)
        backend.gate.set()
        await asyncio.gather(first, *tasks)
    assert backend.order == ["first", "t3-1", "t3-3", "t1-2", "t0-0"]


async def test_sibling_turn_is_the_default_turn_and_inflight_by_sibling() -> None:
    backend = GatedBackend()
    sib = SiblingInfo(group="g", index=4, turn=2)
    async with Scheduler(backend, policy=BatchPolicy(inflight_limit=1)) as s:
        blocker = asyncio.create_task(s.submit(request("blocker"), sibling=sib))
        await backend.wait_running(1)
        assert s.inflight_by_sibling() == {"g/4": 1}
        low = asyncio.create_task(s.submit(request("low"), turn=1))
        high = asyncio.create_task(s.submit(request("high"), sibling=sib))  # turn 2
        await wait_for(lambda: s.stats().queued == 2, s)
        backend.gate.set()
        await asyncio.gather(blocker, low, high)
        assert s.inflight_by_sibling() == {}
    assert backend.order == ["blocker", "high", "low"]


async def test_cancel_queued_request_withdraws_it() -> None:
    backend = GatedBackend()
    async with Scheduler(backend, policy=BatchPolicy(inflight_limit=1)) as s:
        first = asyncio.create_task(s.submit(request("first")))
        await backend.wait_running(1)
        queued = asyncio.create_task(s.submit(request("queued")))
        await wait_for(lambda: s.stats().queued == 1, s)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert s.stats().queued == 0
        backend.gate.set()
        await first
        assert (await s.submit(request("after"))).request_id == "after"
    assert backend.order == ["first", "after"]
    assert s.stats().cancelled == 1


async def test_cancel_in_flight_aborts_the_backend_call() -> None:
    backend = GatedBackend()
    async with Scheduler(backend, policy=BatchPolicy(inflight_limit=1)) as s:
        task = asyncio.create_task(s.submit(request("x")))
        nxt = asyncio.create_task(s.submit(request("next")))
        await backend.wait_running(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert backend.cancelled == ["x"]
        await backend.wait_started(2)  # the freed slot went to the queued request
        assert s.stats().in_flight == 1
        backend.gate.set()
        await nxt
    assert s.stats().cancelled == 1
    assert s.stats().completed == 1


async def test_cancel_after_grant_before_start_gives_the_slot_back() -> None:
    backend = GatedBackend()
    async with Scheduler(backend, policy=BatchPolicy(inflight_limit=1)) as s:
        first = asyncio.create_task(s.submit(request("first")))
        second = asyncio.create_task(s.submit(request("second")))
        third = asyncio.create_task(s.submit(request("third")))
        await wait_for(lambda: s.stats().queued == 2, s)
        # As soon as the slot is granted to `second`, cancel it before it runs.
        orig = s._core.plan

        def plan_then_cancel(now: float):  # type: ignore[no-untyped-def]
            p = orig(now)
            if any(it.payload.request.request_id == "second" for it in p.dispatch):
                second.cancel()
            return p

        s._core.plan = plan_then_cancel  # type: ignore[method-assign]
        backend.gate.set()
        await first
        with pytest.raises(asyncio.CancelledError):
            await second
        await third
    assert backend.order == ["first", "third"]
    assert s.stats().in_flight == 0


async def test_runner_death_fails_every_waiter_and_new_work() -> None:
    backend = GatedBackend()
    s = Scheduler(backend, policy=BatchPolicy(inflight_limit=1))
    first = asyncio.create_task(s.submit(request("first")))
    await backend.wait_running(1)
    waiters = [asyncio.create_task(s.submit(request(f"w{i}"))) for i in range(5)]
    await wait_for(lambda: s.stats().queued == 5, s)
    boom = RuntimeError("policy bug")

    def broken_plan(now: float) -> None:
        raise boom

    s._core.plan = broken_plan  # type: ignore[assignment,method-assign]
    backend.gate.set()  # first finishes, its release wakes the runner, plan raises
    assert (await first).request_id == "first"
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, SchedulerDeadError) for r in results)
    assert all(r.cause is boom for r in results)  # type: ignore[union-attr]
    assert "policy bug" in str(results[0])
    assert s.state is SchedulerState.DEAD
    with pytest.raises(SchedulerDeadError) as info:
        await s.submit(request("late"))
    assert info.value.cause is boom
    assert info.value.__cause__ is boom
    await s.aclose()
    assert s.state is SchedulerState.CLOSED


async def test_closed_scheduler_refuses_work_and_cannot_reopen() -> None:
    backend = GatedBackend()
    s = Scheduler(backend, policy=BatchPolicy(inflight_limit=1), name="closing")
    assert s.state is SchedulerState.UNOPENED
    async with s:
        assert s.state is SchedulerState.OPENED
        first = asyncio.create_task(s.submit(request("first")))
        await backend.wait_running(1)
        queued = asyncio.create_task(s.submit(request("queued")))
        await wait_for(lambda: s.stats().queued == 1, s)
    assert s.state is SchedulerState.CLOSED
    with pytest.raises(SchedulerClosedError, match="'closing' is closed"):
        await queued
    backend.gate.set()
    assert (await first).request_id == "first"  # on the wire: runs to completion
    with pytest.raises(SchedulerClosedError):
        await s.submit(request("late"))
    with pytest.raises(SchedulerClosedError, match="cannot be reopened"):
        async with s:
            pass
    await s.aclose()  # idempotent


async def test_lazy_start_and_owned_backend_closed() -> None:
    closed = asyncio.Event()

    class Closing(InstantBackend):
        async def aclose(self) -> None:
            closed.set()

    s = Scheduler(Closing(), owns_backend=True)
    assert s._runner is None  # nothing started in __init__
    await s.submit(request("a"))
    assert s.state is SchedulerState.OPENED
    assert s._runner is not None
    async with s:  # entering a lazily started scheduler is fine
        pass
    assert closed.is_set()
    assert "CLOSED" in repr(s)


async def test_scheduler_is_bound_to_its_loop() -> None:
    s = Scheduler(InstantBackend())
    await s.submit(request("a"))

    def other_loop() -> None:
        asyncio.run(s.submit(request("b")))

    with pytest.raises(SchedulerError, match="another event loop"):
        await asyncio.to_thread(other_loop)
    await s.aclose()


async def test_retries_with_backoff_then_success() -> None:
    backend = GatedBackend(open_gate=True)
    backend.failures["r"] = [BackendServerError("500", status_code=500)] * 2
    async with Scheduler(backend, policy=BatchPolicy(**FAST)) as s:
        assert (await s.submit(request("r"))).request_id == "r"
    assert backend.order == ["r", "r", "r"]
    st = s.stats()
    assert (st.retries, st.completed, st.failed) == (2, 1, 0)


async def test_out_of_retries_and_non_retryable_raise() -> None:
    backend = GatedBackend(open_gate=True)
    backend.failures["r"] = [BackendServerError("500", status_code=500)] * 5
    backend.failures["bad"] = [BackendBadRequestError("400", status_code=400)]
    async with Scheduler(backend, policy=BatchPolicy(**FAST)) as s:
        with pytest.raises(BackendServerError):
            await s.submit(request("r"), max_retries=1)
        with pytest.raises(BackendBadRequestError):
            await s.submit(request("bad"))
    assert backend.order == ["r", "r", "bad"]
    assert s.stats().failed == 2
    assert s.stats().retries == 1


async def test_429_retry_after_honoured_and_no_slot_held_while_backing_off() -> None:
    backend = GatedBackend(open_gate=True)
    backend.failures["a"] = [BackendRateLimitError("429", status_code=429, retry_after_s=0.05)]
    policy = BatchPolicy(inflight_limit=1, adapt_cooldown_s=0.0, **FAST)
    async with Scheduler(backend, policy=policy) as s:
        stamps: dict[str, list[float]] = {}
        orig = backend.chat

        async def timed(req, *, on_chunk=None):  # type: ignore[no-untyped-def]
            stamps.setdefault(req.request_id, []).append(time.monotonic())
            return await orig(req, on_chunk=on_chunk)

        backend.chat = timed  # type: ignore[method-assign]
        a = asyncio.create_task(s.submit(request("a")))
        b = asyncio.create_task(s.submit(request("b")))
        await asyncio.gather(a, b)
        # 429 shrinks the limit towards the floor (1 already: stays 1).
        assert s.stats().inflight_limit == 1
    assert backend.order == ["a", "b", "a"]  # b ran while a backed off
    assert stamps["a"][1] - stamps["a"][0] >= 0.05


async def test_streaming_chunks_pass_through_and_no_retry_after_chunks() -> None:
    backend = GatedBackend(open_gate=True)
    backend.chunks["s"] = [ChatChunk(content="he"), ChatChunk(content="llo")]
    backend.chunks["broken"] = [ChatChunk(content="x")]
    backend.failures["broken"] = [BackendStreamError("cut", chunks_received=1)]
    got: list[str] = []
    async with Scheduler(backend, policy=BatchPolicy(**FAST)) as s:
        await s.submit(request("s", stream=True), on_chunk=lambda c: got.append(c.content))
        assert got == ["he", "llo"]
        with pytest.raises(BackendStreamError):
            await s.submit(request("broken", stream=True), on_chunk=lambda c: None)
    assert backend.order.count("broken") == 1


async def test_a_stream_that_fails_before_its_first_content_is_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = GatedBackend(open_gate=True)
    # The role-only first event (no content) reached the callback, then the stream died.
    backend.chunks["early"] = [ChatChunk(content="")]
    backend.failures["early"] = [BackendStreamError("cut", chunks_received=1)]
    got: list[str] = []
    caplog.set_level("INFO", logger="langgraph_batch.scheduler._retry")
    async with Scheduler(backend, policy=BatchPolicy(**FAST)) as s:
        info = SiblingInfo(group="g", index=7)
        resp = await s.submit(
            request("early", stream=True), on_chunk=lambda c: got.append(c.content), sibling=info
        )
        assert resp.content == "answer to early"
        assert s.stats().retries == 1
    assert backend.order == ["early", "early"]
    retry = [r for r in caplog.records if r.levelname == "INFO" and "retry 1 of" in r.message]
    assert len(retry) == 1
    rec = retry[0]
    assert (rec.request_id, rec.sibling_index, rec.error_type) == ("early", 7, "BackendStreamError")  # type: ignore[attr-defined]
    assert "(sibling 7)" in rec.message


async def test_a_final_failure_logs_a_warning_with_its_sibling(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = GatedBackend(open_gate=True)
    backend.failures["f"] = [BackendServerError("boom", status_code=500)] * 3
    async with Scheduler(backend, policy=BatchPolicy(**FAST)) as s:
        with pytest.raises(BackendServerError):
            await s.submit(request("f"), sibling=SiblingInfo(group="g", index=3))
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    rec = warnings[0]
    assert (rec.request_id, rec.sibling_index, rec.error_type, rec.attempt) == (  # type: ignore[attr-defined]
        "f",
        3,
        "BackendServerError",
        2,
    )
    assert "after 2 retries" in rec.message


async def test_timeout_covers_queue_wait() -> None:
    backend = GatedBackend()
    async with Scheduler(backend, policy=BatchPolicy(inflight_limit=1)) as s:
        first = asyncio.create_task(s.submit(request("first")))
        await backend.wait_running(1)
        with pytest.raises(BatchTimeoutError) as info:
            await s.submit(request("late"), timeout=0.02)
        err = info.value
        assert err.timeout_s == 0.02
        assert err.request_id == "late"
        assert err.queued_s >= 0.015
        assert "waiting for a slot" in str(err)
        assert s.stats().queued == 0
        backend.gate.set()
        await first
    st = s.stats()
    assert (st.timed_out, st.failed, st.cancelled) == (1, 1, 0)
    with pytest.raises(ValueError, match="timeout=0"):
        await Scheduler(backend).submit(request("x"), timeout=0)


async def test_a_failed_batch_member_fails_only_its_caller() -> None:
    class Settled(BatchBackend):
        async def complete_batch_settled(self, requests):  # type: ignore[no-untyped-def]
            self.batches.append([r.request_id for r in requests])
            return [
                BackendBadRequestError("too long", status_code=400)
                if r.request_id == "bad"
                else response(r)
                for r in requests
            ]

    backend = Settled(open_gate=True)
    policy = BatchPolicy(batch_window_s=0.05, max_batch_size=8, **FAST)
    async with Scheduler(backend, policy=policy) as s:
        results = await asyncio.gather(
            *(s.submit(request(r, batchable=True)) for r in ("a", "bad", "b")),
            return_exceptions=True,
        )
    assert backend.batches == [["a", "bad", "b"]]
    assert isinstance(results[1], BackendBadRequestError)
    assert [getattr(r, "content", None) for r in results] == ["answer to a", None, "answer to b"]
    st = s.stats()
    assert (st.completed, st.failed, st.in_flight) == (2, 1, 0)


async def test_batching_collects_within_the_window() -> None:
    backend = BatchBackend(open_gate=True)
    policy = BatchPolicy(batch_window_s=0.05, max_batch_size=4)
    async with Scheduler(backend, policy=policy) as s:
        results = await asyncio.gather(
            *(s.submit(request(f"b{i}", batchable=True)) for i in range(10))
        )
        await s.submit(request("plain"))
    assert [r.request_id for r in results] == [f"b{i}" for i in range(10)]
    assert sorted(len(b) for b in backend.batches) == [2, 4, 4]
    assert backend.order == ["plain"]  # not batchable: went alone
    st = s.stats()
    assert (st.batches, st.batch_size_max) == (3, 4)
    assert st.batch_size_mean == pytest.approx(10 / 3)


async def test_batch_failure_is_retried_per_member_and_cancelled_member_dropped() -> None:
    backend = BatchBackend()
    backend.batch_failures.append(BackendServerError("503", status_code=503))
    policy = BatchPolicy(batch_window_s=0.001, max_batch_size=8, **FAST)
    async with Scheduler(backend, policy=policy) as s:
        tasks = [asyncio.create_task(s.submit(request(f"b{i}", batchable=True))) for i in range(3)]
        while len(backend.batches) < 2:  # failed batch, then the retry batch (gate closed)
            backend.changed.clear()
            await backend.changed.wait()
        tasks[0].cancel()
        backend.gate.set()
        done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    assert [r.request_id for r in done[1:]] == ["b1", "b2"]  # type: ignore[union-attr]
    assert s.stats().retries == 3
    assert s.stats().in_flight == 0


async def test_closing_cancels_batches_in_flight() -> None:
    backend = BatchBackend()
    s = Scheduler(backend, policy=BatchPolicy(batch_window_s=0.001))
    task = asyncio.create_task(s.submit(request("b", batchable=True)))
    while not backend.batches:
        backend.changed.clear()
        await backend.changed.wait()
    await s.aclose()
    with pytest.raises(SchedulerClosedError):
        await task


async def test_metrics_polled_and_limit_grows() -> None:
    backend = MetricsBackend(EngineMetrics(num_requests_waiting=0, num_preemptions_total=0))
    policy = BatchPolicy(
        inflight_limit=2, inflight_cap=6, increase_step=2, metrics_interval_s=0.001
    )
    async with Scheduler(backend, policy=policy) as s:
        tasks = [asyncio.create_task(s.submit(request(f"r{i}"))) for i in range(20)]
        await backend.wait_running(6)  # grew 2 -> 4 -> 6 (cap)
        assert s.stats().inflight_limit == 6
        assert s.latest_metrics is backend.metrics_value
        backend.gate.set()
        await asyncio.gather(*tasks)
    assert backend.max_running == 6


async def test_first_metrics_poll_is_immediate_and_grows_once_per_sample() -> None:
    # A 60 s interval: only the poll made when the runner starts can act.
    backend = MetricsBackend(EngineMetrics(num_requests_waiting=0, num_preemptions_total=0))
    policy = BatchPolicy(
        inflight_limit=16, inflight_cap=16, initial_inflight=2, metrics_interval_s=60.0
    )
    async with Scheduler(backend, policy=policy) as s:
        tasks = [asyncio.create_task(s.submit(request(f"r{i}"))) for i in range(10)]
        await backend.wait_running(4)  # slow start: 2 -> 4 on the first sample
        await wait_for(lambda: s.stats().queued == 6, s)
        assert backend.polls == 1
        assert (s.stats().inflight_limit, s.stats().in_flight) == (4, 4)
        backend.gate.set()
        await asyncio.gather(*tasks)
    assert backend.max_running == 4


async def test_stats_snapshot_is_frozen_and_empty_at_start() -> None:
    s = Scheduler(InstantBackend(), policy=BatchPolicy(inflight_limit=3))
    st = s.stats()
    assert isinstance(st, SchedulerStats)
    assert (st.completed, st.inflight_limit, st.latency_p99, st.batch_size_mean) == (0, 3, 0.0, 0.0)
    with pytest.raises(AttributeError):
        st.completed = 5  # type: ignore[misc]
    assert s.latest_metrics is None
    await s.aclose()


async def test_priority_passed_to_engines_that_honour_it() -> None:
    seen: list[int] = []

    class Prio(InstantBackend):
        capabilities = BackendCapabilities(priority=True)

        async def chat(self, req, *, on_chunk=None):  # type: ignore[no-untyped-def]
            seen.append(req.priority)
            return await super().chat(req, on_chunk=on_chunk)

    async with Scheduler(Prio()) as s:
        await s.submit(request("a"), turn=3)
        await s.submit(dataclasses.replace(request("b"), priority=7), turn=3)  # caller's wins
    async with Scheduler(Prio(), policy=BatchPolicy(priority="fifo")) as s:
        await s.submit(request("c"), turn=3)
    assert seen == [-3, 7, 0]


async def test_metrics_errors_are_ignored_but_a_policy_failure_kills_the_runner() -> None:
    backend = MetricsBackend(EngineMetrics(num_requests_waiting=5))  # busy: no growth
    calls = 0
    orig = backend.metrics

    async def flaky() -> EngineMetrics | None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise BackendConnectionError("metrics endpoint down")
        return await orig()

    backend.metrics = flaky  # type: ignore[method-assign]
    s = Scheduler(backend, policy=BatchPolicy(inflight_limit=1, metrics_interval_s=0.001))
    first = asyncio.create_task(s.submit(request("first")))
    await backend.wait_running(1)
    queued = asyncio.create_task(s.submit(request("queued")))
    while backend.polls < 2:  # the failed poll did not stop polling
        backend.changed.clear()
        await backend.changed.wait()
    boom = ZeroDivisionError("bad metrics maths")

    def broken(metrics: EngineMetrics, now: float) -> None:
        raise boom

    s._core.on_metrics = broken  # type: ignore[method-assign]
    with pytest.raises(SchedulerDeadError) as info:
        await queued
    assert info.value.cause is boom
    assert s.state is SchedulerState.DEAD
    backend.gate.set()
    assert (await first).request_id == "first"
    await s.aclose()


async def test_random_cancellations_never_leak_slots() -> None:
    import random

    rng = random.Random(7)

    class Jittery(GatedBackend):
        async def chat(self, req, *, on_chunk=None):  # type: ignore[no-untyped-def]
            self._bump(+1)
            try:
                for _ in range(rng.randrange(4)):
                    await asyncio.sleep(0)
                return response(req)
            finally:
                self._bump(-1)

    backend = Jittery()
    policy = BatchPolicy(inflight_limit=8, priority="las")
    async with Scheduler(backend, policy=policy) as s:
        sibs = [SiblingInfo(group="g", index=i % 10) for i in range(200)]
        tasks = [
            asyncio.create_task(s.submit(request(f"r{i}"), sibling=sibs[i])) for i in range(200)
        ]
        victims = rng.sample(tasks, 60)
        for v in victims:
            for _ in range(rng.randrange(6)):
                await asyncio.sleep(0)
            v.cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        st = s.stats()
        assert st.in_flight == 0
        assert st.queued == 0
        assert s.inflight_by_sibling() == {}
    n_cancelled = sum(isinstance(d, asyncio.CancelledError) for d in done)
    assert n_cancelled > 0
    assert st.completed + n_cancelled == 200
    assert st.cancelled == n_cancelled
    assert backend.max_running <= 8


async def test_decode_cap_holds_agent_requests_once_the_engine_counts_tokens() -> None:
    backend = MetricsBackend(
        EngineMetrics(num_requests_waiting=0, num_preemptions_total=0, generation_tokens_total=0)
    )
    s = Scheduler(backend, policy=BatchPolicy(inflight_limit=64))
    assert s.stats().decode_cap == 16  # provisional until the engine's first sample
    async with s:
        await wait_for(lambda: backend.polls >= 1, s)
        assert s.stats().decode_cap == 16
        tasks = [asyncio.create_task(s.submit(request(f"r{i}"))) for i in range(16)]
        await backend.wait_running(16)
        # A one-shot request is not held by the cap; agent requests are.
        tasks.append(asyncio.create_task(s.submit(request("x", batchable=True))))
        await backend.wait_running(17)
        tasks += [asyncio.create_task(s.submit(request(f"q{i}"))) for i in range(8)]
        await wait_for(lambda: s.stats().queued == 8, s)
        assert backend.running == 17
        backend.gate.set()
        await asyncio.gather(*tasks)
    assert backend.max_running == 17


async def test_decode_cap_rounds_up_for_what_a_fan_out_run_has_left() -> None:
    backend = MetricsBackend(
        EngineMetrics(num_requests_waiting=0, num_preemptions_total=0, generation_tokens_total=0)
    )
    async with Scheduler(backend, policy=BatchPolicy(inflight_limit=64)) as s:
        await wait_for(lambda: backend.polls >= 1, s)
        siblings = [SiblingInfo(group="g", index=i, total=20, left=lambda: 20) for i in range(20)]
        tasks = [
            asyncio.create_task(s.submit(request(f"r{i}"), sibling=sib))
            for i, sib in enumerate(siblings)
        ]
        await backend.wait_running(20)  # 20 left: one wave, not 16 and then 4
        backend.gate.set()
        await asyncio.gather(*tasks)
    assert backend.max_running == 20


async def test_the_scheduler_owns_the_servers_kv_capacity() -> None:
    from langgraph_batch.errors import BackendConnectionError
    from tests.fakes.backends import MetricsBackend

    # Not polled yet: one metrics call answers, then the polled sample does.
    backend = MetricsBackend(EngineMetrics(kv_capacity_tokens=40_000), open_gate=True)
    scheduler = Scheduler(backend)
    assert await scheduler.kv_capacity() == 40_000
    assert backend.polls == 1
    # A server that cannot be reached, or does not say, has an unknown capacity.
    broken = MetricsBackend(EngineMetrics(), open_gate=True)

    async def refuse() -> EngineMetrics:
        raise BackendConnectionError("refused")

    broken.metrics = refuse  # type: ignore[method-assign]
    assert await Scheduler(broken).kv_capacity() is None
    assert await Scheduler(MetricsBackend(EngineMetrics(), open_gate=True)).kv_capacity() is None


async def test_the_scheduler_owns_one_kv_ledger_for_every_run() -> None:
    from tests.fakes.backends import MetricsBackend

    scheduler = Scheduler(MetricsBackend(EngineMetrics(kv_capacity_tokens=40_000), open_gate=True))
    first, again = await asyncio.gather(scheduler.kv_ledger(), scheduler.kv_ledger())
    assert first is not None
    assert first is again
    assert first.capacity == 40_000
    assert await scheduler.kv_ledger() is first
    unknown = Scheduler(MetricsBackend(EngineMetrics(), open_gate=True))
    assert await unknown.kv_ledger() is None
