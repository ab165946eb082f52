"""`RedisExecutor`: the parent side of distributed fan_out.

`fan_out(agent, ..., executor=RedisExecutor(url, graph="myapp.graphs:agent"))`
publishes one job per sibling to a Redis stream; `langgraph-batch worker`
processes (which import the same graph by its import path) run them and
write the outcomes back. The parent is the source of truth:

- it creates the run (a random run id; keys under `{lgb:<run_id>}`), adds
  the jobs, and waits on the run's `events` stream (`XREAD BLOCK`) for
  started / done / dead notices, reading each outcome from the `results`
  hash as its notice arrives;
- every `poll_s` it checks the run's sentinel: when Redis lost the run
  (restarted without persistence) it publishes again every job it has no
  outcome for, and re-reads what is there;
- it refreshes the keys' TTL while it waits, and deletes the run's keys when
  every sibling has an outcome;
- cancelled (the parent run was cancelled), it deletes the jobs stream: the
  workers' next heartbeat fails and they cancel those siblings; outcomes
  already in Redis stay until their TTL;
- a checkpointed parent that died re-attaches when its thread runs again:
  the run id is stored under a key derived from the graph, thread id and
  checkpoint namespace (an HMAC when `secret` is set), and finished
  siblings are collected, not run again; only a run of the same inputs (a
  digest kept in the run's metadata) is re-attached to.

Jobs are executed at least once, results accepted exactly once (the first
result wins, `HSETNX`), so a sibling may run twice after a fault but is
never counted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig

from langgraph_batch._redact import safe_url
from langgraph_batch.distributed._keys import (
    GROUP,
    RunKeys,
    attach_key_of,
    graph_runs_key,
    graph_wake_key,
    new_run_id,
    sibling_group,
)
from langgraph_batch.distributed._redis import (
    CLEANUP_ERRORS,
    connect,
    raise_if_cancel_requested,
)
from langgraph_batch.distributed._redis_wait import RedisWait
from langgraph_batch.distributed._scripts import Scripts
from langgraph_batch.distributed._serde import DEFAULT_MAX_PAYLOAD_BYTES, Serde
from langgraph_batch.errors import (
    DeadLetteredError,
    DistributedError,
    DistributedTimeoutError,
)
from langgraph_batch.nodes import RemoteEvent, SiblingError

__all__ = ("RedisExecutor",)

logger = logging.getLogger(__name__)

_PUBLISH_CHUNK_JOBS = 256
_PUBLISH_CHUNK_BYTES = 4 * 1024 * 1024
_CLEANUP_TIMEOUT_S = 5.0


def _check_graph_path(graph: str) -> str:
    module, sep, attr = graph.partition(":")
    if not (isinstance(graph, str) and sep and module and attr):
        raise ValueError(f"graph must be an import path 'package.module:attribute', got {graph!r}")
    return graph


def _digest(total: int, payloads: Mapping[int, bytes]) -> str:
    h = hashlib.sha256(f"{total}".encode())
    for index in sorted(payloads):
        h.update(f"|{index}:{len(payloads[index])}|".encode() + payloads[index])
    return h.hexdigest()[:32]


def _error(exc: BaseException, index: int) -> RemoteEvent:
    value = SiblingError.from_exception(exc, index=index, item=None).to_dict()
    return RemoteEvent(index=index, kind="failed", value=value)


class RedisExecutor:
    """Run a fan_out's siblings on `langgraph-batch worker` processes through Redis.

    Example:
        ```python
        from langgraph_batch import fan_out
        from langgraph_batch.distributed import RedisExecutor

        node = fan_out(
            agent,
            items="docs",
            into="reviews",
            make_input=lambda doc, i: {"messages": [("user", doc)]},
            result=lambda final: final["messages"][-1].content,
            executor=RedisExecutor("redis://127.0.0.1:6379/0", graph="myapp.graphs:agent"),
        )
        ```

    and on each worker machine:

    ```bash
    langgraph-batch worker redis://127.0.0.1:6379/0 myapp.graphs:agent --concurrency 32
    ```
    """

    def __init__(
        self,
        url: str,
        *,
        graph: str,
        lease_s: float = 30.0,
        max_deliveries: int = 4,
        ttl_s: float = 24 * 3600.0,
        timeout: float | None = None,
        unavailable_timeout: float = 60.0,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        allowed_types: Iterable[type | tuple[str, str]] = (),
        secret: str | bytes | None = None,
        poll_s: float = 1.0,
        socket_timeout: float = 5.0,
        redis_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Create an executor (it connects when a fan_out runs).

        Args:
            url: `redis://[user:password@]host:port/db`, or `rediss://...` for
                TLS (`?ssl_ca_certs=/path/ca.pem` to trust a private CA).
            graph: The sibling graph's import path, `"package.module:attr"`,
                exactly as the workers are started with.
            lease_s: A worker that has not proved it is alive for this long
                loses its jobs to other workers (it heartbeats every third).
            max_deliveries: A job whose worker died this many times is
                dead-lettered: its sibling fails with `DeadLetteredError`.
            ttl_s: Every key of a run expires this long after the parent last
                refreshed it (the parent refreshes while it waits).
            timeout: Give up on siblings without an outcome after this many
                seconds (they fail with `DistributedTimeoutError`); None: wait.
            unavailable_timeout: Raise `RedisUnavailableError` when Redis has
                been unreachable this long.
            max_payload_bytes: Cap on one encoded input or result.
            allowed_types: Classes (or `(module, name)`) to rebuild besides
                the graph's state types; give the workers the same.
            secret: Keys the digest that finds a run again from its thread
                (HMAC), so the attach key of a thread cannot be computed
                without it.
            poll_s: How often the parent checks the run's health (data loss,
                TTL) while it waits.
            socket_timeout: Seconds one Redis command may take.
            redis_options: More `redis.asyncio.Redis.from_url` options.

        Raises:
            ValueError: For a malformed `graph` or an option out of range.
        """
        self.url = url
        self.graph = _check_graph_path(graph)
        for name, value in (
            ("lease_s", lease_s),
            ("ttl_s", ttl_s),
            ("unavailable_timeout", unavailable_timeout),
            ("poll_s", poll_s),
            ("socket_timeout", socket_timeout),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}")
        if max_deliveries < 1:
            raise ValueError(f"max_deliveries must be >= 1, got {max_deliveries!r}")
        if ttl_s < 2 * lease_s:
            raise ValueError(f"ttl_s ({ttl_s!r}) must be at least twice lease_s ({lease_s!r})")
        self.lease_s = lease_s
        self.max_deliveries = max_deliveries
        self.ttl_s = ttl_s
        self.timeout = timeout
        self.unavailable_timeout = unavailable_timeout
        self.max_payload_bytes = max_payload_bytes
        self.allowed_types = tuple(allowed_types)
        self._secret = secret.encode() if isinstance(secret, str) else secret
        self.poll_s = poll_s
        self.socket_timeout = socket_timeout
        self.redis_options = dict(redis_options or {})
        Serde(max_bytes=max_payload_bytes)  # validates the cap now

    def __repr__(self) -> str:
        return f"RedisExecutor({safe_url(self.url)!r}, graph={self.graph!r})"

    async def run(
        self,
        subgraph: Any,
        inputs: Sequence[tuple[int, Any]],
        *,
        total: int,
        config: RunnableConfig,
    ) -> AsyncIterator[RemoteEvent]:
        """Publish the siblings, yield their events as workers report them (`SiblingExecutor`).

        Raises:
            RedisUnavailableError: Redis stayed unreachable past `unavailable_timeout`.
        """
        serde = Serde.for_graph(
            subgraph, extra=self.allowed_types, max_bytes=self.max_payload_bytes
        )
        client = connect(self.url, socket_timeout=self.socket_timeout, **self.redis_options)
        run = _ParentRun(self, client, serde, inputs, total, config)
        finished = False
        try:
            async for event in run.stream():
                yield event
            finished = True
        finally:
            try:
                async with asyncio.timeout(_CLEANUP_TIMEOUT_S):
                    await asyncio.shield(run.close(finished))
            except CLEANUP_ERRORS:
                logger.warning("could not clean up run %s (its keys expire by TTL)", run.group)
            finally:
                with contextlib.suppress(Exception):
                    await client.aclose()


