"""The LangGraph-free coalescing core: single flight, stored results, limits, cancellation."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from langgraph_batch.tools._singleflight import Coalescer, RateLimiter


class FakeClock:
    """A monotonic clock the test moves; `sleep` advances it instead of waiting."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        target = self.now + seconds
        await asyncio.sleep(0)
        self.now = max(self.now, target)


async def until(predicate: Callable[[], bool]) -> None:
    """Yield to the loop until `predicate()` holds (bounded: no wall-clock waits)."""
    for _ in range(10_000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


class Gate:
    """A counted, gated async function: records calls, blocks until opened."""

    def __init__(self, value: Any = "v") -> None:
        self.calls = 0
        self.opened = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = 0
        self.value = value

    def fn(self, value: Any = None) -> Callable[[], Awaitable[Any]]:
        async def run() -> Any:
            self.calls += 1
            self.started.set()
            try:
                await self.opened.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            return self.value if value is None else value

        return run


async def test_fifty_concurrent_identical_calls_execute_once() -> None:
    c: Coalescer[str] = Coalescer()
    gate = Gate("result")
    tasks = [asyncio.create_task(c.run("k", gate.fn())) for _ in range(50)]
    await until(lambda: c.waiting("k") == 50)
    assert c.inflight() == 1
    gate.opened.set()
    results = await asyncio.gather(*tasks)
    assert gate.calls == 1
    assert results == ["result"] * 50
    assert c.inflight() == 0


async def test_different_keys_execute_separately() -> None:
    c: Coalescer[str] = Coalescer()
    gate = Gate()
    tasks = [asyncio.create_task(c.run(("k", i % 5), gate.fn(f"v{i % 5}"))) for i in range(20)]
    await until(lambda: c.inflight() == 5)
    gate.opened.set()
    results = await asyncio.gather(*tasks)
    assert gate.calls == 5
    assert results == [f"v{i % 5}" for i in range(20)]


async def test_cancelled_leader_does_not_fail_followers() -> None:
    c: Coalescer[str] = Coalescer()
    gate = Gate("shared")
    leader = asyncio.create_task(c.run("k", gate.fn()))
    await gate.started.wait()
    followers = [asyncio.create_task(c.run("k", gate.fn())) for _ in range(3)]
    await until(lambda: c.waiting("k") == 4)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert c.waiting("k") == 3
    gate.opened.set()
    assert await asyncio.gather(*followers) == ["shared"] * 3
    assert gate.calls == 1
    assert gate.cancelled == 0


async def test_all_waiters_cancelled_cancels_execution() -> None:
    c: Coalescer[str] = Coalescer()
    gate = Gate()
    tasks = [asyncio.create_task(c.run("k", gate.fn())) for _ in range(3)]
    await until(lambda: c.waiting("k") == 3)
    for t in tasks:
        t.cancel()
    for t in tasks:
        with pytest.raises(asyncio.CancelledError):
            await t
    await until(lambda: gate.cancelled == 1)
    assert c.inflight() == 0
    # A later caller starts a fresh execution.
    gate.opened.set()
    assert await c.run("k", gate.fn("fresh")) == "fresh"
    assert gate.calls == 2


async def test_error_shared_by_default() -> None:
    c: Coalescer[str] = Coalescer()
    opened = asyncio.Event()
    calls = 0

    async def boom() -> str:
        nonlocal calls
        calls += 1
        await opened.wait()
        raise LookupError("down")

    tasks = [asyncio.create_task(c.run("k", boom)) for _ in range(5)]
    await until(lambda: c.waiting("k") == 5)
    opened.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert calls == 1
    assert all(isinstance(r, LookupError) for r in results)
    # Errors are never stored: the next call runs again.
    with pytest.raises(LookupError):
        await c.run("k", boom, scope="run")
    assert calls == 2


async def test_error_not_shared_followers_run_themselves() -> None:
    c: Coalescer[str] = Coalescer(share_errors=False)
    opened = asyncio.Event()
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        await opened.wait()
        if calls == 1:
            raise LookupError("first attempt fails")
        return "ok"

    tasks = [asyncio.create_task(c.run("k", flaky)) for _ in range(5)]
    await until(lambda: c.waiting("k") == 5)
    opened.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], LookupError)  # the leader's own error
    assert results[1:] == ["ok"] * 4  # one follower re-ran, the others joined it
    assert calls == 2


async def test_share_exception_predicate_keeps_exception_private() -> None:
    c: Coalescer[str] = Coalescer()
    opened = asyncio.Event()
    calls = 0

    async def fn() -> str:
        nonlocal calls
        calls += 1
        await opened.wait()
        if calls == 1:
            raise KeyError("mine")
        return "theirs"

    tasks = [asyncio.create_task(c.run("k", fn, share_exception=lambda e: False)) for _ in range(3)]
    await until(lambda: c.waiting("k") == 3)
    opened.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], KeyError)
    assert results[1:] == ["theirs", "theirs"]


