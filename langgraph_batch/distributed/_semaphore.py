"""A cluster-wide cap on requests in flight at one inference endpoint, held in Redis.

Each worker's scheduler caps its own requests; N workers would still send N
times that to one server. `ClusterLimitedBackend` wraps a backend so that
every call first takes a lease from a `RedisSemaphore` shared by all
workers, and gives it back when the call ends:

- a lease is a member of a sorted set scored by its expiry time (Redis's
  clock, so workers' clocks never need to agree); `acquire` first removes
  expired leases, which is how the leases of dead workers come back;
- the lease is renewed while the call runs (every third of its length), so
  a long generation keeps it, and released in `finally`, shielded, so a
  cancelled call cannot leak one;
- taking a lease is idempotent (each acquisition has its own holder id), so
  a command redis-py retries after a dropped connection cannot take two.

The scheduler does not know: the wait for a lease happens inside the
backend call it already treats as in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from langgraph_batch.backends.base import (
    Backend,
    ChatChunk,
    ChatRequest,
    ChatResponse,
    EngineMetrics,
    ModelInfo,
)
from langgraph_batch.distributed._keys import semaphore_key
from langgraph_batch.distributed._redis import (
    CLEANUP_ERRORS,
    CONNECTION_ERRORS,
    raise_if_cancel_requested,
)
from langgraph_batch.distributed._redis_wait import RedisWait
from langgraph_batch.distributed._scripts import Scripts

__all__ = ("ClusterLimitedBackend", "RedisSemaphore", "endpoint_key", "limit_backends")

logger = logging.getLogger(__name__)

_RELEASE_TIMEOUT_S = 5.0


class RedisSemaphore:
    """At most `limit` leases at once across every process using the same `key`.

    Example:
        ```python
        sem = RedisSemaphore(client, key=semaphore_key(backend.key), limit=64)
        async with sem.hold():
            ...  # at most 64 of these run at once, cluster-wide
        ```
    """

    def __init__(
        self,
        client: object,
        *,
        key: str,
        limit: int,
        lease_s: float = 30.0,
        unavailable_timeout: float = 30.0,
        scripts: Scripts | None = None,
    ) -> None:
        """Create a semaphore (nothing is written until the first `hold`).

        Args:
            client: A `redis.asyncio.Redis`.
            key: The sorted set holding the leases.
            limit: Leases at once, `>= 1`.
            lease_s: A lease expires this long after it was last renewed, `> 0`.
            unavailable_timeout: Give up waiting for a lease after Redis has
                been unreachable this long (`RedisUnavailableError`; the rule of
                `_redis_wait.RedisWait`).
            scripts: The registered scripts (registered on `client` when None).

        Raises:
            ValueError: If `limit < 1`, `lease_s <= 0` or `unavailable_timeout <= 0`.
        """
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        if not lease_s > 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s!r}")
        if not unavailable_timeout > 0:  # RedisWait's rule, checked here, not at the first wait
            raise ValueError(f"unavailable_timeout must be > 0, got {unavailable_timeout!r}")
        self.key = key
        self.limit = limit
        self.lease_ms = max(1, int(lease_s * 1000))
        self.unavailable_timeout = unavailable_timeout
        self._client = client
        self._scripts = scripts or Scripts(client)
        self._owner = uuid.uuid4().hex[:12]

    def __repr__(self) -> str:
        return f"RedisSemaphore(key={self.key!r}, limit={self.limit})"

    async def _acquire(self, holders: Sequence[str]) -> None:
        # Redis unreachable: `RedisWait` (its cap, its give-up rule). Redis answering
        # that every lease is taken: poll again soon, from 2 ms up to 0.1 s.
        redis = RedisWait(
            f"in-flight lease on {self.key}",
            give_up_after=self.unavailable_timeout,
            logger=logger,
            quiet=True,
        )
        delay = 0.002
        while True:
            got = await redis.run(
                self._scripts.sem_acquire,
                keys=[self.key],
                args=[self.limit, self.lease_ms, *holders],
            )
            if int(got) == 1:  # type: ignore[arg-type]  # never abandoned: never None
                return
            raise_if_cancel_requested()
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.1)

    async def _renew(self, holders: Sequence[str]) -> None:
        warned = False
        while True:
            raise_if_cancel_requested()
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                renewed = await self._scripts.sem_renew(
                    keys=[self.key], args=[self.lease_ms, *holders]
                )
            except CONNECTION_ERRORS:
                renewed = -1
            if int(renewed) < len(holders) and not warned:
                warned = True
                logger.warning(
                    "in-flight lease on %s expired during a call (Redis unreachable or this "
                    "process paused): the cluster cap may be exceeded briefly",
                    self.key,
                )

    async def _release(self, holders: Sequence[str]) -> None:
        try:
            async with asyncio.timeout(_RELEASE_TIMEOUT_S):
                await asyncio.shield(self._scripts.sem_release(keys=[self.key], args=[*holders]))
        except CLEANUP_ERRORS:
            # The lease expires by itself after lease_s.
            logger.debug("could not release in-flight lease on %s", self.key, exc_info=True)

    @contextlib.asynccontextmanager
    async def hold(self, n: int = 1) -> AsyncIterator[None]:
        """Hold `n` leases (all or none) for the body; renewed while it runs.

        Raises:
            ValueError: If `n` is not in `1..limit`.
            RedisUnavailableError: Redis stayed unreachable past `unavailable_timeout`.
        """
        if not 1 <= n <= self.limit:
            raise ValueError(f"n must be in 1..{self.limit}, got {n!r}")
        holders = [f"{self._owner}:{uuid.uuid4().hex[:16]}" for _ in range(n)]
        renewer: asyncio.Task[None] | None = None
        try:
            await self._acquire(holders)
            renewer = asyncio.create_task(self._renew(holders))
            yield
        finally:
            # Also after a cancelled acquire: its script may have run.
            if renewer is not None:
                renewer.cancel()
            await self._release(holders)


class ClusterLimitedBackend(Backend):
    """A backend whose calls each hold a lease of a cluster-wide `RedisSemaphore`.

    Everything else (key, capabilities, metrics) is the wrapped backend's, so
    schedulers and fan_out see the same endpoint.

    Example:
        ```python
        sem = RedisSemaphore(client, key=semaphore_key(inner.key), limit=64)
        backend = ClusterLimitedBackend(inner, sem)
        ```
    """

    def __init__(self, inner: Backend, semaphore: RedisSemaphore) -> None:
        self.inner = inner
        self.semaphore = semaphore
        self.capabilities = inner.capabilities
        self.base_url = inner.base_url

    @property
    def key(self) -> str:
        """The wrapped backend's key."""
        return self.inner.key

    def __repr__(self) -> str:
        return f"ClusterLimitedBackend({self.inner!r}, limit={self.semaphore.limit})"

    async def chat(
        self,
        request: ChatRequest,
        *,
        on_chunk: Callable[[ChatChunk], None] | None = None,
    ) -> ChatResponse:
        """One chat completion, holding one lease."""
        async with self.semaphore.hold():
            return await self.inner.chat(request, on_chunk=on_chunk)

    async def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]:
        """A batch holds one lease per request (split into batches of at most `limit`)."""
        out: list[ChatResponse] = []
        step = self.semaphore.limit
        for start in range(0, len(requests), step):
            chunk = requests[start : start + step]
            async with self.semaphore.hold(len(chunk)):
                out.extend(await self.inner.complete_batch(chunk))
        return out

    async def metrics(self) -> EngineMetrics | None:
        """The wrapped backend's metrics."""
        return await self.inner.metrics()

    async def health(self) -> bool:
        """The wrapped backend's health."""
        return await self.inner.health()

    async def models(self) -> list[ModelInfo]:
        """The wrapped backend's models."""
        return await self.inner.models()

    async def count_tokens(self, model: str, **kw: Any) -> int:
        """The wrapped backend's token count (not counted against the cluster cap)."""
        return await self.inner.count_tokens(model, **kw)

    async def aclose(self) -> None:
        """Close the wrapped backend."""
        await self.inner.aclose()


