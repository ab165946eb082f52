"""RayExecutor on a real local Ray cluster: a head and a second node process on loopback.

One cluster serves the session (`ray_cluster` in tests/conftest.py, about 20 s
to start on 2 cores; the chaos test uses it too); the graphs are
the Redis tests' (`graphs.py`), whose execution log counts what ran where,
outside Ray.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_batch import SiblingError, fan_out
from langgraph_batch.distributed import RayExecutor
from tests.fakes.fan_out import parent_graph
from tests.integration.distributed.conftest import REPO
from tests.integration.distributed.ray_cluster import NODE_IP, RayCluster

pytestmark = pytest.mark.timeout(120)

SLEEPY = "tests.integration.distributed.graphs:sleepy"


@pytest.fixture
def cluster(ray_cluster: RayCluster) -> RayCluster:
    """The session's cluster, with two live nodes (a chaos test may have killed one)."""
    if not ray_cluster.live_workers():
        ray_cluster.add_worker()
        ray_cluster.wait_alive(2, 60)
    return ray_cluster


@pytest.fixture
def exec_log(cluster: RayCluster) -> Path:
    cluster.exec_log.write_text("")
    return cluster.exec_log


def parent(executor: RayExecutor, checkpointer: Any = None) -> Any:
    from tests.integration.distributed.graphs import sleepy

    node = fan_out(
        sleepy,
        items="jobs",
        into="out",
        make_input=lambda job, i: {"index": i, **job},
        result=lambda final: (final["y"], final["pid"]),
        executor=executor,
    )
    return parent_graph(node, checkpointer=checkpointer)


def lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines() if line.strip()]


def counts(log: Path, what: str) -> collections.Counter[int]:
    return collections.Counter(int(p[0]) for p in lines(log) if p[-1] == what and p[0] != "tool")


async def until(log: Path, what: str, n: int, limit_s: float = 60.0) -> None:
    """Poll the execution log (written by other processes: nothing to await but time)."""
    async with asyncio.timeout(limit_s):
        while len(await asyncio.to_thread(counts, log, what)) < n:  # noqa: ASYNC110
            await asyncio.sleep(0.05)


def executor(cluster: RayCluster, **kw: Any) -> RayExecutor:
    return RayExecutor(graph=SLEEPY, address=cluster.address, app_dir=str(REPO), **kw)


async def test_results_in_order_failures_typed_events_streamed_on_two_nodes(
    cluster: RayCluster, exec_log: Path
) -> None:
    jobs = [{"x": i, "sleep": 0.1, "fail": i == 5} for i in range(24)]
    events: list[dict[str, Any]] = []
    final: dict[str, Any] = {}
    async for mode, chunk in parent(executor(cluster)).astream(
        {"jobs": jobs}, stream_mode=["custom", "values"]
    ):
        if mode == "custom":
            events.append(chunk)
        else:
            final = chunk
    out = final["out"]
    assert [o[0] for o in out if not isinstance(o, SiblingError)] == [
        2 * i for i in range(24) if i != 5
    ]
    err = out[5]
    assert isinstance(err, SiblingError)
    assert err.error_type == "ValueError"
    assert "fails on purpose" in err.message
    # Two node runners: the siblings ran in two processes, one per node.
    assert len({o[1] for o in out if not isinstance(o, SiblingError)}) == 2
    kinds = collections.Counter(e.get("event") for e in events)
    assert kinds["sibling_started"] == 24
    assert kinds["sibling_finished"] == 23
    assert kinds["sibling_failed"] == 1
    assert (await asyncio.to_thread(counts, exec_log, "start")) == dict.fromkeys(range(24), 1)