async def test_unshareable_result_goes_to_its_caller_only() -> None:
    c: Coalescer[tuple[str, int]] = Coalescer()
    opened = asyncio.Event()
    calls = 0

    async def fn() -> tuple[str, int]:
        nonlocal calls
        calls += 1
        await opened.wait()
        return ("private", calls)

    tasks = [
        asyncio.create_task(c.run("k", fn, scope="g", shareable=lambda r: False)) for _ in range(3)
    ]
    await until(lambda: c.waiting("k", scope="g") == 3)
    opened.set()
    results = await asyncio.gather(*tasks)
    # Each caller ran its own execution (followers single-flight again, one by one).
    assert sorted(n for _, n in results) == [1, 2, 3]
    assert calls == 3
    assert c.lookup("k", scope="g") is Coalescer.MISS


async def test_error_result_shared_in_flight_but_not_stored() -> None:
    c: Coalescer[str] = Coalescer()
    gate = Gate("error!")
    tasks = [
        asyncio.create_task(c.run("k", gate.fn(), scope="g", is_error=lambda r: r == "error!"))
        for _ in range(3)
    ]
    await until(lambda: c.waiting("k", scope="g") == 3)
    gate.opened.set()
    assert await asyncio.gather(*tasks) == ["error!"] * 3
    assert gate.calls == 1
    assert await c.run("k", gate.fn("fine"), scope="g", is_error=lambda r: r == "error!") == "fine"
    assert gate.calls == 2


async def test_error_result_not_shared_when_disabled() -> None:
    c: Coalescer[str] = Coalescer(share_errors=False)
    gate = Gate()
    outcomes = iter(["error!", "ok", "ok"])

    def fn() -> Callable[[], Awaitable[str]]:
        async def run() -> str:
            gate.calls += 1
            await gate.opened.wait()
            return next(outcomes)

        return run

    tasks = [
        asyncio.create_task(c.run("k", fn(), is_error=lambda r: r == "error!")) for _ in range(3)
    ]
    await until(lambda: c.waiting("k") == 3)
    gate.opened.set()
    assert await asyncio.gather(*tasks) == ["error!", "ok", "ok"]
    assert gate.calls == 2


async def test_keep_reuses_completed_results_of_the_same_scope_only() -> None:
    c: Coalescer[str] = Coalescer()
    calls = 0

    async def fn() -> str:
        nonlocal calls
        calls += 1
        return f"v{calls}"

    assert await c.run("k", fn, scope="run-1", keep=True) == "v1"
    assert await c.run("k", fn, scope="run-1", keep=True) == "v1"  # a late sibling of the run
    assert calls == 1
    assert await c.run("k", fn, scope="run-2", keep=True) == "v2"  # another run
    assert await c.run("k", fn, scope="run-1") == "v3"  # in-flight only: nothing reused
    assert await c.run("k", fn) == "v4"
    assert await c.run("k", fn) == "v5"
    c.forget_scope("run-1")
    assert await c.run("k", fn, scope="run-1", keep=True) == "v6"
    assert calls == 6


async def test_concurrent_calls_of_two_scopes_never_share() -> None:
    c: Coalescer[str] = Coalescer()
    gate = Gate()
    a = [asyncio.create_task(c.run("k", gate.fn("a"), scope="run-a")) for _ in range(3)]
    b = [asyncio.create_task(c.run("k", gate.fn("b"), scope="run-b")) for _ in range(2)]
    await until(lambda: c.waiting("k") == 5)
    assert (c.waiting("k", scope="run-a"), c.waiting("k", scope="run-b")) == (3, 2)
    assert c.inflight() == 2
    gate.opened.set()
    assert await asyncio.gather(*a) == ["a"] * 3
    assert await asyncio.gather(*b) == ["b"] * 2
    assert gate.calls == 2


async def test_scopes_are_bounded_lru() -> None:
    c: Coalescer[int] = Coalescer(max_scopes=2)
    calls = 0

    async def fn() -> int:
        nonlocal calls
        calls += 1
        return calls

    for scope in ("a", "b", "c"):
        await c.run("k", fn, scope=scope, keep=True)
    assert c.lookup("k", scope="a") is Coalescer.MISS
    assert c.lookup("k", scope="c") == 3
    assert c.stored_scopes() == 2


async def test_ttl_expiry_with_injected_clock() -> None:
    clock = FakeClock()
    c: Coalescer[int] = Coalescer(ttl=10.0, clock=clock)
    calls = 0

    async def fn() -> int:
        nonlocal calls
        calls += 1
        return calls

    assert await c.run("k", fn, scope="s", keep=True) == 1
    clock.now = 9.99
    assert await c.run("k", fn, scope="s", keep=True) == 1  # within the TTL
    assert await c.run("k", fn, scope="other-run", keep=True) == 2  # never across scopes
    clock.now = 10.0
    assert await c.run("k", fn, scope="s", keep=True) == 3  # expired
    assert calls == 3
    c.clear()
    assert await c.run("k", fn, scope="s", keep=True) == 4


