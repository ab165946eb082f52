"""W7 or W8 through the three executors: one process, Redis with two workers, Ray on two nodes.

W7 (`langgraph_batch.bench.workloads`, the default): 1,000 tool-free
single-turn extractions, a shared 1,000-token instruction, a unique
1,500-token document, a 150-token answer (`benchmarks.distributed_w7_graph`).
`--workload W8`: 64 long-horizon agents of 6-24 turns with W8's prompts,
tool latencies and results, their contexts outgrowing the cache
(`benchmarks.distributed_w8_graph`). On the emulator with the workload's
profile, time scale and server settings (`emulator_settings`; W8's answers
are sized per call, so its scenario is `echo`). Each repetition runs the same
fan_out of `--n` siblings three ways, one after another:

- `in_process`: no executor, the parent runs every sibling (one process);
- `redis_2`: `RedisExecutor` with two `langgraph-batch worker` processes;
- `ray_2`: `RayExecutor` on a local two-node Ray cluster (the tests'
  `RayCluster`: `ray start --head` and `ray start --address` on loopback).

Per executor: makespan (call to last result), client CPU per sibling (the
parent process alone, while timed), and overhead per sibling: (makespan -
in-process makespan of the same repetition) / n. Workers and runners are
started and warmed up before the timed run; load average after each run.

    python -m benchmarks.distributed_w7 --repeat 3 --out benchmarks/results/distributed_w7.json
    python -m benchmarks.distributed_w7 --workload W8 --repeat 1 \
        --out benchmarks/results/distributed_w8.json
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

from benchmarks.distributed_scale import cpu, start_redis, start_workers, stop, wait_ready
from langgraph_batch import fan_out
from langgraph_batch.bench.workloads import WORKLOADS, emulator_settings
from langgraph_batch.distributed import RedisExecutor
from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess

REPO = Path(__file__).resolve().parent.parent
GRAPHS = {"W7": "benchmarks.distributed_w7_graph", "W8": "benchmarks.distributed_w8_graph"}
GRAPH = f"{GRAPHS['W7']}:graph"
"""The sibling graph's import path (`main` sets it from `--workload`)."""
KINDS = ("in_process", "redis_2", "ray_2")


class Parent(TypedDict, total=False):
    items: list[int]
    out: list[Any]


def parent(executor: Any) -> Any:
    module, _, name = GRAPH.partition(":")
    sibling = getattr(importlib.import_module(module), name)
    node = fan_out(
        sibling,
        items="items",
        into="out",
        make_input=lambda i, _: {"i": i},
        result=lambda final: final["answer_chars"],
        executor=executor,
        max_active=None,
    )
    b = StateGraph(Parent)
    b.add_node("fan", node)
    b.add_edge(START, "fan")
    return b.compile()


async def timed(graph: Any, n: int, run: dict[str, Any], kind: str) -> None:
    """One fan_out of `n` siblings: makespan, client CPU per sibling, load average."""
    before = cpu([os.getpid()])
    t = time.perf_counter()
    out = await graph.ainvoke({"items": list(range(n))})
    run[f"{kind}_s"] = time.perf_counter() - t
    run[f"{kind}_client_cpu_ms_per_sibling"] = 1000 * (cpu([os.getpid()]) - before) / n
    run[f"{kind}_loadavg"] = os.getloadavg()[0]
    bad = [r for r in out["out"] if not isinstance(r, int) or r <= 0]
    if bad or len(out["out"]) != n:
        raise SystemExit(f"{kind}: {len(bad)} siblings failed, first: {bad[:1]!r:.300}")


async def redis_run(run: dict[str, Any], args: argparse.Namespace, url: str, tmp: Path) -> None:
    llm_url = os.environ["LGB_BENCH_LLM_URL"]
    procs = start_workers(2, url, llm_url, args.concurrency, tmp, graph=GRAPH)
    try:
        await asyncio.to_thread(wait_ready, procs, tmp)
        remote = parent(RedisExecutor(url, graph=GRAPH, lease_s=10.0, poll_s=0.5))
        await remote.ainvoke({"items": list(range(16))})  # warm-up: imports, connections
        await timed(remote, args.n, run, "redis_2")
    finally:
        stop(procs)


