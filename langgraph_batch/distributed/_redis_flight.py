"""Cross-worker single flight for coalesced tool calls, scoped to one run.

Within one process, `Coalescer` already runs identical concurrent calls once.
On a worker, `RedisFlightStore` (installed with `set_flight_store`) extends
that to every worker of the same run:

1. `SET lock token NX PX lease` elects a leader per call key; the leader
   runs the tool and renews the lock (every third of the lease) while it runs;
2. its result, serialised strictly, goes into a one-entry stream; waiters
   block on `XREAD ... STREAMS res 0-0`, which returns at once when the
   result is already there and otherwise wakes them when it arrives;
3. a waiter that wakes without a result checks again: when the leader died
   (its lock expired) or failed (it deleted its lock and shares no error
   across processes), a waiter becomes the leader and runs the call.

Keys live under the run's hash tag and are listed in the run's `sf` set, so
they end with the run; they never cross runs. A call whose key is not made
of plain values (str, int, float, bool, None, tuples) is not shared across
processes: its `repr` might differ between them. When Redis cannot be
reached the call runs locally: coalescing saves work, it never blocks it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from langgraph_batch._context import current_sibling
from langgraph_batch.distributed._keys import RunKeys
from langgraph_batch.distributed._redis import (
    CLEANUP_ERRORS,
    CONNECTION_ERRORS,
    raise_if_cancel_requested,
)
from langgraph_batch.distributed._scripts import Scripts
from langgraph_batch.distributed._serde import Serde
from langgraph_batch.errors import DistributedError

__all__ = ("RedisFlightStore", "key_digest")

logger = logging.getLogger(__name__)

_PLAIN = (str, int, float, bool, type(None))


def _canonical(key: Hashable) -> str | None:
    if isinstance(key, _PLAIN):
        return repr(key)
    if isinstance(key, tuple):
        parts: list[str] = []
        for item in key:
            text = _canonical(item)
            if text is None:
                return None
            parts.append(text)
        return "(" + ",".join(parts) + ")"
    return None


def key_digest(key: Hashable) -> str | None:
    """A digest of a call key that every process computes alike, or None when it cannot."""
    text = _canonical(key)
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()[:32]


class RedisFlightStore:
    """A `FlightStore` (see `langgraph_batch.tools._singleflight.set_flight_store`) on Redis.

    `runs` maps a sibling group (`SiblingInfo.group` on a worker) to the keys
    of its run; calls from siblings of unknown runs run locally.

    Example:
        ```python
        store = RedisFlightStore(client, serde=serde, runs=worker_runs)
        set_flight_store(store)
        ```
    """

    def __init__(
        self,
        client: Any,
        *,
        serde: Serde,
        runs: Callable[[str], tuple[RunKeys, int] | None],
        lease_s: float = 10.0,
        wait_s: float = 1.0,
        scripts: Scripts | None = None,
    ) -> None:
        """Create a store.

        Args:
            client: A `redis.asyncio.Redis`.
            serde: Encodes the shared results (strict msgpack, size cap).
            runs: `group -> (run keys, ttl_ms)` for the runs this process works on.
            lease_s: The leader's lock lasts this long past its last renewal.
            wait_s: A waiter re-checks the lock at least this often.
            scripts: The registered scripts (registered on `client` when None).
        """
        self._client = client
        self._serde = serde
        self._runs = runs
        self.lease_ms = max(1, int(lease_s * 1000))
        self.wait_ms = max(1, int(wait_s * 1000))
        self._scripts = scripts or Scripts(client)

    def _run_of(self, scope: Hashable) -> tuple[RunKeys, int] | None:
        sibling = current_sibling()
        if sibling is not None:
            found = self._runs(sibling.group)
            if found is not None:
                return found
        return self._runs(scope) if isinstance(scope, str) else None

    async def run(
        self,
        scope: Hashable,
        key: Hashable,
        fn: Callable[[], Awaitable[Any]],
        storable: Callable[[Any], bool],
        *,
        ttl: float | None = None,
    ) -> Any:
        """Return the run's shared result for `key`, or run `fn` as the leader and share it.

        A shared result lives as long as the run's keys, or `ttl` seconds when shorter.
        """
        found = self._run_of(scope)
        digest = key_digest(key)
        if found is None or digest is None:
            return await fn()
        run, ttl_ms = found
        keep_ms = ttl_ms if ttl is None else max(1, min(ttl_ms, int(ttl * 1000)))
        lock, res = run.flight(digest)
        token = uuid.uuid4().hex
        while True:
            raise_if_cancel_requested()
            try:
                state, payload = await self._acquire(run, lock, res, token, ttl_ms)
                if state == "done":
                    try:
                        return self._serde.loads(payload, what="tool result")
                    except DistributedError:
                        logger.warning("shared tool result rejected; running the call here")
                        return await fn()
                if state == "norun":
                    return await fn()
                if state == "leader":
                    return await self._lead(run, lock, res, token, ttl_ms, keep_ms, fn, storable)
                got = await self._client.xread({res: "0-0"}, count=1, block=self.wait_ms)
            except CONNECTION_ERRORS:
                logger.warning("Redis unreachable: running the coalesced call here", exc_info=True)
                return await fn()
            if got:
                entry = got[0][1][0][1]
                try:
                    return self._serde.loads(entry[b"v"], what="tool result")
                except (DistributedError, KeyError):
                    return await fn()

    async def _acquire(
        self, run: RunKeys, lock: str, res: str, token: str, ttl_ms: int
    ) -> tuple[str, bytes]:
        reply = await self._scripts.sf_acquire(
            keys=[lock, res, run.flights, run.meta], args=[token, self.lease_ms, ttl_ms]
        )
        state = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        return state, (reply[1] if len(reply) > 1 else b"")

    async def _renew(self, lock: str, token: str) -> None:
        while True:
            raise_if_cancel_requested()
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                if not int(await self._scripts.sf_renew(keys=[lock], args=[token, self.lease_ms])):
                    logger.debug(
                        "coalesced call lost its lock %s (another process may run it)", lock
                    )
                    return
            except CONNECTION_ERRORS:
                logger.debug("could not renew coalesced call lock", exc_info=True)

    async def _lead(
        self,
        run: RunKeys,
        lock: str,
        res: str,
        token: str,
        ttl_ms: int,
        keep_ms: int,
        fn: Callable[[], Awaitable[Any]],
        storable: Callable[[Any], bool],
    ) -> Any:
        renewer = asyncio.create_task(self._renew(lock, token))
        payload = b""
        try:
            value = await fn()
            if storable(value):
                try:
                    payload = self._serde.dumps(value, what="tool result")
                except (DistributedError, TypeError):
                    logger.debug("coalesced result not shareable across workers", exc_info=True)
            return value
        finally:
            renewer.cancel()
            # Publish (or just release, on error or cancellation) even if cancelled.
            try:
                async with asyncio.timeout(5.0):
                    await asyncio.shield(
                        self._scripts.sf_finish(
                            keys=[lock, res, run.meta], args=[token, payload, keep_ms]
                        )
                    )
            except CLEANUP_ERRORS:
                logger.debug("could not publish a coalesced result", exc_info=True)