async def test_expired_results_are_swept_from_a_long_lived_scope() -> None:
    clock = FakeClock()
    c: Coalescer[int] = Coalescer(ttl=1.0, clock=clock)

    async def fn() -> int:
        return 0

    for i in range(255):
        await c.run(i, fn, scope="global", keep=True)
    clock.now = 5.0
    await c.run("last", fn, scope="global", keep=True)  # the 256th insert sweeps
    assert c.lookup("last", scope="global") == 0
    assert len(c._scopes["global"]) == 1


async def test_an_abandoned_execution_that_fails_is_not_reported_unretrieved() -> None:
    c: Coalescer[str] = Coalescer()
    started = asyncio.Event()
    unretrieved: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: unretrieved.append(ctx))

    async def fn() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("cleanup failed")

    caller = asyncio.create_task(c.run("k", fn))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await until(lambda: c.inflight() == 0)
    for _ in range(10):
        await asyncio.sleep(0)
    import gc

    gc.collect()
    loop.set_exception_handler(None)
    assert not [u for u in unretrieved if "never retrieved" in str(u.get("message"))]


async def test_max_concurrency_respected() -> None:
    c: Coalescer[int] = Coalescer(max_concurrency=3)
    opened = asyncio.Event()
    active = peak = done = 0

    def fn(i: int) -> Callable[[], Awaitable[int]]:
        async def run() -> int:
            nonlocal active, peak, done
            active += 1
            peak = max(peak, active)
            await opened.wait()
            active -= 1
            done += 1
            return i

        return run

    tasks = [asyncio.create_task(c.run(i, fn(i))) for i in range(10)]
    await until(lambda: active == 3 and c.inflight() == 10)
    opened.set()
    assert await asyncio.gather(*tasks) == list(range(10))
    assert peak == 3
    assert done == 10


async def test_rate_limit_respected_with_injected_clock() -> None:
    clock = FakeClock()
    c: Coalescer[int] = Coalescer(rate_limit=10.0, clock=clock, sleep=clock.sleep)
    starts: list[float] = []

    def fn(i: int) -> Callable[[], Awaitable[int]]:
        async def run() -> int:
            starts.append(clock.now)
            return i

        return run

    assert await asyncio.gather(*(c.run(i, fn(i)) for i in range(5))) == list(range(5))
    assert starts == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert all(b - a >= 0.1 - 1e-9 for a, b in itertools.pairwise(starts))


async def test_rate_limiter_burst_and_idle_refill() -> None:
    clock = FakeClock()
    limiter = RateLimiter(2.0, burst=3, clock=clock, sleep=clock.sleep)
    assert [limiter.reserve() for _ in range(4)] == pytest.approx([0.0, 0.0, 0.0, 0.5])
    clock.now = 10.0  # long idle: the burst is available again, never more
    assert [limiter.reserve() for _ in range(4)] == pytest.approx([0.0, 0.0, 0.0, 0.5])
    await limiter.acquire()
    assert clock.sleeps == pytest.approx([1.0])


async def test_execution_cancelling_itself_is_not_shared() -> None:
    c: Coalescer[str] = Coalescer()
    opened = asyncio.Event()
    calls = 0

    async def fn() -> str:
        nonlocal calls
        calls += 1
        await opened.wait()
        if calls == 1:
            raise asyncio.CancelledError
        return "second"

    leader = asyncio.create_task(c.run("k", fn))
    await until(lambda: calls == 1)
    follower = asyncio.create_task(c.run("k", fn))
    await until(lambda: c.waiting("k") == 2)
    opened.set()
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert await follower == "second"


def test_rejects_bad_limits() -> None:
    with pytest.raises(ValueError, match="ttl"):
        Coalescer(ttl=0)
    with pytest.raises(ValueError, match="max_concurrency"):
        Coalescer(max_concurrency=0)
    with pytest.raises(ValueError, match="rate_limit"):
        Coalescer(rate_limit=-1)
    with pytest.raises(ValueError, match="max_scopes"):
        Coalescer(max_scopes=0)
    with pytest.raises(ValueError, match="burst"):
        RateLimiter(1.0, burst=0)


def test_state_is_per_event_loop() -> None:
    c: Coalescer[int] = Coalescer(max_concurrency=1)

    async def one() -> int:
        async def fn() -> int:
            return 1

        return await c.run("k", fn)

    # The semaphore of one loop is never used by another (asyncio primitives are loop-bound).
    assert asyncio.run(one()) == 1
    assert asyncio.run(one()) == 1


async def test_a_cancelled_rate_limited_caller_gives_its_start_back() -> None:
    clock = FakeClock()
    gate = asyncio.Event()

    async def sleep(seconds: float) -> None:
        clock.sleeps.append(seconds)
        await gate.wait()
        clock.now += seconds

    limiter = RateLimiter(1.0, clock=clock, sleep=sleep)
    await limiter.acquire()  # starts at once
    waiting = asyncio.create_task(limiter.acquire())  # reserved t=1.0
    await until(lambda: len(clock.sleeps) == 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    # The next caller gets the start the cancelled one gave back: t=1.0, not 2.0.
    assert limiter.reserve() == pytest.approx(1.0)
