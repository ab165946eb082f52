"""What the server can hold: its KV-cache capacity, as the scheduler knows it.

The scheduler is the one owner of the server's capacity: its metrics poll
keeps the latest sample, and `Scheduler.kv_capacity()` answers from it, or
asks the backend once when no sample came yet. `fan_out`'s admission gate
asks the scheduler, never the backend.
"""

from __future__ import annotations

import asyncio
import logging

from langgraph_batch.backends.base import Backend, EngineMetrics

__all__ = ("METRICS_TIMEOUT_S", "read_kv_capacity")

logger = logging.getLogger("langgraph_batch.scheduler")

METRICS_TIMEOUT_S = 2.0
"""How long an unpolled scheduler waits for the server's metrics to learn its capacity."""


async def read_kv_capacity(latest: EngineMetrics | None, backend: Backend) -> int | None:
    """KV capacity in tokens: from `latest`, else one metrics call (None: unknown).

    An unreachable or silent server means an unknown capacity (no KV budget),
    never a failed run: errors are logged at DEBUG.
    """
    capacity = latest.kv_capacity_tokens if latest is not None else None
    if capacity is None:
        try:
            async with asyncio.timeout(METRICS_TIMEOUT_S):
                metrics = await backend.metrics()
        except Exception:
            logger.debug("could not read the server's KV capacity", exc_info=True)
            return None
        capacity = metrics.kv_capacity_tokens if metrics is not None else None
    if isinstance(capacity, int) and not isinstance(capacity, bool) and capacity > 0:
        return capacity
    return None
