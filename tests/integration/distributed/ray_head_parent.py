"""A parent process for the Ray head-restart test: a checkpointed graph, a RayExecutor fan_out.

`python -m tests.integration.distributed.ray_head_parent first|resume DB ADDRESS NODE_IP N`
connects its Ray driver through the raylet of the node at `NODE_IP` (not the
head's: a driver dies with the raylet it is attached to), runs the thread, and
prints one JSON line: `{"out": [...]}` or `{"error": type, "message": ...}`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any


async def main(mode: str, db: str, address: str, node_ip: str, n: int) -> int:
    import ray
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from langgraph_batch import SiblingError
    from langgraph_batch.distributed import RayExecutor
    from tests.integration.distributed.conftest import REPO
    from tests.integration.distributed.test_ray import SLEEPY, parent

    ray.init(
        address=address,
        namespace="langgraph-batch",
        _node_ip_address=node_ip,
        log_to_driver=False,
        configure_logging=False,
    )
    ex = RayExecutor(graph=SLEEPY, address=address, app_dir=str(REPO), timeout=40.0)
    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        graph = parent(ex, saver)
        cfg: Any = {"configurable": {"thread_id": "ray-head-restart"}}
        jobs = [{"x": i, "sleep": 0.5 + (i % 4) * 0.5} for i in range(n)]
        try:
            out = (await graph.ainvoke({"jobs": jobs} if mode == "first" else None, cfg))["out"]
        except Exception as exc:  # reported to the test, typed
            sys.stdout.write(json.dumps({"error": type(exc).__name__, "message": str(exc)}) + "\n")
            return 3
    rows = [{"error": o.error_type} if isinstance(o, SiblingError) else {"y": o[0]} for o in out]
    sys.stdout.write(json.dumps({"out": rows}) + "\n")
    return 0


if __name__ == "__main__":
    a = sys.argv
    raise SystemExit(asyncio.run(main(a[1], a[2], a[3], a[4], int(a[5]))))