class _ParentRun:
    """One fan_out invocation's run in Redis, from the parent's side."""

    def __init__(
        self,
        ex: RedisExecutor,
        client: Any,
        serde: Serde,
        inputs: Sequence[tuple[int, Any]],
        total: int,
        config: RunnableConfig,
    ) -> None:
        self.ex = ex
        self.client = client
        self.scripts = Scripts(client)
        self.serde = serde
        self.inputs = inputs
        self.total = total
        self.attach = attach_key_of(ex.graph, config, ex._secret)
        self.run_id = ""
        self.keys = RunKeys("")
        self.group = "-"
        self.payloads: dict[int, bytes] = {}
        self.digest = ""
        """Of the serialised inputs: a re-attach requires the same (see `_open`)."""
        self.known: set[int] = set()
        self.started: set[int] = set()
        self.opened = False
        self.ttl_ms = int(ex.ttl_s * 1000)
        self._redis = RedisWait(
            "run -",
            give_up_after=ex.unavailable_timeout,
            hint=f"Redis at {safe_url(ex.url)}; run the thread again to re-attach",
            logger=logger,
        )
        self._refreshed = 0.0

    # -- resilience ----------------------------------------------------------------------

    async def _retry(self, fn: Any, *args: Any) -> Any:
        """Run `fn(*args)` until Redis answers, or raise when it has been down too long."""
        self._redis.what = f"run {self.group}"
        return await self._redis.run(fn, *args)

    # -- opening and publishing -----------------------------------------------------------

    async def _open(self) -> bool:
        """Find the run again (True) or start a new one; then publish what has no outcome."""
        reattached = False
        if self.attach is not None:
            raw = await self.client.get(self.attach)
            if raw:
                keys = RunKeys(raw.decode())
                meta = await self.client.hgetall(keys.meta)
                # Only a run of these very inputs is this invocation's run: another
                # one's outcomes would silently become this one's results.
                if (
                    meta.get(b"graph", b"").decode() == self.ex.graph
                    and meta.get(b"total", b"").decode() == str(self.total)
                    and meta.get(b"inputs", b"").decode() == self.digest
                ):
                    self.run_id, reattached = keys.run_id, True
                else:
                    logger.info("an earlier run of this thread had other inputs: a new run")
        if not reattached:
            self.run_id = new_run_id()
        self.keys = RunKeys(self.run_id)
        self.group = sibling_group(self.run_id)
        return reattached

    async def _publish(self) -> None:
        keys, now = self.keys, time.time()
        meta = {
            "graph": self.ex.graph,
            "total": str(self.total),
            "inputs": self.digest,
            "group": self.group,
            "lease_ms": str(int(self.ex.lease_s * 1000)),
            "max_deliveries": str(self.ex.max_deliveries),
            "ttl_ms": str(self.ttl_ms),
            "state": "running",
            "sentinel": "1",
            "created": f"{now:.3f}",
        }
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(keys.meta, mapping=meta)
            pipe.pexpire(keys.meta, self.ttl_ms)
            if self.attach is not None:
                pipe.set(self.attach, self.run_id, px=self.ttl_ms)
            await pipe.execute()
        batch: list[bytes | str] = []
        size = 0
        added = 0
        for index, payload in self.payloads.items():
            if index in self.known:
                continue
            batch += [str(index), payload]
            size += len(payload)
            if len(batch) >= 2 * _PUBLISH_CHUNK_JOBS or size >= _PUBLISH_CHUNK_BYTES:
                added += int(
                    await self.scripts.publish(keys=keys.all(), args=[GROUP, self.ttl_ms, *batch])
                )
                batch, size = [], 0
        if batch:
            added += int(
                await self.scripts.publish(keys=keys.all(), args=[GROUP, self.ttl_ms, *batch])
            )
        await self._announce()
        self.opened = True
        logger.debug("run %s: %d jobs published for graph %s", self.group, added, self.ex.graph)

    async def _announce(self) -> None:
        """(Re)list the run for the workers, refresh every TTL, wake idle workers."""
        runs, wake = graph_runs_key(self.ex.graph), graph_wake_key(self.ex.graph)
        expiry = int(time.time() * 1000) + self.ttl_ms
        async with self.client.pipeline(transaction=False) as pipe:
            for key in self.keys.all():
                pipe.pexpire(key, self.ttl_ms)
            if self.attach is not None:
                pipe.pexpire(self.attach, self.ttl_ms)
            pipe.zremrangebyscore(runs, "-inf", int(time.time() * 1000))
            pipe.zadd(runs, {self.run_id: expiry})
            pipe.pexpire(runs, self.ttl_ms)
            pipe.xadd(wake, {"run": self.group}, maxlen=64, approximate=True)
            pipe.pexpire(wake, self.ttl_ms)
            await pipe.execute()
        self._refreshed = time.monotonic()

    # -- outcomes ------------------------------------------------------------------------

    def _outcome(self, index: int, payload: bytes | None) -> RemoteEvent | None:
        if payload is None:
            return None
        try:
            record = self.serde.loads(payload, what="result")
            kind, value = record["k"], record["v"]
        except DistributedError as exc:
            return _error(exc, index)
        except (KeyError, TypeError) as exc:
            return _error(DistributedError(f"malformed result record: {exc!r}"), index)
        if kind == "ok":
            return RemoteEvent(index=index, kind="finished", value=value)
        return RemoteEvent(index=index, kind="failed", value=dict(value))

    def _dead(self, index: int, deliveries: bytes | None) -> RemoteEvent:
        n = int(deliveries or 0)
        exc = DeadLetteredError(
            f"sibling {index} was dead-lettered: every worker that took it died "
            f"({n} deliveries, max_deliveries={self.ex.max_deliveries}); see the workers' logs",
            deliveries=n,
        )
        return _error(exc, index)

    def _take(self, events: Iterable[RemoteEvent | None]) -> list[RemoteEvent]:
        out: list[RemoteEvent] = []
        for event in events:
            if event is not None and event.index in self.payloads and event.index not in self.known:
                self.known.add(event.index)
                out.append(event)
        return out

    async def _fetch(self, done: list[int], dead: list[int]) -> list[RemoteEvent]:
        found: list[RemoteEvent | None] = []
        if done:
            values = await self.client.hmget(self.keys.results, [str(i) for i in done])
            found += [self._outcome(i, v) for i, v in zip(done, values, strict=True)]
        if dead:
            values = await self.client.hmget(self.keys.dead, [str(i) for i in dead])
            found += [self._dead(i, v) for i, v in zip(dead, values, strict=True) if v is not None]
        return self._take(found)

    async def _sync(self) -> list[RemoteEvent]:
        """Every outcome in Redis we have not seen yet."""
        results = await self.client.hgetall(self.keys.results)
        dead = await self.client.hgetall(self.keys.dead)
        found: list[RemoteEvent | None] = []
        for raw, payload in results.items():
            with contextlib.suppress(ValueError):
                found.append(self._outcome(int(raw), payload))
        for raw, n in dead.items():
            with contextlib.suppress(ValueError):
                found.append(self._dead(int(raw), n))
        return self._take(found)

    async def _check(self) -> tuple[bool, list[RemoteEvent]]:
        """Detect a data loss (re-publish), refresh TTLs, pick up outcomes we missed."""
        if await self.client.hget(self.keys.meta, "sentinel") is None:
            missing = len(self.payloads) - len(self.known)
            logger.warning(
                "run %s: Redis lost the run's data (restarted without persistence?); "
                "publishing the %d siblings without an outcome again",
                self.group,
                missing,
            )
            await self._publish()
            return True, []
        if await self.client.scard(self.keys.queued) < len(self.payloads):
            # A partial loss (e.g. AOF fsync'd every second) dropped jobs we published.
            logger.warning("run %s: jobs missing in Redis; publishing them again", self.group)
            await self._publish()
        if time.monotonic() - self._refreshed > min(self.ttl_ms / 3000, 60.0):
            await self._announce()
        counts = await self.client.hlen(self.keys.results) + await self.client.hlen(self.keys.dead)
        if counts > len(self.known):
            return False, await self._sync()
        return False, []

    # -- the stream of events ------------------------------------------------------------

    async def stream(self) -> AsyncIterator[RemoteEvent]:
        """Open or re-attach, publish, then yield events until every sibling has an outcome."""
        for index, value in self.inputs:
            try:
                self.payloads[index] = self.serde.dumps(value, what="input")
            except (DistributedError, TypeError) as exc:
                yield _error(exc, index)
        if not self.payloads:
            return
        self.digest = _digest(self.total, self.payloads)
        if await self._retry(self._open):
            backlog = await self._retry(self._sync)
            logger.info(
                "run %s: re-attached, %d of %d siblings already have an outcome",
                self.group,
                len(backlog),
                len(self.payloads),
            )
            for event in backlog:
                yield event
        await self._retry(self._publish)
        loop = asyncio.get_running_loop()
        deadline = None if self.ex.timeout is None else loop.time() + self.ex.timeout
        next_check = loop.time() + self.ex.poll_s
        block_ms = max(1, int(self.ex.poll_s * 1000))
        last = "0-0"
        # No worker took any sibling within two leases: say so, once (the run waits on).
        idle_warning_at: float | None = loop.time() + 2 * self.ex.lease_s
        while len(self.known) < len(self.payloads):
            raise_if_cancel_requested()
            if idle_warning_at is not None and loop.time() >= idle_warning_at:
                idle_warning_at = None
                if not self.started and not self.known:
                    logger.warning(
                        "run %s: no worker has taken any of its %d siblings in %.0f s; is "
                        "`langgraph-batch worker <redis url> %s` running against this Redis?",
                        self.group,
                        len(self.payloads),
                        2 * self.ex.lease_s,
                        self.ex.graph,
                    )
            if deadline is not None and loop.time() >= deadline:
                for index in sorted(set(self.payloads) - self.known):
                    msg = f"sibling {index} had no outcome after timeout={self.ex.timeout} s"
                    yield _error(
                        DistributedTimeoutError(msg, timeout_s=self.ex.timeout or 0), index
                    )
                return
            reply = await self._retry(self.client.xread, {self.keys.events: last}, 512, block_ms)
            done: list[int] = []
            dead: list[int] = []
            for _stream, entries in reply or ():
                for entry_id, fields in entries:
                    last = entry_id
                    try:
                        index = int(fields.get(b"job", b""))
                    except ValueError:
                        continue
                    if index not in self.payloads or index in self.known:
                        continue
                    kind = fields.get(b"kind")
                    if kind == b"started" and index not in self.started:
                        self.started.add(index)
                        yield RemoteEvent(index=index, kind="started")
                    elif kind == b"done":
                        done.append(index)
                    elif kind == b"dead":
                        dead.append(index)
            if done or dead:
                for event in await self._retry(self._fetch, done, dead):
                    yield event
            if loop.time() >= next_check:
                next_check = loop.time() + self.ex.poll_s
                lost, found = await self._retry(self._check)
                if lost:
                    last = "0-0"
                for event in found:
                    yield event

    # -- the end -------------------------------------------------------------------------

    async def close(self, finished: bool) -> None:
        """Delete the run's keys (finished), or cancel its outstanding jobs (not finished)."""
        if not self.opened:
            return
        keys = self.keys
        if finished:
            flights = await self.client.smembers(keys.flights)
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.delete(*keys.all(), *flights)
                if self.attach is not None:
                    pipe.delete(self.attach)
                pipe.zrem(graph_runs_key(self.ex.graph), self.run_id)
                await pipe.execute()
            logger.debug("run %s: finished, keys deleted", self.group)
            return
        # Cancelled (or failed): the workers lose their leases at the next heartbeat
        # and cancel these siblings; outcomes stay (TTL) for a re-attach.
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(keys.jobs, keys.queued)
            pipe.hset(keys.meta, "state", "cancelled")
            pipe.zrem(graph_runs_key(self.ex.graph), self.run_id)
            await pipe.execute()
        logger.info(
            "run %s: cancelled with %d siblings outstanding",
            self.group,
            len(self.payloads) - len(self.known),
        )
