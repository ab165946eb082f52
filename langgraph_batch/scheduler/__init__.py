"""The shared scheduler: slots, priority, batching, retries and stats in front of a backend.

```python
from langgraph_batch.scheduler import BatchPolicy, Scheduler
from langgraph_batch.scheduler.registry import scheduler_for

async with Scheduler(backend, policy=BatchPolicy(max_inflight=64), name="main") as s:
    resp = await s.submit(request, turn=2)
```
"""

from __future__ import annotations

from langgraph_batch.scheduler._config import BatchPolicy
from langgraph_batch.scheduler._runner import Scheduler
from langgraph_batch.scheduler._state import SchedulerState
from langgraph_batch.scheduler._stats import SchedulerStats
from langgraph_batch.scheduler.registry import get_scheduler, register_scheduler, scheduler_for

__all__ = (
    "BatchPolicy",
    "Scheduler",
    "SchedulerState",
    "SchedulerStats",
    "get_scheduler",
    "register_scheduler",
    "scheduler_for",
)
