"""`RedisOnceStore`: the calls of `at_most_once` tools, recorded in the run's Redis keys.

A Redis worker installs it (`set_once_store`) for the runs it serves, so a
sibling that another worker runs again (its first worker died) finds the
calls its first attempt made. One hash per run, `{lgb:<run>}:once`, expiring
with the run's other keys: field = the call's key, value `a:<attempt>` while
an attempt holds the call, `r:<record>` once it ended. `HSETNX` makes the
claim atomic across workers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langgraph_batch.distributed._keys import RunKeys
from langgraph_batch.tools import ONCE_DONE, ONCE_RUN, ONCE_TAKEN, MemoryOnceStore

__all__ = ("RedisOnceStore",)


class RedisOnceStore:
    """An `OnceStore` on Redis for the runs of one worker.

    Args:
        client: A `redis.asyncio.Redis`.
        runs: `group -> (run keys, ttl_ms)` for the runs this worker serves; a
            call of a sibling of an unknown run is recorded in this process only.

    Example:
        ```python
        previous = set_once_store(RedisOnceStore(client, runs=worker_runs))
        ```
    """

    def __init__(self, client: Any, *, runs: Callable[[str], tuple[RunKeys, int] | None]) -> None:
        self._client = client
        self._runs = runs
        self._local = MemoryOnceStore()

    def __repr__(self) -> str:
        return "RedisOnceStore()"

    async def claim(self, run: str, key: str, attempt: str) -> tuple[str, str | None]:
        found = self._runs(run)
        if found is None:
            return await self._local.claim(run, key, attempt)
        keys, ttl_ms = found
        name = f"{keys.tag}:once"
        mine = f"a:{attempt}"
        if await self._client.hsetnx(name, key, mine):
            await self._client.pexpire(name, ttl_ms)
            return ONCE_RUN, None
        value = await self._client.hget(name, key)
        text = value.decode() if isinstance(value, bytes) else str(value or "")
        if text.startswith("r:"):
            return ONCE_DONE, text[2:]
        return (ONCE_RUN, None) if text == mine else (ONCE_TAKEN, None)

    async def settle(self, run: str, key: str, record: str) -> None:
        found = self._runs(run)
        if found is None:
            await self._local.settle(run, key, record)
            return
        keys, ttl_ms = found
        name = f"{keys.tag}:once"
        await self._client.hset(name, key, f"r:{record}")
        await self._client.pexpire(name, ttl_ms)

    def forget(self, run: str) -> None:
        self._local.forget(run)  # the Redis hash expires with the run
