"""Chaos on Ray: 60 fan_out siblings on a two-node local Ray cluster, one node SIGKILLed mid-run.

The cluster is real: `ray start --head` and a second `ray start --address`
process on loopback. The second node (its raylet, agents and the node
runner actor's process) is killed by process group once both nodes run
siblings and 10 siblings have finished, plus 0.2 s (the siblings finish in
waves 0.4 s apart: the kill falls between two waves, not on one); the
executor places the siblings it lost on the head node. The graph logs every
start and finish to a file, outside Ray, so the figures do not trust the
executor:

| figure | meaning | must be |
| --- | --- | --- |
| lost | a sibling with neither a result nor an error | 0 |
| silently wrong | reported successful, but not its own answer (`2 * x`) | 0 |
| hung | siblings without an outcome when the run's deadline passed | 0 |
| leaked | parent tasks left, or siblings still running in a node runner | 0 |
| duplicated | a sibling whose outcome the executor delivered twice | 0 |
| failed | siblings that failed (typed) | 0 here: nothing poisons them |
| re-run after the node died | siblings started again elsewhere (at-least-once) | reported |
| finished twice | of those, siblings whose graph had reached its end on the dead node | reported |

"Finished twice" is the price of at-least-once execution: a sibling whose
graph ended on the node just before it died, but whose outcome had not
reached the parent yet, runs again; only its first outcome is kept.

Written to `ray_chaos_figures.json` under pytest's tmp dir and printed.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from langgraph_batch import SiblingError, fan_out
from langgraph_batch.distributed import RayExecutor, RemoteEvent
from tests.fakes.fan_out import parent_graph
from tests.integration.distributed.conftest import REPO
from tests.integration.distributed.ray_cluster import RayCluster

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

N = 60


class Counting:
    """A `SiblingExecutor` around another one that counts the outcomes it delivers."""

    def __init__(self, inner: RayExecutor) -> None:
        self.inner = inner
        self.outcomes: collections.Counter[int] = collections.Counter()

    async def run(
        self, subgraph: Any, inputs: Any, *, total: int, config: Any
    ) -> AsyncIterator[RemoteEvent]:
        async for event in self.inner.run(subgraph, inputs, total=total, config=config):
            if event.kind != "started":
                self.outcomes[event.index] += 1
            yield event


def _counts(log: Path) -> dict[str, collections.Counter[int]]:
    """`{"start"|"done"|"cancel": {index: n}, "pids": {pid: starts}}` from the execution log."""
    out: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for line in (log.read_text() if log.exists() else "").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] != "tool":
            out[parts[2]][int(parts[0])] += 1
            if parts[2] == "start":
                out["pids"][int(parts[1])] += 1
    return out


def _mid_run(counts: dict[str, collections.Counter[int]]) -> bool:
    # Both node runners are running siblings, and some have finished.
    return len(counts["pids"]) >= 2 and len(counts["done"]) >= 10


async def test_ray_node_killed_mid_run(ray_cluster: RayCluster, tmp_path: Path) -> None:
    from tests.integration.distributed.graphs import sleepy

    cluster = ray_cluster
    if not cluster.live_workers():
        await asyncio.to_thread(cluster.add_worker)
        await asyncio.to_thread(cluster.wait_alive, 2, 60)
    log = cluster.exec_log
    await asyncio.to_thread(log.write_text, "")
    ex = RayExecutor(
        graph="tests.integration.distributed.graphs:sleepy",
        address=cluster.address,
        app_dir=str(REPO),
    )
    node = fan_out(
        sleepy,
        items="jobs",
        into="out",
        make_input=lambda job, i: {"index": i, **job},
        result=lambda final: final["y"],
        executor=(counting := Counting(ex)),
    )
    graph = parent_graph(node)
    jobs = [{"x": i, "sleep": 0.5 + (i % 5) * 0.4} for i in range(N)]
    figures: dict[str, Any] = dict.fromkeys(
        ("lost", "silently_wrong", "hung", "leaked", "duplicated", "failed"), 0
    )

    started = time.monotonic()
    task = asyncio.ensure_future(graph.ainvoke({"jobs": jobs}))
    async with asyncio.timeout(60):
        while not _mid_run(await asyncio.to_thread(_counts, log)):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    killed_at = time.monotonic() - started
    await asyncio.to_thread(cluster.kill_worker, 0)
    try:
        async with asyncio.timeout(90):
            out = (await task)["out"]
    except TimeoutError:
        out = []
        figures["hung"] = N
    makespan = time.monotonic() - started

    if out:
        figures["lost"] = N - len(out)
        for i, value in enumerate(out):
            if isinstance(value, SiblingError):
                figures["failed"] += 1
            elif value != 2 * i:
                figures["silently_wrong"] += 1
    counts = await asyncio.to_thread(_counts, log)
    figures["duplicated"] = sum(1 for n in counting.outcomes.values() if n > 1)
    figures["re_run_after_node_died"] = sum(1 for n in counts["start"].values() if n > 1)
    figures["finished_twice"] = sum(1 for n in counts["done"].values() if n > 1)
    figures["executions"] = sum(counts["start"].values())
    leftover = [t for t in asyncio.all_tasks() if t.get_name().startswith("lgb-ray-")]
    nodes = await asyncio.to_thread(ex.live_nodes, fresh=True)
    running = [await (await asyncio.to_thread(ex.runner, n)).running.remote() for n in nodes]
    figures["leaked"] = len(leftover) + sum(running)
    figures["live_nodes_after"] = len(nodes)
    figures["killed_at_s"] = round(killed_at, 2)
    figures["makespan_s"] = round(makespan, 2)

    table = "\n".join(f"  {key:26s} {value}" for key, value in figures.items())
    path = tmp_path / "ray_chaos_figures.json"
    await asyncio.to_thread(path.write_text, json.dumps(figures, indent=1))
    await asyncio.to_thread(print, f"\nRay node-kill chaos figures ({path})\n{table}")
    # The session's cluster gets its second node back for the tests after this one.
    await asyncio.to_thread(cluster.add_worker)
    await asyncio.to_thread(cluster.wait_alive, 2, 60)
    assert figures["live_nodes_after"] == 1  # the second node really died
    assert figures["re_run_after_node_died"] > 0  # it died holding siblings
    for key in ("lost", "silently_wrong", "hung", "leaked", "duplicated", "failed"):
        assert figures[key] == 0, figures