def endpoint_key(backend: Backend) -> str:
    """What the cluster cap counts per: the server, whoever calls it.

    `backend.key` also names the credentials (schedulers are shared per
    credential), but a server's capacity does not depend on who calls it:
    the cap is per backend type and URL. A backend without a URL (a
    `LangChainBackend`) is capped per its key.
    """
    url = getattr(backend, "base_url", "")
    return f"{type(backend).__name__}:{url}" if isinstance(url, str) and url else backend.key


def limit_backends(
    client: object, *, limit: int, lease_s: float, scripts: Scripts | None = None
) -> Callable[[Backend], Backend]:
    """A registry backend wrapper: one semaphore per endpoint, shared by its schedulers.

    Schedulers of one endpoint with different credentials (see `endpoint_key`)
    share the endpoint's cap.
    """
    semaphores: dict[str, RedisSemaphore] = {}

    def wrap(backend: Backend) -> Backend:
        endpoint = endpoint_key(backend)
        sem = semaphores.get(endpoint)
        if sem is None:
            sem = semaphores[endpoint] = RedisSemaphore(
                client,
                key=semaphore_key(endpoint),
                limit=limit,
                lease_s=lease_s,
                scripts=scripts,
            )
        return ClusterLimitedBackend(backend, sem)

    return wrap
