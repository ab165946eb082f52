"""Process-side helpers shared by every contender (standard library only).

The harness writes a job (a JSON object) to the contender's stdin; the contender
runs the workload once and prints one JSON line to stdout with its client-side
measurements: makespan, per-sibling completion times and timeline, failures,
tool calls requested, the output lengths the server reported, client CPU
seconds and peak RSS. Server-side numbers (requests, tokens, cache hits,
preemptions, phase times, tool executions) are read by the harness from the
server (`/metrics`, and the emulator's own `/emulator/*`) and the tool
service; here only the snapshot after the warm-up is taken, so the harness
can subtract it.
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

RESULT_PREFIX = "BENCH_RESULT "

#: Server metrics a run reads, by our name: the first of the Prometheus names
#: present is used (vLLM, then SGLang). Histograms contribute `_sum`/`_count`.
METRIC_NAMES: dict[str, tuple[str, ...]] = {
    "prompt_tokens": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total"),
    "generation_tokens": ("vllm:generation_tokens_total", "sglang:generation_tokens_total"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total",),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total",),
    "cached_tokens": ("vllm:prompt_tokens_cached_total",),
    "preemptions": ("vllm:num_preemptions_total",),
    "requests_finished": ("vllm:request_success_total",),
    "queue_time_s": ("vllm:request_queue_time_seconds",),
    "prefill_time_s": ("vllm:request_prefill_time_seconds",),
    "decode_time_s": ("vllm:request_decode_time_seconds",),
    "inference_time_s": ("vllm:request_inference_time_seconds",),
    "e2e_time_s": ("vllm:e2e_request_latency_seconds",),
    "ttft_s": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
}
_HISTOGRAMS = frozenset(
    ("queue_time_s", "prefill_time_s", "decode_time_s", "inference_time_s", "e2e_time_s", "ttft_s")
)
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """The server metrics of `METRIC_NAMES` in a Prometheus `/metrics` body.

    Counters are summed over their label sets; a histogram gives `<name>`
    (its `_sum`) and `<name>_count`. Absent metrics are absent from the dict.
    """
    raw: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if not math.isnan(value):
            raw[m.group(1)] = raw.get(m.group(1), 0.0) + value
    out: dict[str, float] = {}
    for ours, names in METRIC_NAMES.items():
        for name in names:
            if ours in _HISTOGRAMS:
                if f"{name}_sum" in raw:
                    out[ours] = raw[f"{name}_sum"]
                    out[f"{ours}_count"] = raw.get(f"{name}_count", 0.0)
                    break
            elif name in raw:
                out[ours] = raw[name]
                break
    return out


@dataclass(slots=True)
class Recorder:
    """Client-side measurements of one run."""

    t0: float = 0.0
    completions: dict[int, float] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    tool_calls_requested: int = 0
    llm_calls: int = 0
    samples: dict[int, str] = field(default_factory=dict)
    events: list[tuple[float, int, str]] = field(default_factory=list)
    """(seconds since t0, sibling, what): the sibling starting, model and tool
    calls starting and ending (`start`, `llm_start`, `llm_end`, `tool_start`,
    `tool_end`); its finish is in `completions`."""
    output_tokens: dict[str, list[int | None]] = field(default_factory=dict)
    """Output tokens the server reported per model call, by kind (`tool`, `answer`)."""
    tool_args: list[str] = field(default_factory=list)
    """The argument values of the tool calls the model made (shape checks)."""

    def event(self, index: int, what: str) -> None:
        """Note a step of sibling `index` (for the timeline in the results)."""
        self.events.append((round(time.monotonic() - self.t0, 4), index, what))

    def done(self, index: int, answer: str | None = None) -> None:
        """Sibling `index` produced its final answer now."""
        self.completions.setdefault(index, time.monotonic() - self.t0)
        if answer is not None and len(self.samples) < 3:
            self.samples[index] = answer[:200]

    def failed(self, index: int, error: BaseException | str) -> None:
        """Sibling `index` failed."""
        self.errors.setdefault(index, str(error)[:300])

    def clear(self) -> None:
        """Forget everything recorded (after the warm-up run)."""
        self.completions.clear()
        self.errors.clear()
        self.samples.clear()
        self.tool_calls_requested = 0
        self.llm_calls = 0
        self.events.clear()
        self.output_tokens.clear()
        self.tool_args.clear()

    def output(self, kind: str, tokens: int | None) -> None:
        """Note one model call's output length (None: the server did not say)."""
        self.output_tokens.setdefault(kind, []).append(tokens)


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


WARMUP_KEY = "warmup"


def warmup_job(job: dict[str, Any]) -> dict[str, Any]:
    """A one-sibling job through the same code path, sharing no prompt prefix with the real one.

    Contenders run it first, so one-time costs (imports, client and graph
    set-up, connection pools) are not charged to the measured run, as they
    would not be on a long-lived server process.
    """
    return dict(
        job,
        system_prompt="Warm-up run. Answer briefly.",
        tasks=[f"Warm-up task key={WARMUP_KEY}"],
        tool_keys=[WARMUP_KEY],
        task_keys=[WARMUP_KEY] if job.get("task_keys") else None,
        turns_per_task=[min(2, int(job.get("turns") or 2))],
        start_offsets=None,  # a replay's: the warm-up starts at once
        replay_calls=[  # a replay's first sibling's lengths, without its resets
            [{"max_tokens": c["max_tokens"], "answer": c["answer"]} for c in cs]
            for cs in job["replay_calls"][:1]
        ]
        if job.get("replay_calls")
        else None,
    )


