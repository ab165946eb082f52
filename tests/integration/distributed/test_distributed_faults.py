"""Faults, REDIS.md's test plan: real redis-server, real worker processes, a real parent run.

Each case runs one fan_out of short siblings on two workers, injects one
fault mid-run and checks the Jepsen-style counts: no result lost, no
duplicate result accepted (both asserted 0); duplicate executions are
allowed (at-least-once) and reported, as is the time from the fault to the
run's end. Leases are 1.2 s so the whole file runs in well under a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from langgraph_batch import SiblingError
from tests.integration.distributed._parent import executor, parent_graph, run_parent
from tests.integration.distributed.conftest import (
    Harness,
    RedisProc,
    Tally,
    WorkerProc,
    atally,
    executions,
    free_port,
    supervised,
)

pytestmark = pytest.mark.anyio

N = 18


async def _start(
    start_worker: Callable[..., WorkerProc], urls: list[str], *args: str
) -> list[WorkerProc]:
    workers = [
        await asyncio.to_thread(start_worker, url, "sleepy", *args, wait=False) for url in urls
    ]
    await asyncio.gather(*(asyncio.to_thread(w.wait_ready) for w in workers))
    return workers


async def _wait_starts(path: Path, count: int, limit_s: float = 15.0) -> None:
    deadline = time.monotonic() + limit_s
    while sum((await asyncio.to_thread(executions, path)).values()) < count:
        assert time.monotonic() < deadline, "the run did not progress"
        await asyncio.sleep(0.02)


async def _run_with_fault(
    case: str,
    harness: Harness,
    url: str,
    workers: list[WorkerProc],
    fault: Callable[[], Awaitable[None]],
    *,
    after_starts: int = 4,
    xs: list[Any] | None = None,
    dead_ok: tuple[int, ...] = (),
    **ex_options: Any,
) -> tuple[list[Any], Tally]:
    xs = xs if xs is not None else [{"x": i, "sleep": 0.3} for i in range(N)]
    graph = parent_graph(executor(url, **ex_options))
    t0 = time.monotonic()
    parent = asyncio.create_task(run_parent(graph, xs))
    await _wait_starts(harness.exec_log, after_starts)
    fault_at = time.monotonic()
    await fault()
    async with asyncio.timeout(60):
        out, _ = await parent
    end = time.monotonic()
    expected = [x.get("x", 0) * 2 if isinstance(x, dict) else x * 2 for x in xs]
    counts = await atally(
        case,
        out,
        expected,
        harness.exec_log,
        workers,
        seconds=end - t0,
        dead_ok=dead_ok,
        recover_s=end - fault_at,
    )
    assert counts.lost == 0, out
    assert counts.duplicate_results_accepted == 0
    assert counts.executions >= len(xs) - len(dead_ok)
    return out, counts


async def test_sigkill_a_worker_mid_run(
    start_redis: Callable[..., RedisProc], start_worker: Callable[..., WorkerProc], harness: Harness
) -> None:
    redis = await asyncio.to_thread(start_redis)
    workers = await _start(start_worker, [redis.url] * 2, "--concurrency", "3")

    async def fault() -> None:
        workers[0].signal(signal.SIGKILL)

    _, _counts = await _run_with_fault("SIGKILL a worker", harness, redis.url, workers, fault)
    assert not workers[0].alive()


async def test_sigstop_past_the_lease_then_sigcont(
    start_redis: Callable[..., RedisProc], start_worker: Callable[..., WorkerProc], harness: Harness
) -> None:
    redis = await asyncio.to_thread(start_redis)
    workers = await _start(start_worker, [redis.url] * 2, "--concurrency", "3")
    paused = workers[0]

    async def fault() -> None:
        paused.signal(signal.SIGSTOP)
        await asyncio.sleep(3.0)  # 2.5 leases: the other worker takes its jobs over
        paused.signal(signal.SIGCONT)

    await _run_with_fault("SIGSTOP past the lease, SIGCONT", harness, redis.url, workers, fault)
    # Back from the pause, the jobs it held belong to the other worker: the paused one
    # either learns so at its first heartbeat (and cancels them) or, when a job finished
    # first, has its late result rejected by the complete script's owner check.
    deadline = time.monotonic() + 5
    while not (fenced := _fenced(await asyncio.to_thread(paused.text))):
        assert time.monotonic() < deadline, paused.text()[-2000:]
        await asyncio.sleep(0.05)
    paused_log, other_log = await asyncio.gather(
        asyncio.to_thread(paused.text), asyncio.to_thread(workers[1].text)
    )
    for job in fenced:
        assert not re.search(rf"job {job} of run \w+: accepted", paused_log), job
        assert re.search(rf"job {job} of run \w+: accepted", other_log), job


def _fenced(log: str) -> set[str]:
    """Jobs a worker lost its lease on: cancelled at a heartbeat, or late results rejected."""
    return set(re.findall(r"lost job (\d+)", log)) | set(
        re.findall(r"job (\d+) of run \w+: rejected", log)
    )


@pytest.mark.parametrize("appendonly", [True, False], ids=["aof", "no-persistence"])
async def test_redis_restart(
    appendonly: bool,
    start_redis: Callable[..., RedisProc],
    start_worker: Callable[..., WorkerProc],
    harness: Harness,
) -> None:
    redis = await asyncio.to_thread(start_redis, appendonly=appendonly)
    workers = await _start(start_worker, [redis.url] * 2, "--concurrency", "3")

    async def fault() -> None:
        await asyncio.to_thread(redis.kill)  # SIGKILL: no shutdown save
        await asyncio.sleep(0.5)
        await asyncio.to_thread(redis.start)

    case = f"Redis restart ({'AOF' if appendonly else 'no persistence'})"
    _, _counts = await _run_with_fault(case, harness, redis.url, workers, fault, after_starts=6)
    assert all(w.alive() for w in workers)


async def test_redis_frozen_for_2_5_s(
    start_redis: Callable[..., RedisProc], start_worker: Callable[..., WorkerProc], harness: Harness
) -> None:
    redis = await asyncio.to_thread(start_redis)
    workers = await _start(start_worker, [redis.url] * 2, "--concurrency", "3")

    async def fault() -> None:
        redis.signal(signal.SIGSTOP)
        await asyncio.sleep(2.5)
        redis.signal(signal.SIGCONT)

    await _run_with_fault("Redis frozen 2.5 s (SIGSTOP)", harness, redis.url, workers, fault)


class _Proxy:
    """A TCP proxy (its own thread and loop) that can drop or stall the traffic it carries."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.target = target_port
        self.mode = "pass"
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        self._ready.wait(5)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def serve() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
            self._ready.set()

        self._loop.run_until_complete(serve())
        self._loop.run_forever()
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "drop":
            writer.close()
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_w}
        await asyncio.gather(self._pump(reader, up_w), self._pump(up_r, writer))

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await src.read(65536):
                while self.mode == "stall":  # noqa: ASYNC110 - set from another thread
                    await asyncio.sleep(0.02)
                if self.mode == "drop":
                    break
                dst.write(data)
                await dst.drain()
        dst.close()
        self._writers.discard(dst)

    def _set(self, mode: str, seconds: float) -> None:
        def apply() -> None:
            self.mode = mode
            if mode == "drop":
                for w in list(self._writers):
                    w.close()
            self._loop.call_later(seconds, setattr, self, "mode", "pass")

        self._loop.call_soon_threadsafe(apply)

    def drop_for(self, seconds: float) -> None:
        self._set("drop", seconds)

    def stall_for(self, seconds: float) -> None:
        self._set("stall", seconds)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


