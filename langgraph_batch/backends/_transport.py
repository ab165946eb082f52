"""`ShardedTransport`: the one HTTP seam of the backends.

Every request a backend sends goes through one `httpx.AsyncBaseTransport`
that owns the three things an inference client must get right:

- **Sharding.** httpcore's pool does O(requests x connections) bookkeeping on
  every request event, so one pool with hundreds of requests in flight spends
  most of the process's CPU there (`benchmarks/http_pool_overhead.py`).
  Requests are spread over small `httpcore.AsyncConnectionPool`s of at most
  `SHARD_CONNECTIONS` connections each; together they never hold more than
  `limits.max_connections`.
- **Admission and the pool timeout.** A request takes a free connection slot
  of a shard before it enters that shard's pool, so httpcore never queues a
  request. Beyond `max_connections` requests wait in FIFO order for at most
  `pool_timeout` seconds, then fail with the retryable `PoolTimeoutError`
  instead of waiting forever.
- **Cancellation never poisons a pool.** httpcore (1.0.x) can leave a
  connection that no request owns when a caller is cancelled at an unlucky
  moment (a new connection assigned but not yet opened, a request cancelled
  between connecting and sending, a close interrupted by a second
  cancellation; encode/httpcore#658, #830, #1093). Such a connection counts
  against the pool's limit forever, and with no pool timeout every later call
  waits forever. The transport closes what it opened when its caller is
  cancelled (a cancelled close runs in a shielded, time-bounded task), and
  after any abnormal exit it checks the pool: when it holds more busy
  connections than the transport has requests on it, the pool is replaced by
  a fresh one and closed (with its orphans) as soon as its last request ends.
  `state()` reports connections and repairs.
- **Errors.** Everything the transport does goes through the one error table
  (`_errormap.mapped_error`, `map_transport_errors`) that turns httpcore and
  httpx exceptions into the `langgraph_batch.errors` tree (httpx's
  `map_httpcore_exceptions` is the model), for the request and for the
  response body, streams included.

A caller-supplied transport (`httpx.MockTransport` in tests) takes the place
of the pools: admission, the pool timeout and error mapping still apply.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpcore
import httpx

from langgraph_batch.backends._errormap import (
    call_context,
    map_transport_errors,
    mapped_error,
)
from langgraph_batch.backends._pools import (
    DEFAULT_LIMITS,
    DEFAULT_POOL_TIMEOUT,
    SHARD_CONNECTIONS,
    CallInfo,
    CorePool,
    Pool,
    Shard,
    TransportState,
)
from langgraph_batch.errors import BackendConnectionError, PoolTimeoutError

__all__ = (
    "DEFAULT_LIMITS",
    "DEFAULT_POOL_TIMEOUT",
    "SHARD_CONNECTIONS",
    "CallInfo",
    "ShardedTransport",
    "TransportState",
    "map_transport_errors",
    "mapped_error",
)

logger = logging.getLogger(__name__)

_CLEANUP_TIMEOUT_S = 5.0

# ------------------------------------------------------------------------------ requests


class _Stream(httpx.AsyncByteStream):
    """A response body: maps its errors and gives the slot back when closed."""

    __slots__ = ("_abnormal", "_closed", "_inner", "_pool", "_request", "_shard", "_transport")

    def __init__(
        self,
        transport: ShardedTransport,
        shard: Shard,
        pool: Pool,
        inner: Any,
        request: httpx.Request,
    ) -> None:
        self._transport = transport
        self._shard = shard
        self._pool = pool
        self._inner = inner
        self._request = request
        self._closed = False
        self._abnormal = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._inner:
                yield part
        except Exception as exc:
            self._abnormal = True
            request = self._request
            rid, read, info = call_context(request)
            mapped = mapped_error(
                exc,
                request.url,
                request_id=rid,
                read_timeout=read,
                phase="stream" if info is not None and info.stream else "body",
                chunks=info.chunks if info is not None else 0,
            )
            if mapped is None or mapped is exc:
                raise
            raise mapped from exc
        except BaseException:
            self._abnormal = True
            raise

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        task = asyncio.current_task()
        if self._abnormal or (task is not None and task.cancelling()):
            # The caller is being cancelled (or the body broke): close in a task of
            # its own, so that a second cancellation cannot interrupt httpcore's
            # cleanup half-way, and wait for it for a bounded time.
            await self._transport._shielded(self._close(abnormal=True), "close a response")
        else:
            await self._close(abnormal=False)

    async def _close(self, *, abnormal: bool) -> None:
        try:
            close = getattr(self._inner, "aclose", None)
            if close is not None:
                await close()
        except BaseException:
            abnormal = True
            raise
        finally:
            self._transport._release(self._shard, self._pool, abnormal=abnormal)


class ShardedTransport(httpx.AsyncBaseTransport):
    """Small connection pools that together respect one set of limits.

    Example:
        ```python
        transport = ShardedTransport(limits=httpx.Limits(max_connections=256), pool_timeout=30)
        async with httpx.AsyncClient(transport=transport) as client:
            await client.get("http://127.0.0.1:8000/health")
        print(transport.state())
        ```

    Args:
        limits: the limits of all pools together (default: 1024 connections,
            keep-alive 60 s). `max_connections=None` means unlimited.
        shard_connections: connections per pool; pools are created on demand,
            when every existing one carries as many requests as it has
            connections.
        pool_timeout: seconds a request waits for a free connection beyond
            `max_connections` (None: no limit).
        ssl_context: TLS settings for https (built once by the caller).
        proxy: an HTTP(S) proxy URL for every request (None: direct).
        inner: a caller-supplied transport used instead of the pools (tests pass
            `httpx.MockTransport`); admission and error mapping still apply.
        shard_factory: builds the transport of one shard from its limits
            (tests use it to observe sharding); default: an httpcore pool.
        on_response: called with every request and its response as the headers arrive (the
            rate budget reads its limit headers there); must not raise.

    Raises:
        ValueError: `shard_connections < 1`, `max_connections < 1` or a
            non-positive `pool_timeout`.
    """

    def __init__(
        self,
        *,
        limits: httpx.Limits = DEFAULT_LIMITS,
        shard_connections: int = SHARD_CONNECTIONS,
        pool_timeout: float | None = DEFAULT_POOL_TIMEOUT,
        ssl_context: Any = None,
        proxy: str | None = None,
        inner: httpx.AsyncBaseTransport | None = None,
        shard_factory: Callable[[httpx.Limits], httpx.AsyncBaseTransport] | None = None,
        on_response: Callable[[httpx.Request, httpx.Response], None] | None = None,
    ) -> None:
        if not isinstance(shard_connections, int) or shard_connections < 1:
            raise ValueError(f"shard_connections must be an int >= 1, got {shard_connections!r}")
        total = limits.max_connections
        if total is not None and total < 1:
            raise ValueError(f"limits.max_connections must be >= 1 or None, got {total!r}")
        if pool_timeout is not None and not pool_timeout > 0:
            raise ValueError(f"pool_timeout must be > 0 seconds or None, got {pool_timeout!r}")
        self._limits = limits
        self._size = shard_connections
        self.pool_timeout = pool_timeout
        self._ssl_context = ssl_context
        self._proxy = httpcore.Proxy(proxy) if proxy else None
        self._inner = inner
        self._factory = shard_factory
        self._on_response = on_response
        self._left = total
        self._keepalive_left = limits.max_keepalive_connections
        self._shards: list[Shard] = []
        self._active = 0
        self._waiters: collections.deque[asyncio.Future[Shard]] = collections.deque()
        self._cleanups: set[asyncio.Task[None]] = set()
        self._draining: set[Pool] = set()
        self._repaired = 0
        self._closed = False

    # ------------------------------------------------------------------ introspection

    @property
    def max_connections(self) -> int | None:
        """The total connection limit (None: unlimited)."""
        return self._limits.max_connections

    def state(self) -> TransportState:
        """Requests, connections and repairs now.

        Example:
            ```python
            assert transport.state().connections_active == 0
            ```
        """
        busy = idle = 0
        for pool in [s.pool for s in self._shards] + list(self._draining):
            conns = getattr(pool.inner, "connections", None) or ()
            for c in conns:
                if c.is_closed():
                    continue
                if c.is_idle():
                    idle += 1
                else:
                    busy += 1
        return TransportState(
            shards=len(self._shards),
            requests_active=self._active,
            requests_waiting=sum(1 for f in self._waiters if not f.done()),
            connections_active=busy,
            connections_idle=idle,
            pools_repaired=self._repaired,
            pools_draining=len(self._draining),
        )

    # ------------------------------------------------------------------ shards

    def _new_pool(self, limits: httpx.Limits) -> Pool:
        if self._inner is not None:
            return Pool(self._inner)
        if self._factory is not None:
            return Pool(self._factory(limits))
        return Pool(
            CorePool(
                httpcore.AsyncConnectionPool(
                    ssl_context=self._ssl_context,
                    proxy=self._proxy,
                    max_connections=limits.max_connections,
                    max_keepalive_connections=limits.max_keepalive_connections,
                    keepalive_expiry=limits.keepalive_expiry,
                )
            )
        )

    def _can_grow(self) -> bool:
        if not self._shards:
            return True
        if self._inner is not None:
            return False
        return self._left is None or self._left > 0

    def _add_shard(self) -> Shard:
        limits = self._limits
        total = limits.max_connections
        if self._inner is not None or (total is not None and total <= self._size):
            capacity = total if total is not None else self._size
            if self._inner is not None and total is None:
                capacity = 1 << 30
            shard_limits = limits
            self._left = 0
        else:
            capacity = self._size if self._left is None else min(self._size, self._left)
            keepalive: int | None = None
            if self._keepalive_left is not None:
                share = (
                    capacity
                    if total is None
                    else max(1, limits.max_keepalive_connections * capacity // total)  # type: ignore[operator]
                )
                keepalive = min(capacity, share, self._keepalive_left)
                self._keepalive_left -= keepalive
            if self._left is not None:
                self._left -= capacity
            shard_limits = httpx.Limits(
                max_connections=capacity,
                max_keepalive_connections=keepalive,
                keepalive_expiry=limits.keepalive_expiry,
            )
        shard = Shard(capacity, shard_limits, self._new_pool(shard_limits))
        self._shards.append(shard)
        return shard

    def _try_acquire(self) -> Shard | None:
        best: Shard | None = None
        for shard in self._shards:
            if shard.active < shard.capacity and (best is None or shard.active < best.active):
                best = shard
                if not shard.active:
                    break
        if best is None and self._can_grow():
            best = self._add_shard()
        if best is not None:
            best.active += 1
            self._active += 1
        return best

    async def _acquire(self, request: httpx.Request) -> Shard:
        if not self._waiters:
            shard = self._try_acquire()
            if shard is not None:
                return shard
        fut: asyncio.Future[Shard] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            if self.pool_timeout is None:
                return await fut
            async with asyncio.timeout(self.pool_timeout):
                return await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                # Granted a slot just as we gave up: hand it on.
                self._release_slot(fut.result())
            else:
                fut.cancel()
            if isinstance(exc, TimeoutError):
                rid, _, _ = call_context(request)
                raise PoolTimeoutError(
                    f"no connection to {request.url.host} became free within "
                    f"{self.pool_timeout} s: all {self.max_connections} connections carry "
                    "requests; raise `limits.max_connections` or `pool_timeout`, or lower "
                    "max_inflight",
                    url=str(request.url),
                    request_id=rid,
                    pool_timeout_s=self.pool_timeout,
                    max_connections=self.max_connections,
                ) from None
            raise

    def _release(self, shard: Shard, pool: Pool, *, abnormal: bool) -> None:
        """A request on `pool` is over (its response closed, or it failed)."""
        pool.active -= 1
        if abnormal:
            pool.suspect = True
        if pool.suspect:
            self._check(shard, pool)
        if pool.retired and pool.active == 0 and pool in self._draining:
            self._draining.discard(pool)
            self._spawn(self._close_pool(pool))
        self._release_slot(shard)

    def _release_slot(self, shard: Shard) -> None:
        """Give a connection slot of `shard` back: to the first waiter, if any."""
        shard.active -= 1
        self._active -= 1
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                shard.active += 1
                self._active += 1
                fut.set_result(shard)
                return

    def _check(self, shard: Shard, pool: Pool) -> None:
        """Replace a pool that holds connections no request owns (see the module doc)."""
        if pool.retired:
            return
        busy = pool.busy_connections()
        if busy is None:
            pool.suspect = False
            return
        if busy <= pool.active:
            if pool.active == 0:
                pool.suspect = False  # nothing in flight and nothing busy: clean
            return
        self._repaired += 1
        logger.info(
            "HTTP pool repaired: %d connection(s) left busy by a cancelled request "
            "(%d request(s) on the pool); the pool is replaced and closed when idle",
            busy - pool.active,
            pool.active,
        )
        pool.retired = True
        if shard.pool is pool and not self._closed:
            shard.pool = self._new_pool(shard.limits)
        if pool.active == 0:
            self._spawn(self._close_pool(pool))
        else:
            self._draining.add(pool)

    async def _close_pool(self, pool: Pool) -> None:
        if pool.inner is self._inner:
            return
        async with asyncio.timeout(_CLEANUP_TIMEOUT_S):
            await pool.inner.aclose()

    def _spawn(self, coro: Any) -> asyncio.Task[None] | None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no running loop (garbage collection at shutdown)
            coro.close()
            return None
        self._cleanups.add(task)
        task.add_done_callback(self._cleanup_done)
        return task

    def _cleanup_done(self, task: asyncio.Task[None]) -> None:
        self._cleanups.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.debug("HTTP cleanup failed: %r", exc)

    async def _shielded(self, coro: Any, what: str) -> None:
        task = self._spawn(coro)
        if task is None:
            return
        try:
            async with asyncio.timeout(_CLEANUP_TIMEOUT_S):
                await asyncio.shield(task)
        except TimeoutError:
            logger.warning("HTTP transport: %s took over %s s", what, _CLEANUP_TIMEOUT_S)
        except Exception as exc:
            logger.debug("HTTP transport: %s failed: %r", what, exc)

    # ------------------------------------------------------------------ requests

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send one request on a free connection of some shard (see the class doc).

        Raises:
            PoolTimeoutError: no connection became free within `pool_timeout`.
            BackendError: the transport failure, mapped (`map_transport_errors`).
        """
        if self._closed:
            raise BackendConnectionError(
                f"the HTTP transport for {request.url.host} is closed: create a new backend",
                url=str(request.url),
            )
        shard = await self._acquire(request)
        pool = shard.pool
        pool.active += 1
        try:
            response = await pool.inner.handle_async_request(request)
        except BaseException as exc:
            self._release(shard, pool, abnormal=True)
            if isinstance(exc, Exception):
                rid, read, _ = call_context(request)
                mapped = mapped_error(exc, request.url, request_id=rid, read_timeout=read)
                if mapped is not None and mapped is not exc:
                    raise mapped from exc
            raise
        if self._on_response is not None:
            self._on_response(request, response)
        if response.is_closed:
            # A body already read into memory (httpx.MockTransport): nothing stays open.
            self._release(shard, pool, abnormal=False)
        else:
            response.stream = _Stream(self, shard, pool, response.stream, request)
        return response

    async def aclose(self) -> None:
        """Close every pool (open responses too) and wait for pending cleanups (bounded)."""
        if self._closed:
            return
        self._closed = True
        for fut in self._waiters:
            fut.cancel()
        pools = [s.pool for s in self._shards] + list(self._draining)
        self._draining.clear()
        closers = [self._close_pool(p) for p in pools]
        pending = list(self._cleanups)
        if closers or pending:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_CLEANUP_TIMEOUT_S):
                    await asyncio.shield(asyncio.gather(*closers, *pending, return_exceptions=True))