async def _get_json(url: str) -> Any:
    """GET `url` and decode JSON, without third-party packages or blocking the loop."""
    import asyncio
    import urllib.request

    def fetch() -> Any:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return json.loads(resp.read().decode())

    return await asyncio.to_thread(fetch)


def sum_stats(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Counters of several replicas' `/emulator/stats` as one (W4).

    Numbers are summed, except lags (`*lag*`: the worst replica's); anything
    else is taken from the first replica. `per_replica_requests` lists each
    replica's request count.
    """
    if len(stats) == 1:
        return dict(stats[0])
    out: dict[str, Any] = dict(stats[0])
    for key in stats[0]:
        values = [s.get(key) for s in stats]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            continue
        out[key] = max(values) if "lag" in key else sum(values)  # type: ignore[type-var]
    out["per_replica_requests"] = [s.get("requests") for s in stats]
    return out


async def emulator_baseline(job: dict[str, Any]) -> dict[str, Any]:
    """The emulator counters now, summed over every replica of the job.

    On a live server ({} if it is not the emulator) only its engine clock is
    used, to fetch the emulator's per-request phases of the measured run.
    """
    urls = job.get("llm_urls") or [job["llm_url"]]
    if job.get("server", {}).get("live"):
        try:
            return dict(await _get_json(urls[0] + "/emulator/stats"))
        except (OSError, ValueError):
            return {}
    return sum_stats([await _get_json(u + "/emulator/stats") for u in urls])


async def metrics_baseline(job: dict[str, Any]) -> dict[str, float]:
    """`parse_metrics` of every replica's `/metrics` now, summed ({} if none answers)."""
    import asyncio
    import urllib.request

    def fetch(url: str) -> str:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
            text: str = resp.read().decode()
            return text

    out: dict[str, float] = {}
    for url in job.get("llm_urls") or [job["llm_url"]]:
        try:
            text = await asyncio.to_thread(fetch, url)
        except OSError:
            continue
        for key, value in parse_metrics(text).items():
            out[key] = out.get(key, 0.0) + value
    return out


Runner = Callable[[dict[str, Any]], Awaitable[Any]]


def run_measured(
    job: dict[str, Any],
    run: Runner,
    *,
    setup: Callable[[], Awaitable[Any]] | None = None,
    teardown: Callable[[], Awaitable[Any]] | None = None,
) -> dict[str, Any]:
    """Warm up, then run `run(job)` once, measuring wall time and client CPU around it.

    The server counters are snapshotted after the warm-up (`baseline_*`), so
    the harness can subtract the warm-up's requests and tool calls.
    """
    import asyncio

    n = len(job["tasks"])
    rec = RECORDER
    out: dict[str, Any] = {}

    async def main() -> None:
        if setup is not None:
            await setup()
        try:
            rec.t0 = time.monotonic()
            try:
                await run(warmup_job(job))
            except Exception as exc:
                out["warmup_error"] = f"{type(exc).__name__}: {exc}"[:300]
            rec.clear()
            out["baseline_emulator"] = await emulator_baseline(job)
            out["baseline_metrics"] = await metrics_baseline(job)
            out["baseline_tools"] = await _get_json(job["tool_url"] + "/stats")
            profile_path = os.environ.get("BENCH_PROFILE")
            profiler = None
            if profile_path:  # diagnostics: cProfile of the measured run
                import cProfile

                profiler = cProfile.Profile()
                profiler.enable()
            cpu0 = time.process_time()
            rec.t0 = time.monotonic()
            try:
                await run(job)
            except Exception as exc:  # a bare Send run raises on the first failing sibling
                out["run_error"] = f"{type(exc).__name__}: {exc}"[:500]
            out["makespan_s"] = time.monotonic() - rec.t0
            out["client_cpu_s"] = time.process_time() - cpu0
            if profiler is not None and profile_path:
                profiler.disable()
                profiler.dump_stats(f"{profile_path}.{job.get('contender', 'run')}")
        finally:
            if teardown is not None:
                await teardown()

    asyncio.run(main())
    run_error = out.get("run_error")
    for i in range(n):
        if i not in rec.completions and i not in rec.errors:
            rec.failed(i, run_error or "no result")
    return {
        "makespan_s": out["makespan_s"],
        "completions_s": [rec.completions.get(i) for i in range(n)],
        "failures": sum(1 for i in range(n) if i not in rec.completions),
        "errors": sorted(set(rec.errors.values()))[:5],
        "run_error": run_error,
        "warmup_error": out.get("warmup_error"),
        "baseline_emulator": out.get("baseline_emulator") or {},
        "baseline_metrics": out.get("baseline_metrics") or {},
        "baseline_tools": out.get("baseline_tools") or {},
        "tool_calls_requested": rec.tool_calls_requested,
        "llm_calls_client": rec.llm_calls,
        "client_cpu_s": out["client_cpu_s"],
        "peak_rss_mb": peak_rss_mb(),
        "samples": {str(k): v for k, v in sorted(rec.samples.items())},
        "events": rec.events,
        "output_tokens": rec.output_tokens,
        "tool_args": sorted(set(rec.tool_args)),
        "tool_args_count": len(rec.tool_args),
    }
