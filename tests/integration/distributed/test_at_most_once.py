"""At-most-once tools across hosts: a sibling whose host died never makes a call twice.

A real redis-server with two real worker processes (restarted when they die,
as systemd would), and the session's real two-node Ray cluster. Each
sibling calls `at_most_once(charge)`, which logs every execution to a file
outside the hosts. Three kinds of sibling:

- `o<i>`: nothing happens; charged once, answered;
- `o<i>-dies-after`: its host is SIGKILLed after the tool finished, before
  the sibling ends: the sibling runs again elsewhere, gets the recorded
  result back, and answers it, charged once;
- `o<i>-dies-in-tool`: its host is SIGKILLed inside the tool: the sibling
  runs again and ends in a typed `ToolAlreadyRanError` (outcome unknown),
  charged once.

Hosts run one sibling at a time here: a host that dies inside one sibling's
tool also kills the tool calls of the siblings it runs beside it, and those
end in `ToolAlreadyRanError` too (at most once: their effect is unknown).
One at a time, only the siblings that kill their host are affected.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from langgraph_batch import SiblingError
from langgraph_batch.distributed import RayExecutor
from tests.integration.distributed._parent import executor, parent_graph, run_parent
from tests.integration.distributed.conftest import (
    GRAPHS,
    REPO,
    Harness,
    RedisProc,
    WorkerProc,
    supervised,
)

pytestmark = pytest.mark.timeout(180)

ORDERS = ["o0", "o1-dies-after", "o2", "o3-dies-in-tool", "o4", "o5"]


def charges(log: Path) -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    for line in (log.read_text() if log.exists() else "").splitlines():
        parts = line.split()
        if parts and parts[0] == "charge":
            out[parts[1]] += 1
    return out


async def check(out: list[Any], log: Path) -> None:
    assert len(out) == len(ORDERS)
    for order, value in zip(ORDERS, out, strict=True):
        if order.endswith("-dies-in-tool"):
            assert isinstance(value, SiblingError), value
            assert value.error_type == "ToolAlreadyRanError"
            assert "unknown" in value.message
            assert order not in value.message  # the call's arguments stay out of errors
        else:
            assert value == f"charged:{order}"
    # Every order charged exactly once.
    assert await asyncio.to_thread(charges, log) == dict.fromkeys(ORDERS, 1)


def make_input(order: str, i: int) -> dict[str, Any]:
    return {"index": i, "order": order, "messages": []}


async def test_redis_workers_that_die_never_charge_twice(
    start_redis: Callable[..., RedisProc],
    start_worker: Callable[..., WorkerProc],
    harness: Harness,
) -> None:
    redis = await asyncio.to_thread(start_redis)
    workers = [
        await asyncio.to_thread(start_worker, redis.url, "orders", "--concurrency", "1")
        for _ in range(2)
    ]
    async with supervised(workers):
        from tests.integration.distributed.graphs import orders

        graph = parent_graph(
            executor(redis.url, "orders", max_deliveries=4),
            subgraph=orders,
            make_input=make_input,
            result=lambda final: final["answer"],
        )
        out, _ = await run_parent(graph, ORDERS)
    await check(out, harness.exec_log)
    assert sum(w.starts for w in workers) >= 4  # both faults really killed a worker


async def test_ray_nodes_that_die_never_charge_twice(ray_cluster: Any, tmp_path: Path) -> None:
    from tests.integration.distributed.graphs import orders

    cluster = ray_cluster
    log = cluster.exec_log
    await asyncio.to_thread(log.write_text, "")
    for marker in await asyncio.to_thread(lambda: list(log.parent.glob(f"{log.name}.*"))):
        await asyncio.to_thread(marker.unlink)
    ex = RayExecutor(
        graph=f"{GRAPHS}:orders", address=cluster.address, app_dir=str(REPO), concurrency=1
    )
    graph = parent_graph(
        ex,  # type: ignore[arg-type]
        subgraph=orders,
        make_input=make_input,
        result=lambda final: final["answer"],
    )
    out, _ = await run_parent(graph, ORDERS)
    await check(out, log)