async def test_proxy_drops_then_stalls_a_workers_traffic(
    start_redis: Callable[..., RedisProc], start_worker: Callable[..., WorkerProc], harness: Harness
) -> None:
    redis = await asyncio.to_thread(start_redis)
    proxy = await asyncio.to_thread(_Proxy, redis.port)
    try:
        proxied = f"redis://127.0.0.1:{proxy.port}/0"
        workers = await _start(
            start_worker, [redis.url, proxied], "--concurrency", "3", "--socket-timeout", "1.5"
        )

        async def fault() -> None:
            proxy.drop_for(1.0)
            await asyncio.sleep(1.0)
            # Once the proxied worker runs siblings again, stall it past the lease: the
            # siblings finish meanwhile but cannot report, the other worker takes them
            # over, and their late results are rejected when the traffic flows again.
            mine = f" {workers[1].pid} start"
            seen = (await asyncio.to_thread(harness.exec_log.read_text)).count(mine)
            deadline = time.monotonic() + 10
            while (await asyncio.to_thread(harness.exec_log.read_text)).count(mine) == seen:
                assert time.monotonic() < deadline, "the proxied worker did not come back"
                await asyncio.sleep(0.02)
            proxy.stall_for(3.0)

        xs = [{"x": i, "sleep": 0.6} for i in range(30)]
        _, counts = await _run_with_fault(
            "proxy drops 1 s then stalls 3 s (one worker)",
            harness,
            redis.url,
            workers,
            fault,
            xs=xs,
        )
        assert "Redis unreachable" in await asyncio.to_thread(workers[1].text)
        assert counts.rejected_late_results >= 1, "a late result was written and rejected"
    finally:
        await asyncio.to_thread(proxy.close)


