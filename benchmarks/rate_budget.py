"""Rate budgets: 429s and makespan of a burst of siblings over a per-minute token budget.

N concurrent requests (the first LLM call of N fan_out siblings) against the
emulator with provider-style limits (`--rate-limit-tpm`, OpenAI's headers),
the minute scaled to 60 / time_scale wall seconds, total tokens several times
the budget. Three clients, one fresh emulator each:

- `none`: no pacing (`RateLimitPolicy(follow_headers=False, probe=False)`):
  what the scheduler did before rate budgets: the burst draws 429s, each is
  retried after its `retry-after` (AIMD lowers the in-flight limit);
- `stated`: `RateLimitPolicy(tokens_per_min=TPM, minute_s=...)`;
- `headers`: `RateLimitPolicy()`: one probe request, then limits and the
  minute learned from `x-ratelimit-*`.

The bound: the first full bucket goes at once, the rest at the refill rate:
(tokens - TPM) / (TPM / minute). Tokens are what the server reported using.

Usage:
    python -m benchmarks.rate_budget [--siblings 50] [--tpm 1500] [--time-scale 60]
        [--repeats 3] [--out benchmarks/results/rate_budget]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from langgraph_batch._rate_budget import forget_pacers
from langgraph_batch.backends import OpenAICompatibleBackend
from langgraph_batch.backends.base import ChatRequest
from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess
from langgraph_batch.scheduler import BatchPolicy, RateLimitPolicy, RetryPolicy, Scheduler

PATIENT = RetryPolicy(max_attempts=40, initial_interval=0.05, max_interval=1.0)


def _modes(tpm: int, minute_s: float) -> dict[str, RateLimitPolicy]:
    return {
        "none": RateLimitPolicy(follow_headers=False, probe=False),
        "stated": RateLimitPolicy(tokens_per_min=tpm, minute_s=minute_s),
        "headers": RateLimitPolicy(),
    }


async def _run(url: str, policy: RateLimitPolicy, siblings: int, tpm: int, minute_s: float) -> Any:
    forget_pacers()
    backend = OpenAICompatibleBackend(url)
    requests = [
        ChatRequest(
            model="emulated-llama-3-8b",
            messages=[{"role": "user", "content": f"sibling {i}: " + "summarise this. " * 25}],
            params={"max_tokens": 16},
        )
        for i in range(siblings)
    ]
    async with Scheduler(
        backend, policy=BatchPolicy(rate_limit=policy, retry=PATIENT), owns_backend=True
    ) as scheduler:
        t0 = time.monotonic()
        out = await asyncio.gather(*(scheduler.submit(r) for r in requests))
        makespan = time.monotonic() - t0
        stats_now = scheduler.stats()
    tokens = sum(r.usage.total_tokens for r in out if r.usage is not None)
    async with httpx.AsyncClient() as client:
        stats = (await client.get(url + "/emulator/stats")).json()
    bound = max(0.0, tokens - tpm) / (tpm / minute_s)
    return {
        "makespan_s": round(makespan, 3),
        "tokens": tokens,
        "rate_limited": stats["rate_limited"],
        "retries": stats_now.retries,
        "rate_waits": stats_now.rate_waits,
        "rate_wait_s": round(stats_now.rate_wait_s, 3),
        "bound_s": round(bound, 3),
        "bound_total_s": round(tokens / (tpm / minute_s), 3),
        "over_bound": round(makespan / bound, 3) if bound else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run each mode `--repeats` times and write `rate_budget.{json,md}`."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--siblings", type=int, default=50)
    p.add_argument("--tpm", type=int, default=1500)
    p.add_argument("--time-scale", type=float, default=60.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results/rate_budget")
    args = p.parse_args(argv)
    minute_s = 60.0 / args.time_scale
    runs: dict[str, list[Any]] = {}
    for name, policy in _modes(args.tpm, minute_s).items():
        for _ in range(args.repeats):
            cfg = EmulatorConfig(
                port=0,
                profile="zero",
                scenario="echo",
                time_scale=args.time_scale,
                rate_limit_rpm=100 * args.siblings,
                rate_limit_tpm=args.tpm,
            )
            with EmulatorProcess(cfg) as emu:
                runs.setdefault(name, []).append(
                    asyncio.run(_run(emu.url, policy, args.siblings, args.tpm, minute_s))
                )
    summary = {
        name: {
            "rate_limited_median": statistics.median(r["rate_limited"] for r in rs),
            "makespan_s_median": statistics.median(r["makespan_s"] for r in rs),
            "bound_s_median": statistics.median(r["bound_s"] for r in rs),
        }
        for name, rs in runs.items()
    }
    result = {
        "config": {**vars(args), "minute_s": minute_s, "profile": "zero", "scenario": "echo"},
        "machine": platform.platform(),
        "runs": runs,
        "summary": summary,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rate_budget.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Rate budgets: a burst of siblings over a per-minute token budget",
        "",
        f"{args.siblings} concurrent requests, emulator `--rate-limit-tpm {args.tpm}` with a "
        f"minute of {minute_s:g} s (time_scale {args.time_scale:g}), profile `zero`, "
        f"{args.repeats} runs per mode (medians; every run in the JSON). Bound: "
        "(tokens - TPM) / (TPM / minute).",
        "",
        "| mode | 429s | makespan s | bound s | makespan / bound |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, s in summary.items():
        ratio = s["makespan_s_median"] / s["bound_s_median"] if s["bound_s_median"] else 0.0
        lines.append(
            f"| {name} | {s['rate_limited_median']:g} | {s['makespan_s_median']:.2f} "
            f"| {s['bound_s_median']:.2f} | {ratio:.2f} |"
        )
    (out / "rate_budget.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
