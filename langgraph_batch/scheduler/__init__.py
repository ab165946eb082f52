"""The shared scheduler: slots, priority, batching, retries and stats in front of a backend.

```python
from langgraph_batch.scheduler import BatchPolicy, Scheduler
from langgraph_batch.scheduler.registry import scheduler_for

async with Scheduler(backend, policy=BatchPolicy(inflight_limit=64), name="main") as s:
    resp = await s.submit(request, turn=2)
```
"""

from __future__ import annotations

from langgraph_batch._rate_budget import RateLimitPolicy
from langgraph_batch._retry_policy import RetryPolicy
from langgraph_batch.scheduler._capacity import KVLedger
from langgraph_batch.scheduler._capacity import ledger_of as ledger_of
from langgraph_batch.scheduler._config import BatchPolicy
from langgraph_batch.scheduler._runner import Scheduler
from langgraph_batch.scheduler._runner import live_schedulers as live_schedulers
from langgraph_batch.scheduler._state import SchedulerState
from langgraph_batch.scheduler._stats import SchedulerStats
from langgraph_batch.scheduler.registry import (
    find_scheduler,
    register_scheduler,
    scheduler_for,
)
from langgraph_batch.scheduler.registry import (
    get_scheduler as get_scheduler,  # deprecated: find_scheduler
)

# Also importable from here, for the library's other packages (metrics, fan_out), and not
# part of `__all__` (no user API): live_schedulers, ledger_of.
__all__ = (
    "BatchPolicy",
    "KVLedger",
    "RateLimitPolicy",
    "RetryPolicy",
    "Scheduler",
    "SchedulerState",
    "SchedulerStats",
    "find_scheduler",
    "register_scheduler",
    "scheduler_for",
)