async def ray_run(run: dict[str, Any], args: argparse.Namespace, tmp: Path) -> None:
    import ray

    from langgraph_batch.distributed import RayExecutor
    from tests.integration.distributed.ray_cluster import RayCluster

    env = {"LGB_BENCH_LLM_URL": os.environ["LGB_BENCH_LLM_URL"]}
    cluster = RayCluster(tmp / f"ray{run['repeat']}", env=env)
    cluster.tmp.mkdir(parents=True, exist_ok=True)
    try:
        await asyncio.to_thread(cluster.start, 1)
        ex = RayExecutor(
            graph=GRAPH, address=cluster.address, app_dir=str(REPO), concurrency=args.concurrency
        )
        remote = parent(ex)
        await remote.ainvoke({"items": list(range(16))})  # warm-up: both runners, connections
        run["ray_2_nodes"] = len(await asyncio.to_thread(ex.live_nodes))
        await timed(remote, args.n, run, "ray_2")
    finally:
        ray.shutdown()
        await asyncio.to_thread(cluster.stop)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    wl = WORKLOADS[args.workload]
    tmp = Path(tempfile.mkdtemp(prefix="lgb-dist-bench-"))
    redis, url = start_redis(tmp)
    settings = emulator_settings(wl)
    if args.workload == "W8":
        settings["scenario"] = "echo"  # answers sized per call; no tool is bound
    emu = EmulatorProcess(
        EmulatorConfig(port=0, profile=wl.profile, time_scale=wl.time_scale, **settings)
    )
    emu.start()
    os.environ["LGB_BENCH_LLM_URL"] = f"vllm://{emu.url.removeprefix('http://')}"
    result: dict[str, Any] = {
        "command": " ".join(
            [Path(sys.executable).name, "-m", "benchmarks.distributed_w7", *sys.argv[1:]]
        ),
        "workload": args.workload,
        "n": args.n,
        "concurrency_per_worker": args.concurrency,
        "emulator": {"profile": wl.profile, "time_scale": wl.time_scale, **settings},
        "cpus": psutil.cpu_count(),
        "loadavg_before": os.getloadavg()[0],
        "runs": [],
    }
    try:
        local = parent(None)
        await local.ainvoke({"items": list(range(16))})  # warm-up
        for rep in range(args.repeat):
            run: dict[str, Any] = {"repeat": rep}
            await timed(local, args.n, run, "in_process")
            await redis_run(run, args, url, tmp)
            await ray_run(run, args, tmp)
            for kind in KINDS[1:]:
                run[f"{kind}_overhead_ms_per_sibling"] = (
                    1000 * (run[f"{kind}_s"] - run["in_process_s"]) / args.n
                )
            run["ray_over_redis"] = run["ray_2_s"] / run["redis_2_s"]
            result["runs"].append(run)
            print(json.dumps(run), flush=True)
    finally:
        emu.stop()
        redis.send_signal(signal.SIGTERM)
        redis.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    runs = result["runs"]
    result["median"] = {
        key: statistics.median(r[key] for r in runs)
        for key in runs[0]
        if key != "repeat" and isinstance(runs[0][key], (int, float))
    }
    return result


def markdown(result: dict[str, Any]) -> str:
    med = result["median"]
    rows = [
        "| executor | makespan s | client CPU ms/sibling | overhead ms/sibling | load avg |",
        "| --- | --- | --- | --- | --- |",
    ]
    for kind in KINDS:
        over = med.get(f"{kind}_overhead_ms_per_sibling")
        rows.append(
            f"| {kind} | {med[f'{kind}_s']:.2f} | {med[f'{kind}_client_cpu_ms_per_sibling']:.2f} "
            f"| {'-' if over is None else f'{over:.2f}'} | {med[f'{kind}_loadavg']:.2f} |"
        )
    return "\n".join(
        [
            f"# {result['workload']} through three executors (n={result['n']}, "
            f"medians of {len(result['runs'])})",
            "",
            f"Command: `{result['command']}`; {result['cpus']} CPUs, load average before "
            f"{result['loadavg_before']:.2f}; emulator {json.dumps(result['emulator'])}.",
            "",
            *rows,
            "",
            f"Median Ray / Redis makespan: {med['ray_over_redis']:.3f} (goal: <= 1.10).",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", choices=sorted(GRAPHS), default="W7", help="W7 (default) or W8")
    p.add_argument("--n", type=int, default=None, help="siblings per run (the workload's)")
    p.add_argument("--concurrency", type=int, default=500, help="siblings per worker/node (500)")
    p.add_argument("--repeat", type=int, default=3, help="repetitions (3)")
    p.add_argument("--out", type=Path, default=None, help="write the JSON here (and a .md)")
    args = p.parse_args(argv)
    global GRAPH
    GRAPH = f"{GRAPHS[args.workload]}:graph"
    if args.n is None:
        args.n = WORKLOADS[args.workload].n
    result = asyncio.run(measure(args))
    text = markdown(result)
    print(text)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
