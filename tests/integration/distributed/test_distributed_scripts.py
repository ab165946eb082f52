"""The Redis primitives on their own, against a real redis-server: fencing, dead letters,
idempotent publishing, the in-flight semaphore and the cross-worker single flight."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from langgraph_batch.distributed import RedisFlightStore, RedisSemaphore
from langgraph_batch.distributed._keys import GROUP, RunKeys, new_run_id
from langgraph_batch.distributed._redis import connect
from langgraph_batch.distributed._scripts import Scripts
from langgraph_batch.distributed._serde import Serde
from tests.integration.distributed.conftest import RedisProc

pytestmark = pytest.mark.anyio

TTL = 60_000


@pytest.fixture
async def client(start_redis: Callable[..., RedisProc]) -> AsyncIterator[Any]:
    redis = await asyncio.to_thread(start_redis)
    c = connect(redis.url)
    try:
        yield c
    finally:
        await c.aclose()


async def _run_with_jobs(client: Any, jobs: dict[str, bytes]) -> tuple[RunKeys, Scripts]:
    keys, scripts = RunKeys(new_run_id()), Scripts(client)
    await client.hset(keys.meta, mapping={"sentinel": "1"})
    args: list[Any] = [GROUP, TTL]
    for job, payload in jobs.items():
        args += [job, payload]
    await scripts.publish(keys=keys.all(), args=args)
    return keys, scripts


async def test_a_paused_owner_is_fenced_off(client: Any) -> None:
    keys, s = await _run_with_jobs(client, {"0": b"in"})
    job_keys = [keys.jobs, keys.results, keys.events]
    got = await client.xreadgroup(GROUP, "a", {keys.jobs: ">"}, count=1)
    entry = got[0][1][0][0]
    assert await s.start(keys=job_keys, args=[GROUP, "a", entry, "0", TTL]) == 1
    # "a" stops heartbeating; past the lease (50 ms here) "b" takes the job over.
    await asyncio.sleep(0.1)
    claimed = await s.claim(
        keys=[keys.jobs, keys.results, keys.events, keys.dead], args=[GROUP, "b", 50, 3, TTL]
    )
    assert claimed[0] == entry
    assert claimed[1] == b"0"
    assert claimed[3] == 2
    # a's heartbeat reports the job lost, a's late completion is rejected...
    assert await s.heartbeat(keys=[keys.jobs], args=[GROUP, "a", entry]) == [entry]
    assert await s.complete(keys=job_keys, args=[GROUP, "a", entry, "0", b"late", TTL]) == -1
    assert await client.hget(keys.results, "0") is None
    # ... b's heartbeat keeps it, b's completion wins, and a second one is a duplicate.
    assert await s.heartbeat(keys=[keys.jobs], args=[GROUP, "b", entry]) == []
    assert await s.complete(keys=job_keys, args=[GROUP, "b", entry, "0", b"first", TTL]) == 1
    assert await client.hget(keys.results, "0") == b"first"
    assert await s.complete(keys=job_keys, args=[GROUP, "b", entry, "0", b"again", TTL]) == -1
    assert await client.xpending(keys.jobs, GROUP) == {
        "pending": 0,
        "min": None,
        "max": None,
        "consumers": [],
    }
    kinds = [f[b"kind"] for _, f in await client.xrange(keys.events)]
    assert kinds == [b"started", b"done"]
    for key in (keys.results, keys.events, keys.jobs, keys.queued):
        assert 0 < await client.pttl(key) <= TTL, key


async def test_heartbeat_keeps_a_long_job(client: Any) -> None:
    keys, s = await _run_with_jobs(client, {"0": b"in"})
    got = await client.xreadgroup(GROUP, "a", {keys.jobs: ">"}, count=1)
    entry = got[0][1][0][0]
    claim_args = [GROUP, "b", 80, 3, TTL]
    claim_keys = [keys.jobs, keys.results, keys.events, keys.dead]
    for _ in range(4):  # 4 x 40 ms: twice the lease, renewed every half lease
        await asyncio.sleep(0.04)
        assert await s.heartbeat(keys=[keys.jobs], args=[GROUP, "a", entry]) == []
        assert await s.claim(keys=claim_keys, args=claim_args) is None
    pending = await client.xpending_range(keys.jobs, GROUP, "-", "+", 10)
    assert pending[0]["consumer"] == b"a"
    assert pending[0]["times_delivered"] == 1


async def test_claim_dead_letters_after_max_deliveries(client: Any) -> None:
    keys, s = await _run_with_jobs(client, {"7": b"in"})
    await client.xreadgroup(GROUP, "w0", {keys.jobs: ">"}, count=1)  # delivery 1
    claim_keys = [keys.jobs, keys.results, keys.events, keys.dead]
    for n in (2, 3):
        await asyncio.sleep(0.02)
        got = await s.claim(keys=claim_keys, args=[GROUP, f"w{n}", 10, 3, TTL])
        assert got[3] == n
    await asyncio.sleep(0.02)
    assert await s.claim(keys=claim_keys, args=[GROUP, "w4", 10, 3, TTL]) is None
    assert await client.hget(keys.dead, "7") == b"3"
    assert [f[b"kind"] for _, f in await client.xrange(keys.events)] == [b"dead"]
    assert (await client.xpending(keys.jobs, GROUP))["pending"] == 0


async def test_publish_is_idempotent(client: Any) -> None:
    keys, s = await _run_with_jobs(client, {"0": b"a", "1": b"b"})
    await client.hset(keys.results, "2", b"done before")
    args = [GROUP, TTL, "0", b"a", "1", b"b", "2", b"c", "3", b"d"]
    assert await s.publish(keys=keys.all(), args=args) == 1  # only "3" is new
    assert await s.publish(keys=keys.all(), args=args) == 0  # a retried command adds nothing
    jobs = [f[b"job"] for _, f in await client.xrange(keys.jobs)]
    assert jobs == [b"0", b"1", b"3"]


async def test_semaphore_caps_holders_across_clients(client: Any) -> None:
    other = connect(_url(client))
    key = "{lgb:sem:test}"
    sems = [RedisSemaphore(c, key=key, limit=3, lease_s=2.0) for c in (client, other)]
    inside = peak = 0

    async def hold(i: int) -> None:
        nonlocal inside, peak
        async with sems[i % 2].hold():
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.02)
            inside -= 1

    try:
        await asyncio.gather(*(hold(i) for i in range(24)))
        assert peak == 3
        assert await client.zcard(key) == 0
        # A cancelled waiter leaks nothing.
        async with sems[0].hold(3):
            waiter = asyncio.create_task(_hold_once(sems[1]))
            await asyncio.sleep(0.05)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
        assert await client.zcard(key) == 0
    finally:
        await other.aclose()


async def _hold_once(sem: RedisSemaphore) -> None:
    async with sem.hold():
        await asyncio.sleep(10)


def _url(client: Any) -> str:
    kw = client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/0"


async def test_semaphore_reclaims_a_dead_holders_lease(client: Any) -> None:
    key = "{lgb:sem:dead}"
    sem = RedisSemaphore(client, key=key, limit=1, lease_s=0.3)
    # A holder that died without releasing: its lease expires after lease_s.
    await client.zadd(key, {"dead-worker:1": int(time.time() * 1000) + 300})
    t0 = time.monotonic()
    async with sem.hold():
        waited = time.monotonic() - t0
    assert 0.15 < waited < 2.0, waited


async def test_single_flight_across_two_processes_runs_once(client: Any) -> None:
    run = RunKeys(new_run_id())
    await client.hset(run.meta, "sentinel", "1")
    other = connect(_url(client))
    serde = Serde()
    runs = {"g": (run, TTL)}
    stores = [
        RedisFlightStore(c, serde=serde, runs=runs.get, lease_s=1.0, wait_s=0.2)
        for c in (client, other)
    ]
    calls = 0

    async def tool() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.2)
        return "value"

    try:
        got = await asyncio.gather(
            *(
                stores[i % 2].run("g", ("search", '{"q":"x"}'), tool, lambda v: True)
                for i in range(6)
            )
        )
        assert got == ["value"] * 6
        assert calls == 1
        # Later callers of the same run get the stored result; another key runs again.
        assert await stores[1].run("g", ("search", '{"q":"x"}'), tool, lambda v: True) == "value"
        assert calls == 1
        await stores[0].run("g", ("search", '{"q":"y"}'), tool, lambda v: True)
        assert calls == 2
        # Another run (scope) never sees this run's results.
        assert await stores[0].run("unknown", ("search", '{"q":"x"}'), tool, lambda v: True)
        assert calls == 3
        # The keys are listed for the run's cleanup.
        assert len(await client.smembers(run.flights)) == 4
    finally:
        await other.aclose()


async def test_single_flight_takes_over_from_a_dead_leader(client: Any) -> None:
    run = RunKeys(new_run_id())
    await client.hset(run.meta, "sentinel", "1")
    store = RedisFlightStore(client, serde=Serde(), runs={"g": (run, TTL)}.get, wait_s=0.1)
    from langgraph_batch.distributed._redis_flight import key_digest

    digest = key_digest(("t", "k"))
    assert digest is not None
    lock, _ = run.flight(digest)
    await client.set(lock, "dead-leader", px=400)  # its process died holding the lock
    calls = 0

    async def tool() -> str:
        nonlocal calls
        calls += 1
        return "mine"

    t0 = time.monotonic()
    assert await store.run("g", ("t", "k"), tool, lambda v: True) == "mine"
    assert calls == 1
    assert 0.2 < time.monotonic() - t0 < 3.0

    # A leader that fails releases the lock at once: a waiter runs the call itself.
    async def failing() -> str:
        await asyncio.sleep(0.1)
        raise RuntimeError("boom")

    results = await asyncio.gather(
        store.run("g", ("t", "e"), failing, lambda v: True),
        _later(store.run("g", ("t", "e"), tool, lambda v: True)),
        return_exceptions=True,
    )
    assert isinstance(results[0], RuntimeError)
    assert results[1] == "mine"
    assert calls == 2


async def _later(coro: Any) -> Any:
    await asyncio.sleep(0.02)
    return await coro


async def test_single_flight_renews_its_lock_and_never_crosses_runs(client: Any) -> None:
    runs = {"a": (RunKeys(new_run_id()), TTL), "b": (RunKeys(new_run_id()), TTL)}
    for run, _ in runs.values():
        await client.hset(run.meta, "sentinel", "1")
    other = connect(_url(client))
    stores = [
        RedisFlightStore(c, serde=Serde(), runs=runs.get, lease_s=0.3, wait_s=0.1)
        for c in (client, other)
    ]
    calls: list[str] = []

    def slow(tag: str) -> Callable[[], Any]:
        async def tool() -> str:
            calls.append(tag)
            await asyncio.sleep(1.0)  # three leases: the leader must keep renewing
            return f"value-{tag}"

        return tool

    key = ("search", '{"q":"x"}')
    try:
        got = await asyncio.gather(
            stores[0].run("a", key, slow("a"), lambda v: True),
            _later(stores[1].run("a", key, slow("a"), lambda v: True)),
            stores[1].run("b", key, slow("b"), lambda v: True),
        )
    finally:
        await other.aclose()
    assert got == ["value-a", "value-a", "value-b"]
    assert sorted(calls) == ["a", "b"]  # once per run, and each run its own