async def test_node_for_places_siblings_on_the_named_node(
    cluster: RayCluster, exec_log: Path
) -> None:
    ex = executor(cluster, node_for=lambda i, _: NODE_IP if i % 2 else None)
    nodes = await asyncio.to_thread(ex.live_nodes)
    head = min(nodes)  # both nodes share the IP: the first node id of that IP is named
    out = (await parent(ex).ainvoke({"jobs": [{"x": i} for i in range(12)]}))["out"]
    head_pid = await (await asyncio.to_thread(ex.runner, head)).ping.remote()
    assert all(out[i][1] == head_pid for i in range(1, 12, 2))


async def test_a_poison_sibling_is_dead_lettered_alone(cluster: RayCluster, exec_log: Path) -> None:
    jobs = [{"x": i, "sleep": 0.3, "poison": i == 3} for i in range(10)]
    ex = executor(cluster, max_deliveries=3)
    out = (await parent(ex).ainvoke({"jobs": jobs}))["out"]
    err = out[3]
    assert isinstance(err, SiblingError)
    assert err.error_type == "DeadLetteredError"
    assert [o[0] for i, o in enumerate(out) if i != 3] == [2 * i for i in range(10) if i != 3]
    # The poison ran exactly max_deliveries times; no innocent finished twice.
    assert (await asyncio.to_thread(counts, exec_log, "start"))[3] == 3
    assert max((await asyncio.to_thread(counts, exec_log, "done")).values()) == 1


async def test_a_killed_actor_loses_nothing(cluster: RayCluster, exec_log: Path) -> None:
    ex = executor(cluster)
    jobs = [{"x": i, "sleep": 0.8} for i in range(10)]
    task = asyncio.ensure_future(parent(ex).ainvoke({"jobs": jobs}))
    await until(exec_log, "start", 10)
    victim = next(iter(await asyncio.to_thread(ex.live_nodes)))
    os.kill(await (await asyncio.to_thread(ex.runner, victim)).ping.remote(), signal.SIGKILL)
    out = (await task)["out"]
    assert [o[0] for o in out] == [2 * i for i in range(10)]
    assert max((await asyncio.to_thread(counts, exec_log, "done")).values()) == 1


async def test_cancelling_the_parent_cancels_every_sibling(
    cluster: RayCluster, exec_log: Path
) -> None:
    jobs = [{"x": i, "sleep": 30.0} for i in range(8)]
    task = asyncio.ensure_future(parent(executor(cluster)).ainvoke({"jobs": jobs}))
    await until(exec_log, "start", 8)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(exec_log, "cancel", 8, limit_s=10)
    assert await asyncio.to_thread(counts, exec_log, "cancel") == dict.fromkeys(range(8), 1)
    assert not await asyncio.to_thread(counts, exec_log, "done")


async def test_a_checkpointed_run_resumes_without_running_finished_siblings(
    cluster: RayCluster, exec_log: Path
) -> None:
    saver = InMemorySaver()
    config: Any = {"configurable": {"thread_id": "ray-resume"}}
    jobs = [{"x": i, "sleep": 0.05 if i < 6 else 10.0} for i in range(10)]
    graph = parent(executor(cluster), saver)
    finished: list[Any] = []

    async def run() -> None:
        async for event in graph.astream({"jobs": jobs}, config, stream_mode="custom"):
            if event.get("event") == "sibling_finished":
                finished.append(event)

    task = asyncio.ensure_future(run())
    await until(exec_log, "start", 10)
    # The parent has taken in the 6 quick results (a node's "done" line comes
    # before that; on a loaded machine, long before). Its record of them is
    # written after the event, off this task: 2 s more for that, well inside the
    # slow siblings' 10 s.
    async with asyncio.timeout(60):
        while len(finished) < 6:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    await asyncio.sleep(2.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.to_thread(exec_log.write_text, "")
    # The same thread runs again: only the 4 unfinished siblings run (again).
    out = (await parent(executor(cluster), saver).ainvoke(None, config))["out"]
    assert [o[0] for o in out[:6]] == [2 * i for i in range(6)]
    assert len(out) == 10
    assert not set(await asyncio.to_thread(counts, exec_log, "start")) & set(
        range(6)
    )  # finished ones not re-run
