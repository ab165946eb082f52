"""Distributed fan_out keeps fan_out's semantics: real redis-server, two real worker processes.

Order, `on_error`, progress events, cancellation, input validation, payload
caps, crafted payloads, key cleanup and "workers bind nothing", all against
one Redis and two `langgraph-batch worker` processes shared by this module.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import pickle
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ormsgpack
import psutil
import pytest

from langgraph_batch import SiblingError, SiblingFailedError
from langgraph_batch.distributed._keys import (
    GROUP,
    RunKeys,
    graph_runs_key,
    graph_wake_key,
    new_run_id,
    sibling_group,
)
from langgraph_batch.distributed._redis import connect
from langgraph_batch.distributed._scripts import Scripts
from langgraph_batch.distributed._serde import Serde
from langgraph_batch.errors import RedisUnavailableError
from tests.integration.distributed._parent import executor, parent_graph, run_parent
from tests.integration.distributed.conftest import (
    GRAPHS,
    Harness,
    RedisProc,
    WorkerProc,
    atally,
    executions,
    free_port,
    timer,
)

pytestmark = pytest.mark.anyio


@dataclass
class Cluster:
    redis: RedisProc
    workers: list[WorkerProc]
    h: Harness


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    d = tmp_path_factory.mktemp("dist")
    (d / "redis").mkdir()
    redis = RedisProc(d / "redis", appendonly=False).start()
    h = Harness(dir=d, exec_log=d / "executions.log")
    workers = [
        WorkerProc(redis.url, "sleepy", ["--concurrency", "4"], d / f"w{i}.log", h.env()).start()
        for i in range(2)
    ]
    try:
        for w in workers:
            w.wait_ready()
        yield Cluster(redis, workers, h)
    finally:
        for w in workers:
            w.kill()
        redis.kill()


@pytest.fixture
def fresh(cluster: Cluster) -> Cluster:
    """The shared cluster, with an empty execution log and both workers alive."""
    cluster.h.exec_log.write_text("")
    assert all(w.alive() for w in cluster.workers)
    return cluster


async def _run_keys(url: str) -> list[str]:
    client = connect(url)
    try:
        return [k.decode() async for k in client.scan_iter(match="{lgb:*")]
    finally:
        await client.aclose()


async def test_results_in_order_errors_progress_and_cleanup(fresh: Cluster) -> None:
    xs = [{"x": i, "fail": i == 5} for i in range(16)]
    with timer() as t:
        out, events = await run_parent(parent_graph(executor(fresh.redis.url)), xs)

    assert [r for i, r in enumerate(out) if i != 5] == [2 * i for i in range(16) if i != 5]
    err = out[5]
    assert isinstance(err, SiblingError)
    assert (err.index, err.item, err.error_type) == (5, xs[5], "ValueError")
    assert "fails on purpose" in err.message

    kinds = collections.Counter(e["event"] for e in events)
    assert kinds["started"] == 1
    assert kinds["done"] == 1
    assert kinds["sibling_finished"] == 15
    assert kinds["sibling_failed"] == 1
    assert kinds["sibling_started"] >= 15  # a notice may be overtaken by its result
    dones = [e["done"] for e in events]
    assert dones == sorted(dones)
    assert events[-1]["done"] == events[-1]["total"] == 16
    assert events[-1]["failed"] == 1
    assert all(e["node"] == "fan" for e in events)

    execs = await asyncio.to_thread(executions, fresh.h.exec_log)
    assert execs == dict.fromkeys(range(16), 1)
    pids = {
        line.split()[1]
        for line in (await asyncio.to_thread(fresh.h.exec_log.read_text)).split("\n")
        if line
    }
    assert len(pids) == 2, "both workers took siblings"

    # The run's keys are gone; what is left (the graph's run list and wake stream) expires.
    left = await _run_keys(fresh.redis.url)
    assert not [k for k in left if re.match(r"^\{lgb:[0-9a-f]{32}\}", k)], left
    client = connect(fresh.redis.url)
    try:
        for key in left:
            assert await client.pttl(key) > 0, key
    finally:
        await client.aclose()
    expected = [2 * i if i != 5 else out[5] for i in range(16)]
    counts = await atally(
        "happy path", out, expected, fresh.h.exec_log, fresh.workers, seconds=t[0]
    )
    assert (counts.lost, counts.duplicate_results_accepted, counts.duplicate_executions) == (
        0,
        0,
        0,
    )


async def test_progress_reaches_the_parent_as_results_arrive(fresh: Cluster) -> None:
    # Seven quick siblings and one slow one: the quick ones' events must reach the
    # parent's stream while the slow one still runs, not all at the end.
    xs = [{"x": i, "sleep": 2.0 if i == 0 else 0.05} for i in range(8)]
    out, events = await run_parent(parent_graph(executor(fresh.redis.url)), xs)
    assert out == [2 * i for i in range(8)]
    end = next(e["_at"] for e in events if e["event"] == "done")
    finished = {e["index"]: e["_at"] for e in events if e["event"] == "sibling_finished"}
    assert set(finished) == set(range(8))
    early = [i for i in range(1, 8) if end - finished[i] > 1.0]
    assert early == list(range(1, 8)), {i: round(end - t, 2) for i, t in finished.items()}
    assert end - finished[0] < 0.5  # the slow one's event is the last one before "done"
    assert (
        next(e for e in events if e["event"] == "sibling_finished" and e["index"] == 1)["done"] < 8
    )  # counted as it arrived


async def test_a_sync_caller_runs_distributed_siblings(fresh: Cluster) -> None:
    # graph.invoke (main's sync callers): the remote run lives on the background loop.
    graph = parent_graph(executor(fresh.redis.url))
    state = await asyncio.to_thread(graph.invoke, {"xs": [{"x": i} for i in range(6)]})
    assert state["out"] == [2 * i for i in range(6)]
    assert await asyncio.to_thread(executions, fresh.h.exec_log) == dict.fromkeys(range(6), 1)
    log = await asyncio.to_thread(fresh.h.exec_log.read_text)
    pids = {int(line.split()[1]) for line in log.splitlines()}
    assert pids <= {w.pid for w in fresh.workers}, "siblings ran on the workers, not here"


async def test_a_thread_reattaches_only_to_a_run_of_the_same_inputs(fresh: Cluster) -> None:
    # A run of thread t is abandoned (its attach key and outcomes stay, for a resume);
    # a later run of the same thread and node with OTHER inputs of the same count must
    # start afresh, never collect the abandoned run's outcomes as its own.
    from tests.integration.distributed.graphs import sleepy

    ex = executor(fresh.redis.url)
    config: Any = {"configurable": {"thread_id": "t-reattach", "checkpoint_ns": "fan:1"}}

    async def collect(xs: list[int], stop_after: int | None = None) -> dict[int, Any]:
        inputs = [(i, {"index": i, "x": x, "sleep": 0.05}) for i, x in enumerate(xs)]
        got: dict[int, Any] = {}
        events = ex.run(sleepy, inputs, total=len(xs), config=config)
        async with contextlib.aclosing(events):  # type: ignore[type-var]
            async for event in events:
                if event.kind == "finished":
                    got[event.index] = event.value["y"]
                    if stop_after is not None and len(got) >= stop_after:
                        break  # abandoned: the run is cancelled, its outcomes kept
        return got

    assert len(await collect([0, 1, 2, 3], stop_after=2)) == 2
    assert await collect([10, 11, 12, 13]) == {0: 20, 1: 22, 2: 24, 3: 26}
    # The same inputs again do re-attach (a resume): nothing runs twice.
    assert len(await collect([5, 6, 7, 8], stop_after=2)) == 2
    before = sum((await asyncio.to_thread(executions, fresh.h.exec_log)).values())
    assert await collect([5, 6, 7, 8]) == {0: 10, 1: 12, 2: 14, 3: 16}
    after = sum((await asyncio.to_thread(executions, fresh.h.exec_log)).values())
    assert after - before <= 2, "finished siblings of the abandoned run were not re-run"


async def test_without_workers_the_parent_warns_then_times_out(
    fresh: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    # No worker serves this graph: the parent says so after two leases, and timeout=
    # turns every sibling into a DistributedTimeoutError (then the run's keys go).
    ex = executor(fresh.redis.url, "asker", lease_s=0.5, ttl_s=60.0, timeout=1.5)
    graph = parent_graph(ex, make_input=lambda x, i: {"prompt": "hi"}, result=None)
    # The cluster is shared: a cancelled run of an earlier test keeps its outcomes
    # (by design, for a re-attach, until their TTL), so look only at this run's keys.
    before = set(await _run_keys(fresh.redis.url))
    with timer() as t:
        out, _ = await run_parent(graph, [0, 1, 2])
    assert 1.5 <= t[0] < 5.0, t[0]
    assert [e.error_type for e in out] == ["DistributedTimeoutError"] * 3
    assert all(e.retryable for e in out)
    assert "no worker has taken any of its 3 siblings" in caplog.text
    assert "tests.integration.distributed.graphs:asker" in caplog.text
    left = set(await _run_keys(fresh.redis.url)) - before
    assert not [k for k in left if re.match(r"^\{lgb:[0-9a-f]{32}\}", k)], left


async def test_redis_unreachable_raises_a_typed_error() -> None:
    ex = executor(f"redis://127.0.0.1:{free_port()}/0", unavailable_timeout=1.0)
    with timer() as t, pytest.raises(RedisUnavailableError) as info:
        await run_parent(parent_graph(ex), [0, 1])
    assert 1.0 <= info.value.down_s < 5.0
    assert t[0] < 6.0
    assert "run the thread again to re-attach" in str(info.value)


async def test_on_error_raise(fresh: Cluster) -> None:
    graph = parent_graph(executor(fresh.redis.url), on_error="raise")
    with pytest.raises(SiblingFailedError) as info:
        await run_parent(graph, [{"x": 1}, {"x": 2, "fail": True}, {"x": 3}])
    assert [e.index for e in info.value.errors] == [1]
    assert info.value.results[0] == 2
    assert info.value.results[2] == 6


async def test_a_long_sibling_keeps_its_lease(fresh: Cluster) -> None:
    # 3 s of work on a 1.2 s lease: the heartbeat keeps it, nobody takes it over.
    xs = [{"x": 0, "sleep": 3.0}, {"x": 1}, {"x": 2}]
    out, _ = await run_parent(parent_graph(executor(fresh.redis.url)), xs)
    assert out == [0, 2, 4]
    assert await asyncio.to_thread(executions, fresh.h.exec_log) == {0: 1, 1: 1, 2: 1}


async def _wait_log(path: Path, pattern: str, count: int, limit_s: float) -> int:
    deadline = time.monotonic() + limit_s
    while True:
        text = await asyncio.to_thread(path.read_text)
        found = len(re.findall(pattern, text, flags=re.M))
        if found >= count or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.05)


async def test_cancelling_the_parent_cancels_its_jobs_on_the_workers(fresh: Cluster) -> None:
    graph = parent_graph(executor(fresh.redis.url))
    task = asyncio.create_task(run_parent(graph, [{"x": i, "sleep": 30.0} for i in range(4)]))
    assert await _wait_log(fresh.h.exec_log, r" start$", 4, limit_s=10) == 4
    cancelled_at = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Workers notice at their next heartbeat (lease / 3) and cancel the siblings.
    assert await _wait_log(fresh.h.exec_log, r" cancel$", 4, limit_s=5) == 4
    took = time.monotonic() - cancelled_at
    assert " done" not in await asyncio.to_thread(fresh.h.exec_log.read_text)
    assert took < 3.0, took


async def test_bad_input_fails_its_sibling_only(fresh: Cluster) -> None:
    def make_input(x: int, i: int) -> dict[str, Any]:
        if i == 1:
            return {"index": i, "x": x, "bogus": True}  # a key the graph does not have
        if i == 2:
            return {"index": i, "x": "two"}  # x is an int
        return {"index": i, "x": x, "sleep": 0.05}

    out, _ = await run_parent(
        parent_graph(executor(fresh.redis.url), make_input=make_input), [0, 1, 2, 3]
    )
    assert out[0] == 0
    assert out[3] == 6
    for i, needle in ((1, "unknown key 'bogus'"), (2, "key 'x'")):
        assert isinstance(out[i], SiblingError)
        assert out[i].error_type == "InputValidationError"
        assert needle in out[i].message
    assert all(w.alive() for w in fresh.workers)
    assert set(await asyncio.to_thread(executions, fresh.h.exec_log)) == {0, 3}


async def test_payload_cap_fails_the_oversized_sibling(fresh: Cluster) -> None:
    ex = executor(fresh.redis.url, max_payload_bytes=2000)
    out, _ = await run_parent(parent_graph(ex), [{"x": 1}, {"x": 2, "pad": "a" * 5000}, {"x": 3}])
    assert out[0] == 2
    assert out[2] == 6
    assert isinstance(out[1], SiblingError)
    assert out[1].error_type == "PayloadTooLargeError"
    assert "max_payload_bytes=2000" in out[1].message


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


async def test_crafted_payloads_are_rejected_and_run_nothing(fresh: Cluster) -> None:
    marker = fresh.h.dir / "pwned"
    graph = f"{GRAPHS}:sleepy"
    ext = ormsgpack.Ext
    crafted = {
        "0": b"msgpack\0"
        + ormsgpack.packb(
            {"index": 0, "x": ext(1, ormsgpack.packb(["os", "system", [f"touch {marker}"]]))}
        ),
        "1": b"pickle\0" + pickle.dumps(_Evil(marker)),
        "2": b"msgpack\0"
        + ormsgpack.packb(
            {"x": ext(3, ormsgpack.packb(["os", "system", f"touch {marker}", "__call__"]))}
        ),
        "3": b"json\0" + b'{"lc": 2, "type": "constructor", "id": ["os", "system"], "args": ["x"]}',
    }
    run_id = new_run_id()
    keys = RunKeys(run_id)
    client = connect(fresh.redis.url)
    try:
        await client.hset(
            keys.meta,
            mapping={
                "graph": graph,
                "total": "4",
                "group": sibling_group(run_id),
                "lease_ms": "1200",
                "max_deliveries": "3",
                "ttl_ms": "60000",
                "state": "running",
                "sentinel": "1",
            },
        )
        args: list[Any] = [GROUP, 60000]
        for job, payload in crafted.items():
            args += [job, payload]
        await Scripts(client).publish(keys=keys.all(), args=args)
        await client.zadd(graph_runs_key(graph), {run_id: int(time.time() * 1000) + 60000})
        await client.xadd(graph_wake_key(graph), {"run": "x"})
        deadline = time.monotonic() + 10
        while await client.hlen(keys.results) < 4 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        results = await client.hgetall(keys.results)
        await client.delete(*keys.all())
        await client.zrem(graph_runs_key(graph), run_id)
    finally:
        await client.aclose()
    serde = Serde()
    assert len(results) == 4
    for job in crafted:
        record = serde.loads(results[job.encode()], what="result")
        assert record["k"] == "error", record
        assert record["v"]["error_type"] == "PayloadRejectedError", record
    assert not await asyncio.to_thread(marker.exists)
    assert all(w.alive() for w in fresh.workers)
    assert not await asyncio.to_thread(executions, fresh.h.exec_log)


def test_workers_bind_nothing(cluster: Cluster) -> None:
    for w in cluster.workers:
        conns = psutil.Process(w.pid).net_connections(kind="all")
        assert not [c for c in conns if c.status == psutil.CONN_LISTEN], conns
        inet = [c for c in conns if c.raddr]
        assert inet, conns
        assert all(c.raddr.port == cluster.redis.port for c in inet), inet