async def test_poison_job_is_dead_lettered_alone(
    start_redis: Callable[..., RedisProc], start_worker: Callable[..., WorkerProc], harness: Harness
) -> None:
    redis = await asyncio.to_thread(start_redis)
    workers = await _start(start_worker, [redis.url] * 2, "--concurrency", "3")

    async def fault() -> None:
        return None  # the poison sibling is the fault

    xs: list[Any] = [{"x": i, "sleep": 0.4} for i in range(9)]
    xs[3] = {"x": 3, "poison": True}
    async with supervised(workers):
        out, counts = await _run_with_fault(
            "poison job (kills its worker)",
            harness,
            redis.url,
            workers,
            fault,
            xs=xs,
            after_starts=1,
            dead_ok=(3,),
            max_deliveries=3,
        )
    err = out[3]
    assert isinstance(err, SiblingError)
    assert err.error_type == "DeadLetteredError"
    assert "3 deliveries" in err.message
    assert counts.dead_lettered == [3], "no innocent sibling is dead-lettered"
    assert (await asyncio.to_thread(executions, harness.exec_log))[3] == 3
    assert sum(w.starts for w in workers) - 2 == 3  # one worker restart per delivery


async def test_jobs_lost_while_the_run_survives_are_published_again(
    start_redis: Callable[..., RedisProc],
    start_worker: Callable[..., WorkerProc],
    harness: Harness,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A partial loss (AOF fsync'd every second, a failover): the run's metadata
    # survives but the jobs it published do not. The parent notices and publishes again.
    from langgraph_batch.distributed._redis import connect

    redis = await asyncio.to_thread(start_redis)
    parent = asyncio.create_task(
        run_parent(parent_graph(executor(redis.url)), [{"x": i} for i in range(4)])
    )
    client = connect(redis.url)
    try:
        queued: list[bytes] = []
        while not queued:
            queued = [k async for k in client.scan_iter(match="{lgb:*}:queued")]
            await asyncio.sleep(0.02)
        tag = queued[0].decode().removesuffix(":queued")
        assert await client.delete(f"{tag}:jobs", f"{tag}:queued") == 2
    finally:
        await client.aclose()
    await _start(start_worker, [redis.url], "--concurrency", "4")
    async with asyncio.timeout(30):
        out, _ = await parent
    assert out == [0, 2, 4, 6]
    assert "jobs missing in Redis; publishing them again" in caplog.text
