"""Process-side helpers shared by every contender (standard library only).

The harness writes a job (a JSON object) to the contender's stdin; the contender
runs the workload once and prints one JSON line to stdout with its client-side
measurements: makespan, per-sibling completion times, failures, tool calls
requested, client CPU seconds and peak RSS. Server-side numbers (requests,
tokens, cache hits, preemptions, tool executions) are read by the harness from
the emulator and the tool service, not here.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

RESULT_PREFIX = "BENCH_RESULT "


@dataclass(slots=True)
class Recorder:
    """Client-side measurements of one run."""

    t0: float = 0.0
    completions: dict[int, float] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    tool_calls_requested: int = 0
    llm_calls: int = 0
    samples: dict[int, str] = field(default_factory=dict)

    def done(self, index: int, answer: str | None = None) -> None:
        """Sibling `index` produced its final answer now."""
        self.completions.setdefault(index, time.monotonic() - self.t0)
        if answer is not None and len(self.samples) < 3:
            self.samples[index] = answer[:200]

    def failed(self, index: int, error: BaseException | str) -> None:
        """Sibling `index` failed."""
        self.errors.setdefault(index, str(error)[:300])


RECORDER = Recorder()


def read_job() -> dict[str, Any]:
    """The job JSON from stdin."""
    job: dict[str, Any] = json.loads(sys.stdin.read())
    return job


def emit(result: dict[str, Any]) -> None:
    """Print the result line the harness looks for."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_measured(job: dict[str, Any], body: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    """Run `body()` in a fresh event loop; measure wall time and client CPU around it."""
    import asyncio

    n = len(job["tasks"])
    rec = RECORDER
    cpu0 = time.process_time()
    rec.t0 = time.monotonic()
    run_error: str | None = None
    try:
        asyncio.run(body())
    except BaseException as exc:  # the naive Send run raises on the first failing sibling
        if isinstance(exc, KeyboardInterrupt):
            raise
        run_error = f"{type(exc).__name__}: {exc}"[:500]
    makespan = time.monotonic() - rec.t0
    cpu = time.process_time() - cpu0
    for i in range(n):
        if i not in rec.completions and i not in rec.errors:
            rec.failed(i, run_error or "no result")
    return {
        "makespan_s": makespan,
        "completions_s": [rec.completions.get(i) for i in range(n)],
        "failures": sum(1 for i in range(n) if i not in rec.completions),
        "errors": sorted(set(rec.errors.values()))[:5],
        "run_error": run_error,
        "tool_calls_requested": rec.tool_calls_requested,
        "llm_calls_client": rec.llm_calls,
        "client_cpu_s": cpu,
        "peak_rss_mb": peak_rss_mb(),
        "samples": {str(k): v for k, v in sorted(rec.samples.items())},
    }
