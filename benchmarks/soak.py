"""Soak: many consecutive fan_out runs in one process, with faults; does anything grow?

`--runs` consecutive runs (default 100) of a `fan_out` of `--n` ReAct siblings
(default 1,000: a tool call with a coalesced tool, then an answer) against an
emulator process (zero-cost profile, so the client is what is measured) that
faults `--fault-rate` of the requests (default 10%: 429, 500, 503, dropped
connections). After each run, with the scheduler kept open as a long-lived
service would: the process's RSS, its open file descriptors, the asyncio
tasks alive, and the library's own state (scheduler queued and in flight,
the KV ledger's runs and booked tokens, coalesced tool results kept, the
scheduler registry). The goal is flat: RSS growth under 5% after a warm-up
(the first 10 runs), every other count back to its idle value.

    python -m benchmarks.soak                                   # 100 x 1,000
    python -m benchmarks.soak --runs 10 --n 200 --out /tmp/soak.json

Results: `benchmarks/results/soak.json` (one row per run) and a summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

WARMUP_RUNS = 10


def rss_mb() -> float:
    """Resident set size now (not the peak), MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Parent(TypedDict, total=False):
    docs: list[str]
    reviews: Annotated[list[Any], lambda a, b: b]


def build(url: str) -> tuple[Any, Any, list[Any]]:
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, StateGraph
    from langgraph.prebuilt import create_react_agent

    from langgraph_batch import BatchedChatModel, fan_out
    from langgraph_batch.tools import BatchToolNode, coalesce

    llm = BatchedChatModel(
        model="emulated-llama-3-8b",
        base_url=url.replace("http://", "vllm://"),
        max_tokens=64,
        max_retries=4,
        extra_body={"emulator": {"output_tokens": 8}},
    )

    @tool
    async def lookup(key: str) -> str:
        """Look a key up."""
        await asyncio.sleep(0.001)
        return f"value-of-{key}"

    tools = [coalesce(lookup)]
    agent = create_react_agent(llm, tools=BatchToolNode(tools))
    g = StateGraph(Parent)
    g.add_node(
        "review",
        fan_out(
            agent,
            items="docs",
            into="reviews",
            make_input=lambda d, i: {"messages": [HumanMessage(d)]},
            result=lambda final: final["messages"][-1].content,
        ),
    )
    g.add_edge(START, "review")
    return g.compile(), llm, tools


async def soak(url: str, runs: int, n: int) -> list[dict[str, Any]]:
    from langgraph_batch.nodes import SiblingError
    from langgraph_batch.scheduler.registry import loop_schedulers
    from langgraph_batch.tools import coalescing

    graph, llm, tools = build(url)
    coalescers = [live.coalescer for t in tools if (live := coalescing(t)) is not None]
    rows: list[dict[str, Any]] = []
    baseline_tasks = len(asyncio.all_tasks())
    for r in range(runs):
        docs = [f"review doc {r}-{i} key=k{i % 50}" for i in range(n)]
        t0, cpu0 = time.monotonic(), time.process_time()
        out = await graph.ainvoke({"docs": docs}, {"recursion_limit": 100})
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
        failed = sum(isinstance(x, SiblingError) for x in out["reviews"])
        scheduler = llm.get_scheduler()
        ledger = await scheduler.kv_ledger()
        await asyncio.sleep(0)
        gc.collect()
        stats = scheduler.stats()
        rows.append(
            {
                "run": r,
                "wall_s": round(wall, 2),
                "client_cpu_s": round(cpu, 2),
                "siblings": len(out["reviews"]),
                "failed": failed,
                "rss_mb": round(rss_mb(), 1),
                "open_fds": open_fds(),
                "tasks": len(asyncio.all_tasks()) - baseline_tasks,  # the scheduler's own: 2
                "queued": stats.queued,
                "in_flight": stats.in_flight,
                "ledger_runs": ledger.members if ledger else 0,
                "ledger_tokens": ledger.resident_tokens() if ledger else 0,
                "tool_runs_kept": sum(c.stored_scopes() for c in coalescers),
                "tool_calls_in_flight": sum(c.inflight() for c in coalescers),
                "schedulers": len(loop_schedulers()),
            }
        )
        sys.stderr.write(json.dumps(rows[-1]) + "\n")
    await llm.get_scheduler().aclose()
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    base = rows[min(WARMUP_RUNS, len(rows) - 1)]
    last = rows[-1]
    idle = (
        "queued",
        "in_flight",
        "ledger_runs",
        "ledger_tokens",
        "tool_runs_kept",
        "tool_calls_in_flight",
    )
    return {
        "runs": len(rows),
        "siblings_per_run": rows[0]["siblings"],
        "rss_after_warmup_mb": base["rss_mb"],
        "rss_last_mb": last["rss_mb"],
        "rss_growth_after_warmup": round(last["rss_mb"] / base["rss_mb"] - 1, 4),
        "open_fds_first_last": [rows[0]["open_fds"], last["open_fds"]],
        "max_after_each_run": {k: max(r[k] for r in rows) for k in idle},
        # The open scheduler's own tasks (its runner, its metrics poll) stay: the
        # count must not grow past the first run's.
        "tasks_first_max": [rows[0]["tasks"], max(r["tasks"] for r in rows)],
        "failed_siblings": sum(r["failed"] for r in rows),
        "flat": last["rss_mb"] <= base["rss_mb"] * 1.05
        and all(max(r[k] for r in rows) == 0 for k in idle)
        and max(r["tasks"] for r in rows) <= rows[0]["tasks"]
        and last["open_fds"] <= rows[0]["open_fds"] + 2,
    }


def main(argv: list[str] | None = None) -> int:
    from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess

    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--fault-rate", type=float, default=0.10)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/soak.json"))
    args = p.parse_args(argv)
    cfg = EmulatorConfig(
        port=0,
        profile="zero",
        fault_rate=args.fault_rate,
        faults=("429", "500", "503", "drop"),
        retry_after_s=0.01,
        seed=3,
    )
    with EmulatorProcess(cfg) as emu:
        rows = asyncio.run(soak(emu.url, args.runs, args.n))
    result = {
        "summary": summary(rows),
        "rows": rows,
        "params": vars(args) | {"out": str(args.out)},
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    sys.stdout.write(json.dumps(result["summary"]) + "\n")
    return 0 if result["summary"]["flat"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
