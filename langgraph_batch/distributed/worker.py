"""`langgraph-batch worker`: run the siblings of distributed fan_outs, many at a time.

A worker imports one sibling graph by its import path (nothing but job
inputs ever comes over the wire), finds the live runs of that graph in
Redis and runs their jobs, up to `--concurrency` at once, each inside
`sibling_scope(...)`: its model calls share this process's scheduler, its
coalesced tool calls the run's other workers, `--max-active` caps the active
ones, `--cluster-inflight N` caps requests per endpoint cluster-wide.

The loop, per REDIS.md:

1. every `block_s`: list the graph's live runs (`{lgb:g:..}:runs`);
2. at most one redelivered job at a time (`claim`: entries idle past their
   run's lease, i.e. of dead or paused workers; a job that has been
   delivered `max_deliveries` times is dead-lettered there instead). A
   poison job that kills its worker thus never takes innocent redelivered
   siblings down with it;
3. else `XREADGROUP ... BLOCK` for new jobs of every live run (or, with no
   run at all, block on the graph's wake stream);
4. every third of the lease, one `heartbeat` per run renews every job this
   worker holds; a job it no longer holds (another worker took it over, or
   the run was cancelled or finished) is cancelled here;
5. a finished job is written by `complete`, which checks ownership first
   (a worker paused past its lease cannot write) and keeps the first result.

A job's input is decoded strictly and checked against the graph's input
schema before it runs; a bad input, like an exception in the graph, becomes
that sibling's `SiblingError`, never a crash. Workers open no listening
socket. SIGTERM/SIGINT stop taking jobs and let running ones finish for up
to `--drain` seconds (the rest are taken over by other workers).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import logging
import os
import secrets
import socket
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph_batch._redact import safe_url
from langgraph_batch.distributed._keys import (
    GROUP,
    RunKeys,
    graph_runs_key,
    graph_wake_key,
)
from langgraph_batch.distributed._redis import (
    CONNECTION_ERRORS,
    RESPONSE_ERRORS,
    connect,
    raise_if_cancel_requested,
)
from langgraph_batch.distributed._redis_flight import RedisFlightStore
from langgraph_batch.distributed._redis_once import RedisOnceStore
from langgraph_batch.distributed._redis_wait import RedisWait
from langgraph_batch.distributed._scripts import Scripts
from langgraph_batch.distributed._semaphore import limit_backends
from langgraph_batch.distributed._serde import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Serde,
)
from langgraph_batch.distributed._sibling import invoke_sibling
from langgraph_batch.nodes import SiblingAdmission, check_gate_options
from langgraph_batch.scheduler.registry import set_backend_wrapper
from langgraph_batch.tools import forget_run, set_flight_store, set_once_store

__all__ = ("Worker", "load_graph")

logger = logging.getLogger(__name__)


def load_graph(path: str, *, app_dir: str | None = ".") -> Any:
    """Import `package.module:attribute` (dots after the colon walk attributes).

    Raises:
        ValueError: The path is malformed.
        ImportError: The module cannot be imported.
        AttributeError: The attribute does not exist.
        TypeError: The object has no `ainvoke`.
    """
    module_name, sep, attr = path.partition(":")
    if not (sep and module_name and attr):
        raise ValueError(f"graph must be 'package.module:attribute', got {path!r}")
    if app_dir is not None:
        root = os.path.abspath(app_dir)
        if root not in sys.path:
            sys.path.insert(0, root)
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(getattr(obj, "ainvoke", None)):
        raise TypeError(f"{path} is a {type(obj).__name__}, not a graph (no ainvoke)")
    return obj


@dataclass(eq=False)
class _WorkerRun:
    keys: RunKeys
    group: str
    total: int
    lease_ms: int
    max_deliveries: int
    ttl_ms: int


@dataclass(eq=False)
class _Job:
    run: _WorkerRun
    entry_id: bytes
    job: str
    input: bytes
    redelivered: bool
    task: asyncio.Task[None] | None = None
    completing: bool = False
    """The outcome is being written: heartbeats leave it alone."""


class Worker:
    """Runs the jobs of one sibling graph's distributed fan_outs (see the module docs).

    Example:
        ```python
        worker = Worker("redis://127.0.0.1:6379/0", "myapp.graphs:agent", concurrency=32)
        await worker.run()  # until `stop` is set (the CLI sets it on SIGTERM/SIGINT)
        ```
    """

    def __init__(
        self,
        url: str,
        graph: str,
        *,
        concurrency: int = 16,
        max_active: int | None = None,
        cluster_inflight: int | None = None,
        cluster_lease_s: float = 30.0,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        allowed_types: Iterable[type | tuple[str, str]] = (),
        name: str | None = None,
        block_s: float = 0.5,
        drain_s: float = 30.0,
        socket_timeout: float = 5.0,
        app_dir: str | None = ".",
        redis_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Create a worker (imports the graph now; connects in `run`).

        Args:
            url: Redis, as for `RedisExecutor`.
            graph: The sibling graph's import path, as the parents name it.
            concurrency: Siblings run at once, `>= 1`.
            max_active: Of those, at most this many ACTIVE (not inside a
                tool) at once, as `fan_out(max_active=...)` does in-process;
                None: no cap beyond `concurrency`.
            cluster_inflight: Cap on requests in flight per inference endpoint
                across every worker passing the same value; None: no cap.
            cluster_lease_s: An in-flight lease of a dead worker comes back after this.
            max_payload_bytes: Cap on one encoded input or result.
            allowed_types: Classes (or `(module, name)`) to rebuild besides
                the graph's state types (the parents' `allowed_types`).
            name: The consumer name (default `host:pid:random`).
            block_s: Longest blocking read; also how often runs are listed.
            drain_s: On stop, how long running siblings may finish.
            socket_timeout: Seconds one Redis command may take.
            app_dir: Prepended to `sys.path` before importing the graph.
            redis_options: More `redis.asyncio.Redis.from_url` options.

        Raises:
            ValueError: For an option out of range or a malformed graph path.
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
        if cluster_inflight is not None and cluster_inflight < 1:
            raise ValueError(f"cluster_inflight must be >= 1 or None, got {cluster_inflight!r}")
        if not block_s > 0 or not socket_timeout > block_s:
            raise ValueError("need 0 < block_s < socket_timeout")
        self.url = url
        self.graph_path = graph
        self.graph = load_graph(graph, app_dir=app_dir)
        self.concurrency = concurrency
        check_gate_options(max_active=max_active)
        self.admission = SiblingAdmission(max_active=max_active)
        """The worker's admission gate, shared by the siblings of every run it serves."""
        self.cluster_inflight = cluster_inflight
        self.cluster_lease_s = cluster_lease_s
        self.serde = Serde.for_graph(self.graph, extra=allowed_types, max_bytes=max_payload_bytes)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.block_s = block_s
        self.drain_s = drain_s
        self.socket_timeout = socket_timeout
        self.redis_options = dict(redis_options or {})
        self._client: Any = None
        self._scripts: Scripts | None = None
        self._runs: dict[str, _WorkerRun] = {}
        self._groups: dict[str, _WorkerRun] = {}
        self._jobs: dict[tuple[str, bytes], _Job] = {}
        self._backlog: collections.deque[_Job] = collections.deque()
        self._next_claim = 0.0
        self._claim_turn = 0

    def __repr__(self) -> str:
        return f"Worker({safe_url(self.url)!r}, {self.graph_path!r}, name={self.name!r})"

    @property
    def scripts(self) -> Scripts:
        """The registered scripts (available while `run` runs)."""
        if self._scripts is None:
            raise RuntimeError("the worker is not running")
        return self._scripts

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve jobs until `stop` is set, then drain.

        Args:
            stop: Set it to stop (default: run until cancelled).
        """
        stop = stop or asyncio.Event()
        self._client = connect(self.url, socket_timeout=self.socket_timeout, **self.redis_options)
        self._scripts = Scripts(self._client)
        store = RedisFlightStore(
            self._client, serde=self.serde, runs=self._flight_run, scripts=self._scripts
        )
        previous_store = set_flight_store(store)
        previous_once = set_once_store(RedisOnceStore(self._client, runs=self._flight_run))
        previous_wrapper = None
        if self.cluster_inflight is not None:
            previous_wrapper = set_backend_wrapper(
                limit_backends(
                    self._client,
                    limit=self.cluster_inflight,
                    lease_s=self.cluster_lease_s,
                    scripts=self._scripts,
                )
            )
        heartbeat = asyncio.create_task(self._heartbeats())
        logger.info(
            "worker %s: graph %s, Redis %s, concurrency %d, cluster in-flight cap %s",
            self.name,
            self.graph_path,
            safe_url(self.url),
            self.concurrency,
            self.cluster_inflight,
        )
        try:
            await self._serve(stop)
        finally:
            try:
                await self._drain()
            finally:
                heartbeat.cancel()
                set_flight_store(previous_store)
                set_once_store(previous_once)
                if self.cluster_inflight is not None:
                    set_backend_wrapper(previous_wrapper)
                with contextlib.suppress(Exception):
                    await self._client.aclose()
                logger.info("worker %s: stopped", self.name)

    async def _drain(self) -> None:
        self._backlog.clear()
        tasks = [j.task for j in self._jobs.values() if j.task is not None]
        if tasks:
            logger.info("worker %s: letting %d siblings finish", self.name, len(tasks))
            _, pending = await asyncio.wait(tasks, timeout=self.drain_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5.0)

    # -- the loop ------------------------------------------------------------------------

    async def _serve(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        wake_last = "$"
        next_refresh = 0.0
        redis = RedisWait(f"worker {self.name}", give_up_after=None, logger=logger)
        while not stop.is_set():
            raise_if_cancel_requested()
            try:
                if loop.time() >= next_refresh:
                    await self._refresh_runs()
                    next_refresh = loop.time() + self.block_s
                self._start_backlog()
                free = self.concurrency - self._running()
                if free <= 0:
                    await self._wait_for_slot(stop)
                elif await self._claim_one():
                    pass
                elif not self._runs:
                    wake_last = await self._wait_wake(wake_last)
                    next_refresh = 0.0
                else:
                    await self._read(free)
                redis.answered()
            except CONNECTION_ERRORS as exc:
                # A worker never gives up on Redis (its parent may); it stops on `stop`.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(redis.failed(exc)):
                        await stop.wait()
            except RESPONSE_ERRORS as exc:
                self._runs.clear()
                next_refresh = 0.0
                if "NOGROUP" in str(exc) or "no longer exists" in str(exc):
                    # A run's stream or group went away (finished, cancelled, lost).
                    logger.debug("worker %s: %s; listing runs again", self.name, exc)
                    await asyncio.sleep(0.01)
                else:  # e.g. NOPERM: an ACL user without a command the worker needs
                    logger.warning("worker %s: Redis refused a command: %s", self.name, exc)
                    await asyncio.sleep(self.block_s)

    def _running(self) -> int:
        return sum(1 for j in self._jobs.values() if j.task is not None)

    async def _wait_for_slot(self, stop: asyncio.Event) -> None:
        tasks: set[asyncio.Future[Any]] = {
            j.task for j in self._jobs.values() if j.task is not None
        }
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait(
                {*tasks, stopper}, timeout=self.block_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopper.cancel()

    async def _refresh_runs(self) -> None:
        now_ms = int(time.time() * 1000)
        raw = await self._client.zrangebyscore(graph_runs_key(self.graph_path), now_ms, "+inf")
        live = {r.decode() for r in raw}
        for run_id in list(self._runs):
            if run_id not in live:
                del self._runs[run_id]
        for run_id in live - self._runs.keys():
            keys = RunKeys(run_id)
            meta = {
                k.decode(): v.decode() for k, v in (await self._client.hgetall(keys.meta)).items()
            }
            if meta.get("graph") != self.graph_path or meta.get("state") != "running":
                continue
            if not await self._client.exists(keys.jobs):
                continue  # not published yet, or lost: the parent publishes it again
            try:
                run = _WorkerRun(
                    keys=keys,
                    group=meta["group"],
                    total=int(meta["total"]),
                    lease_ms=int(meta["lease_ms"]),
                    max_deliveries=int(meta["max_deliveries"]),
                    ttl_ms=int(meta["ttl_ms"]),
                )
            except (KeyError, ValueError):
                logger.warning("worker %s: run %s has malformed metadata", self.name, run_id[:6])
                continue
            self._runs[run_id] = self._groups.setdefault(run.group, run)
        active = {j.run.group for j in self._jobs.values()}
        for group, run in list(self._groups.items()):
            if run.keys.run_id not in self._runs and group not in active:
                del self._groups[group]
                forget_run(group)  # what coalesced tools kept for it, in this process

    def _flight_run(self, group: str) -> tuple[RunKeys, int] | None:
        run = self._groups.get(group)
        return None if run is None else (run.keys, run.ttl_ms)

    async def _wait_wake(self, last: str) -> str:
        wake = graph_wake_key(self.graph_path)
        reply = await self._client.xread({wake: last}, count=16, block=int(self.block_s * 1000))
        for _stream, entries in reply or ():
            for entry_id, _fields in entries:
                last = entry_id
        return last

    async def _read(self, free: int) -> None:
        by_stream = {run.keys.jobs: run for run in self._runs.values()}
        reply = await self._client.xreadgroup(
            GROUP,
            self.name,
            dict.fromkeys(by_stream, ">"),
            count=free,
            block=int(self.block_s * 1000),
        )
        for stream, entries in reply or ():
            run = by_stream.get(stream.decode() if isinstance(stream, bytes) else stream)
            if run is None:
                continue
            for entry_id, fields in entries:
                self._accept(run, entry_id, fields.get(b"job"), fields.get(b"input", b""), False)

    async def _claim_one(self) -> bool:
        loop = asyncio.get_running_loop()
        if loop.time() < self._next_claim or not self._runs:
            return False
        if any(j.redelivered for j in self._jobs.values()):
            return False  # one redelivered job at a time (see the module docs)
        runs = list(self._runs.values())
        self._next_claim = loop.time() + min(self.block_s, min(r.lease_ms for r in runs) / 4000)
        self._claim_turn += 1
        for i in range(len(runs)):
            run = runs[(self._claim_turn + i) % len(runs)]
            keys = run.keys
            got = await self.scripts.claim(
                keys=[keys.jobs, keys.results, keys.events, keys.dead],
                args=[GROUP, self.name, run.lease_ms, run.max_deliveries, run.ttl_ms],
            )
            if got:
                entry_id, job, payload, deliveries = got
                logger.info(
                    "worker %s: took over job %s of run %s (delivery %s)",
                    self.name,
                    job.decode(),
                    run.group,
                    deliveries,
                )
                self._accept(run, entry_id, job, payload, True)
                return True
        return False

    def _accept(
        self, run: _WorkerRun, entry_id: bytes, job: bytes | None, payload: bytes, redelivered: bool
    ) -> None:
        key = (run.keys.run_id, entry_id)
        if key in self._jobs:
            return  # already running here (this worker took its own entry back)
        if job is None:
            logger.warning("worker %s: run %s has an entry without a job id", self.name, run.group)
            return
        item = _Job(run, entry_id, job.decode(), payload, redelivered)
        self._jobs[key] = item
        if self._running() < self.concurrency:
            self._start(item)
        else:
            self._backlog.append(item)

    def _start_backlog(self) -> None:
        while self._backlog and self._running() < self.concurrency:
            item = self._backlog.popleft()
            if (item.run.keys.run_id, item.entry_id) in self._jobs:
                self._start(item)

    def _start(self, item: _Job) -> None:
        key = (item.run.keys.run_id, item.entry_id)
        item.task = asyncio.create_task(self._execute(item), name=f"lgb-job-{item.job}")
        item.task.add_done_callback(lambda _: self._jobs.pop(key, None))

    # -- leases --------------------------------------------------------------------------

    async def _heartbeats(self) -> None:
        while True:
            raise_if_cancel_requested()
            leases = [item.run.lease_ms for item in self._jobs.values()]
            await asyncio.sleep(min(leases, default=1000) / 3000)
            owned: dict[str, list[_Job]] = collections.defaultdict(list)
            for item in self._jobs.values():
                if not item.completing:
                    owned[item.run.keys.run_id].append(item)
            for items in owned.values():
                await self._heartbeat(items)

    async def _heartbeat(self, items: Sequence[_Job]) -> None:
        run = items[0].run
        try:
            lost = await self.scripts.heartbeat(
                keys=[run.keys.jobs], args=[GROUP, self.name, *(j.entry_id for j in items)]
            )
        except CONNECTION_ERRORS as exc:
            logger.debug("worker %s: heartbeat failed: %s", self.name, exc)
            return
        lost_ids = set(lost or ())
        for item in items:
            # A job that finished meanwhile was acked: not lost, just done.
            if item.entry_id in lost_ids and not item.completing:
                logger.info(
                    "worker %s: lost job %s of run %s (taken over, cancelled or finished); "
                    "cancelling it here",
                    self.name,
                    item.job,
                    run.group,
                )
                self._jobs.pop((run.keys.run_id, item.entry_id), None)
                if item.task is not None:
                    item.task.cancel()

    # -- one job -------------------------------------------------------------------------

    async def _call(self, item: _Job, script: Any, keys: list[str], args: list[Any]) -> int:
        """Run a job script, waiting while Redis is unreachable and the job is still ours."""
        redis = RedisWait(f"worker {self.name}", give_up_after=None, logger=logger, quiet=True)
        lost = lambda: (item.run.keys.run_id, item.entry_id) not in self._jobs  # noqa: E731
        reply = await redis.run(script, keys=keys, args=args, abandoned=lost)
        return -1 if reply is None else int(reply)  # -1: the heartbeat found it lost meanwhile

    async def _execute(self, item: _Job) -> None:
        run, keys = item.run, item.run.keys
        started = await self._call(
            item,
            self.scripts.start,
            [keys.jobs, keys.results, keys.events],
            [GROUP, self.name, item.entry_id, item.job, run.ttl_ms],
        )
        if started <= 0:
            logger.debug(
                "worker %s: job %s of run %s: %s",
                self.name,
                item.job,
                run.group,
                "already finished" if started == 0 else "no longer ours",
            )
            return
        payload = await self._invoke(item)
        item.completing = True
        outcome = await self._call(
            item,
            self.scripts.complete,
            [keys.jobs, keys.results, keys.events],
            [GROUP, self.name, item.entry_id, item.job, payload, run.ttl_ms],
        )
        verdict = {1: "accepted", 0: "duplicate"}.get(outcome, "rejected")
        logger.debug(
            "worker %s: job %s of run %s: %s (delivery %d)",
            self.name,
            item.job,
            run.group,
            verdict,
            started,
            extra={"lgb_job": item.job, "lgb_group": run.group, "lgb_verdict": verdict},
        )

    async def _invoke(self, item: _Job) -> bytes:
        run = item.run
        try:
            index = int(item.job)
        except ValueError:
            index = -1
        # The run's group is unique to its Redis run (a digest of the random run id):
        # coalesced tools share within it, in this process and (RedisFlightStore)
        # across the run's workers, never across runs.
        return await invoke_sibling(
            graph=self.graph,
            graph_path=self.graph_path,
            serde=self.serde,
            admission=self.admission,
            group=run.group,
            index=index,
            total=run.total,
            payload=item.input,
            host=f"worker {self.name}",
        )
