"""Distributed fan_out: siblings run on worker processes on many machines, through Redis.

```python
from langgraph_batch import fan_out
from langgraph_batch.distributed import RedisExecutor

node = fan_out(agent, items="docs", into="results", make_input=..., result=...,
               executor=RedisExecutor("redis://127.0.0.1:6379/0", graph="myapp.graphs:agent"))
```

and on each worker machine:

```bash
langgraph-batch worker redis://127.0.0.1:6379/0 myapp.graphs:agent --concurrency 32
```

Needs `pip install 'langgraph-batch[redis]'` (redis-py is imported only when
a client is built) and Redis >= 7.0 (streams, consumer groups, Lua). Jobs
run at least once, results are accepted exactly once; see `executor` (the
parent), `worker` (the loop), `_scripts` (leases and fencing in Lua),
`_semaphore` (the cluster-wide in-flight cap), `_redis_flight` (coalesced
tool calls across workers) and `_serde` (strict payloads, input checks).

`RayExecutor` (module `ray`) runs the same siblings in async Ray actors, one
per node, instead (`pip install 'langgraph-batch[ray]'`; Ray is imported only
when a run starts).
"""

from __future__ import annotations

from langgraph_batch.distributed._keys import ACL_RULES
from langgraph_batch.distributed._redis_flight import RedisFlightStore
from langgraph_batch.distributed._semaphore import ClusterLimitedBackend, RedisSemaphore
from langgraph_batch.distributed._serde import DEFAULT_MAX_PAYLOAD_BYTES
from langgraph_batch.distributed.executor import RedisExecutor
from langgraph_batch.distributed.ray import RayExecutor
from langgraph_batch.distributed.worker import Worker, load_graph
from langgraph_batch.errors import (
    DeadLetteredError,
    DistributedError,
    DistributedTimeoutError,
    InputValidationError,
    PayloadRejectedError,
    PayloadTooLargeError,
    RedisUnavailableError,
)
from langgraph_batch.nodes import RemoteEvent, SiblingExecutor

__all__ = (
    "ACL_RULES",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "ClusterLimitedBackend",
    "DeadLetteredError",
    "DistributedError",
    "DistributedTimeoutError",
    "InputValidationError",
    "PayloadRejectedError",
    "PayloadTooLargeError",
    "RayExecutor",
    "RedisExecutor",
    "RedisFlightStore",
    "RedisSemaphore",
    "RedisUnavailableError",
    "RemoteEvent",
    "SiblingExecutor",
    "Worker",
    "load_graph",
)
