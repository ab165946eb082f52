"""Distributed fan_out: siblings per second with 1 and 2 workers, and the latency Redis adds.

Everything runs on this machine: a `redis-server` (no persistence), the
emulator with the zero-cost profile (EMULATED, instant inference), the
parent (this process) and `langgraph-batch worker` processes importing
`benchmarks.distributed_graph:graph`, whose siblings do ~`--work-ms` of
pure-Python work and one LLM call each.

    python -m benchmarks.distributed_scale                      # defaults, prints a table
    python -m benchmarks.distributed_scale --n 200 --repeat 3 --out results/distributed.json

Throughput: one fan_out of `--n` siblings, timed from the call to the last
result, in-process (no executor: one process's CPU) and through Redis with
1 and 2 workers (`--concurrency` each); the workers are started and warmed
up first. Latency: `--latency-n` single-sibling fan_outs one after another,
with no CPU work, in-process and through Redis with one idle worker: the
difference is what going through Redis adds per sibling (publish, a worker
picking the job up, the result coming back, cleanup).

Client CPU (`*_client_cpu_ms_per_sibling`): the parent process alone, per
sibling, while the run is timed (in-process: everything runs there).

Ray (`--ray`, on by default): the same fan_out through `RayExecutor` on a
local two-node Ray cluster (`ray start --head` and a second `ray start
--address` process on loopback, `--num-cpus 1` each, no dashboard): one node
runner actor per node (`--concurrency` siblings each), so the same two
sibling-running processes as the Redis run with 2 workers. CPU is split into
the two runner processes and the rest (parent, emulator, and Ray's own
daemons: GCS, raylets, agents); latency as for Redis, with the runners warm.
The cluster helper is the tests' (`tests/integration/distributed/ray_cluster.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

from benchmarks.distributed_graph import burn
from langgraph_batch import fan_out
from langgraph_batch.distributed import RedisExecutor
from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess

REPO = Path(__file__).resolve().parent.parent
GRAPH = "benchmarks.distributed_graph:graph"


class Parent(TypedDict, total=False):
    items: list[int]
    out: list[Any]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def calibrate(work_ms: float) -> int:
    """Loop iterations that take about `work_ms` here (median of 5 probes)."""
    probe = 20_000
    times = []
    for _ in range(5):
        t = time.perf_counter()
        burn(probe)
        times.append(time.perf_counter() - t)
    per_iter = statistics.median(times) / probe
    return max(1, int(work_ms / 1000 / per_iter))


def start_redis(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found (apt-get install redis-server)")
    port = _free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(tmp),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def start_workers(
    n: int, url: str, llm_url: str, concurrency: int, tmp: Path, graph: str = GRAPH
) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "LGB_BENCH_LLM_URL": llm_url, "PYTHONUNBUFFERED": "1"}
    procs = []
    for i in range(n):
        log = (tmp / f"worker{i}.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "langgraph_batch.cli",
                    "worker",
                    url,
                    graph,
                    "--concurrency",
                    str(concurrency),
                    "--app-dir",
                    str(REPO),
                    "--log-level",
                    "info",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
            )
        )
    return procs


def wait_ready(procs: list[subprocess.Popen[bytes]], tmp: Path, timeout: float = 60.0) -> None:
    """Block until every worker logged its start line (imports done, connected)."""
    deadline = time.monotonic() + timeout
    for i, proc in enumerate(procs):
        log = tmp / f"worker{i}.log"
        while "cluster in-flight cap" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker {i} did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.05)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def parent(executor: Any) -> Any:
    from benchmarks.distributed_graph import graph as sibling

    node = fan_out(
        sibling,
        items="items",
        into="out",
        make_input=lambda spin, i: {"i": i, "spin": spin, "prompt": f"sibling {i}"},
        result=lambda final: final["checksum"],
        executor=executor,
        max_active=None,
    )
    b = StateGraph(Parent)
    b.add_node("fan", node)
    b.add_edge(START, "fan")
    return b.compile()


async def timed(graph: Any, items: list[int]) -> float:
    t = time.perf_counter()
    out = await graph.ainvoke({"items": items})
    took = time.perf_counter() - t
    bad = [r for r in out["out"] if not isinstance(r, int)]
    if bad:
        first = bad[0]
        raise SystemExit(f"{len(bad)} siblings failed, first: {first!r:.300}")
    return took


def cpu(pids: list[int]) -> float:
    """User + system CPU seconds used so far by these processes."""
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    spin = calibrate(args.work_ms)
    tmp = Path(tempfile.mkdtemp(prefix="lgb-dist-bench-"))
    redis, url = start_redis(tmp)
    emu = EmulatorProcess(EmulatorConfig(port=0, profile="zero", scenario="echo", output_tokens=4))
    emu.start()
    emu_pid = next(
        c.pid
        for c in psutil.Process().children()
        if "langgraph_batch.emulator" in " ".join(c.cmdline())
    )
    llm_url = f"vllm://{emu.url.removeprefix('http://')}"
    os.environ["LGB_BENCH_LLM_URL"] = llm_url
    ex = RedisExecutor(url, graph=GRAPH, lease_s=10.0, poll_s=0.5)
    result: dict[str, Any] = {
        "n": args.n,
        "work_ms": args.work_ms,
        "spin": spin,
        "concurrency": args.concurrency,
        "emulator": "EMULATED zero-cost profile",
        "runs": [],
    }
    try:
        local, remote = parent(None), parent(ex)
        await timed(local, [spin] * 8)  # warm-up: imports, scheduler, connections
        for rep in range(args.repeat):
            run: dict[str, Any] = {"repeat": rep}
            before_local = cpu([os.getpid()])
            run["in_process_s"] = await timed(local, [spin] * args.n)
            run["in_process_cpu_ms_per_sibling"] = (
                1000 * (cpu([os.getpid()]) - before_local) / args.n
            )
            for workers in (1, 2):
                procs = start_workers(workers, url, llm_url, args.concurrency, tmp)
                try:
                    # Measure only once every worker has imported its graph and connected
                    # (a worker still starting would share the cores with the run).
                    await asyncio.to_thread(wait_ready, procs, tmp)
                    await timed(remote, [spin] * (8 * workers))  # warm-up: connections, scheduler
                    others = [redis.pid, emu_pid, os.getpid()]
                    before = cpu([p.pid for p in procs]), cpu(others), cpu([os.getpid()])
                    run[f"workers_{workers}_s"] = await timed(remote, [spin] * args.n)
                    after = cpu([p.pid for p in procs]), cpu(others), cpu([os.getpid()])
                    run[f"workers_{workers}_client_cpu_ms_per_sibling"] = (
                        1000 * (after[2] - before[2]) / args.n
                    )
                    run[f"workers_{workers}_cpu_ms_per_sibling"] = (
                        1000 * (after[0] - before[0]) / args.n
                    )
                    run[f"workers_{workers}_other_cpu_ms_per_sibling"] = (
                        1000 * (after[1] - before[1]) / args.n
                    )
                    run[f"workers_{workers}_loadavg"] = os.getloadavg()[0]
                    if workers == 1 and rep == 0:
                        run["latency"] = await latency(local, remote, args.latency_n)
                finally:
                    stop(procs)
            if args.ray:
                await measure_ray(run, args, spin, llm_url, local, emu_pid, tmp, rep == 0)
            for key in ("in_process", "workers_1", "workers_2", *(("ray_2",) if args.ray else ())):
                run[f"{key}_per_s"] = args.n / run[f"{key}_s"]
            run["speedup_2_over_1"] = run["workers_1_s"] / run["workers_2_s"]
            result["runs"].append(run)
            print(json.dumps(run), flush=True)
    finally:
        emu.stop()
        redis.send_signal(signal.SIGTERM)
        redis.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    return result


async def latency(local: Any, remote: Any, n: int, name: str = "redis") -> dict[str, float]:
    inproc, dist = [], []
    for _ in range(n):
        inproc.append(await timed(local, [0]))
        dist.append(await timed(remote, [0]))
    added = [d - i for d, i in zip(sorted(dist), sorted(inproc), strict=True)]
    return {
        "in_process_p50_ms": 1000 * pct(inproc, 0.5),
        "in_process_p95_ms": 1000 * pct(inproc, 0.95),
        f"{name}_p50_ms": 1000 * pct(dist, 0.5),
        f"{name}_p95_ms": 1000 * pct(dist, 0.95),
        "added_p50_ms": 1000 * pct(added, 0.5),
        "added_p95_ms": 1000 * pct(added, 0.95),
    }


async def measure_ray(
    run: dict[str, Any],
    args: argparse.Namespace,
    spin: int,
    llm_url: str,
    local: Any,
    emu_pid: int,
    tmp: Path,
    with_latency: bool,
) -> None:
    """The same fan_out through RayExecutor on a local two-node cluster (`ray_2_*` keys)."""
    import ray

    from langgraph_batch.distributed import RayExecutor
    from tests.integration.distributed.ray_cluster import RayCluster

    cluster = RayCluster(tmp / f"ray{run['repeat']}", env={"LGB_BENCH_LLM_URL": llm_url})
    cluster.tmp.mkdir(parents=True, exist_ok=True)
    try:
        await asyncio.to_thread(cluster.start, 1)
        ex = RayExecutor(
            graph=GRAPH, address=cluster.address, app_dir=str(REPO), concurrency=args.concurrency
        )
        remote = parent(ex)
        await timed(remote, [spin] * 16)  # warm-up: both runners imported, scheduler, connections
        nodes = await asyncio.to_thread(ex.live_nodes)
        runners = [await (await asyncio.to_thread(ex.runner, node)).ping.remote() for node in nodes]
        daemons = [p.pid for p in cluster._strays(f"{cluster.tmp}/") if p.pid not in runners]
        others = [emu_pid, os.getpid(), *daemons]
        before = cpu(runners), cpu(others), cpu([os.getpid()])
        run["ray_2_s"] = await timed(remote, [spin] * args.n)
        after = cpu(runners), cpu(others), cpu([os.getpid()])
        run["ray_2_client_cpu_ms_per_sibling"] = 1000 * (after[2] - before[2]) / args.n
        run["ray_2_nodes"] = len(nodes)
        run["ray_2_cpu_ms_per_sibling"] = 1000 * (after[0] - before[0]) / args.n
        run["ray_2_other_cpu_ms_per_sibling"] = 1000 * (after[1] - before[1]) / args.n
        run["ray_2_loadavg"] = os.getloadavg()[0]
        if with_latency:
            run["ray_latency"] = await latency(local, remote, args.latency_n, "ray")
    finally:
        ray.shutdown()
        await asyncio.to_thread(cluster.stop)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=200, help="siblings per throughput run (200)")
    p.add_argument("--work-ms", type=float, default=30.0, help="CPU work per sibling, ms (30)")
    p.add_argument("--concurrency", type=int, default=16, help="siblings per worker at once (16)")
    p.add_argument("--repeat", type=int, default=1, help="throughput runs (1)")
    p.add_argument("--latency-n", type=int, default=30, help="single-sibling runs for latency (30)")
    p.add_argument("--out", type=Path, default=None, help="write the JSON here")
    p.add_argument(
        "--ray",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also RayExecutor on a local two-node Ray cluster (on)",
    )
    args = p.parse_args(argv)
    result = asyncio.run(measure(args))
    runs = result["runs"]
    print(
        f"\ndistributed fan_out, {args.n} siblings x {args.work_ms:.0f} ms CPU + 1 LLM call "
        f"(EMULATED zero-cost server), {os.cpu_count()} cores"
    )
    print(
        "| run | in-process /s | 1 worker /s | 2 workers /s | 2 vs 1 | worker CPU ms/sibling "
        "(1w, 2w) | parent+emulator+redis CPU ms/sibling | load avg (1w, 2w) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in runs:
        print(
            f"| {r['repeat']} | {r['in_process_per_s']:.1f} | {r['workers_1_per_s']:.1f} | "
            f"{r['workers_2_per_s']:.1f} | {r['speedup_2_over_1']:.2f}x | "
            f"{r['workers_1_cpu_ms_per_sibling']:.1f}, {r['workers_2_cpu_ms_per_sibling']:.1f} | "
            f"{r['workers_2_other_cpu_ms_per_sibling']:.1f} | "
            f"{r['workers_1_loadavg']:.1f}, {r['workers_2_loadavg']:.1f} |"
        )
    lat = runs[0]["latency"]
    print(
        f"latency per single-sibling fan_out: in-process p50 {lat['in_process_p50_ms']:.1f} ms "
        f"p95 {lat['in_process_p95_ms']:.1f} ms; via Redis p50 {lat['redis_p50_ms']:.1f} ms "
        f"p95 {lat['redis_p95_ms']:.1f} ms; added p50 {lat['added_p50_ms']:.1f} ms "
        f"p95 {lat['added_p95_ms']:.1f} ms"
    )
    if args.ray:
        print(
            "| run | Ray 2 nodes /s | vs Redis 2 workers | runner CPU ms/sibling | "
            "parent+emulator+Ray daemons CPU ms/sibling |"
        )
        print("| --- | --- | --- | --- | --- |")
        for r in runs:
            print(
                f"| {r['repeat']} | {r['ray_2_per_s']:.1f} | "
                f"{r['ray_2_s'] / r['workers_2_s']:.2f}x makespan | "
                f"{r['ray_2_cpu_ms_per_sibling']:.1f} | {r['ray_2_other_cpu_ms_per_sibling']:.1f} |"
            )
        rl = runs[0]["ray_latency"]
        print(
            f"latency via Ray: p50 {rl['ray_p50_ms']:.1f} ms p95 {rl['ray_p95_ms']:.1f} ms; "
            f"added p50 {rl['added_p50_ms']:.1f} ms p95 {rl['added_p95_ms']:.1f} ms"
        )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
