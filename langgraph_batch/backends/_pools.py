"""The pieces `ShardedTransport` is built from: limits, pools, shards, introspection.

- `CorePool`: one `httpcore.AsyncConnectionPool` behind httpx's transport
  interface (the transport maps its errors);
- `Pool`: one generation of a shard's pool and the requests on it (a pool
  found holding connections nobody owns is retired and replaced);
- `Shard`: a budget of connection slots served by its live pool;
- `CallInfo`: what a backend tells the transport about a call (request id,
  stream, chunks received) for precise error messages;
- `TransportState`: the snapshot `ShardedTransport.state()` returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpcore
import httpx

__all__ = (
    "DEFAULT_LIMITS",
    "DEFAULT_POOL_TIMEOUT",
    "SHARD_CONNECTIONS",
    "CallInfo",
    "CorePool",
    "Pool",
    "Shard",
    "TransportState",
)

DEFAULT_LIMITS = httpx.Limits(
    max_connections=1024, max_keepalive_connections=1024, keepalive_expiry=60.0
)
"""Many concurrent requests to one server: one connection per in-flight request."""

SHARD_CONNECTIONS = 8
"""Connections per pool shard (httpcore's per-event cost grows with its square).

Measured with `benchmarks/http_pool_overhead.py`: 8 costs about a quarter of the
client CPU per request of 32 (idle connections are rescanned on every event).
"""

DEFAULT_POOL_TIMEOUT = 30.0
"""Seconds a request may wait for a free connection before `PoolTimeoutError`."""


@dataclass(slots=True)
class CallInfo:
    """Per-call context the backend hands to the transport (`extensions["lgb"]`).

    The transport reads it only to write a precise error message.

    Example:
        ```python
        info = CallInfo(request_id="lgb-r1")
        await client.post(url, content=body, extensions={"lgb": info})
        ```
    """

    request_id: str | None = None
    """The request id sent to the server."""
    stream: bool = False
    """The body is a stream the caller consumes as it arrives (SSE)."""
    chunks: int = 0
    """Stream events the caller has parsed so far (the backend counts them)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportState:
    """A snapshot of the transport's pools (`ShardedTransport.state()`).

    Example:
        ```python
        s = backend.transport.state()
        assert s.requests_active == 0 and s.connections_active == 0  # idle
        ```
    """

    shards: int
    """Pools created so far (each holds at most `SHARD_CONNECTIONS` connections)."""
    requests_active: int
    """Requests holding a connection slot now (until their response is closed)."""
    requests_waiting: int
    """Requests waiting for a slot (beyond `max_connections`)."""
    connections_active: int
    """Open connections that are not idle: carrying a request, or owned by nobody."""
    connections_idle: int
    """Idle keep-alive connections."""
    pools_repaired: int
    """Pools replaced since start because they held connections no request owned."""
    pools_draining: int
    """Replaced pools still waiting for their last request before they are closed."""


class CorePool(httpx.AsyncBaseTransport):
    """One `httpcore.AsyncConnectionPool` behind httpx's transport interface (no mapping)."""

    __slots__ = ("pool",)

    def __init__(self, pool: httpcore.AsyncConnectionPool) -> None:
        self.pool = pool

    @property
    def connections(self) -> list[httpcore.AsyncConnectionInterface]:
        """The pool's connections (httpcore's public introspection)."""
        return self.pool.connections

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        req = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        resp = await self.pool.handle_async_request(req)
        return httpx.Response(
            status_code=resp.status,
            headers=resp.headers,
            stream=resp.stream,  # type: ignore[arg-type]  # iterated and closed by _Stream
            extensions=resp.extensions,
        )

    async def aclose(self) -> None:
        await self.pool.aclose()


class Pool:
    """One generation of a shard's pool and the requests the transport has on it."""

    __slots__ = ("active", "inner", "retired", "suspect")

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.active = 0
        self.suspect = False
        self.retired = False

    def busy_connections(self) -> int | None:
        """Connections neither idle nor closed (None: the pool cannot tell)."""
        conns = getattr(self.inner, "connections", None)
        if conns is None:
            return None
        return sum(1 for c in conns if not c.is_idle() and not c.is_closed())


class Shard:
    """A slot budget (`capacity` connections) served by one live pool."""

    __slots__ = ("active", "capacity", "limits", "pool")

    def __init__(self, capacity: int, limits: httpx.Limits, pool: Pool) -> None:
        self.capacity = capacity
        self.limits = limits
        self.pool = pool
        self.active = 0
