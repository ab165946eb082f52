"""Collect one contender's numbers: the client's own report plus the servers' counters.

Server-side figures come from the emulator (`GET /emulator/stats`, reset with
`POST /emulator/reset` before every contender so prefix caches never leak from
one contender to the next), or, on a live server, from its `/metrics` read
before and after (`combine_live`), and from the tool service (`GET /stats`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from langgraph_batch.bench.contenders import WARMUP_KEY


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation, or None for no values."""
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _get_json(url: str) -> dict[str, Any]:
    resp = httpx.get(url, timeout=30.0)
    resp.raise_for_status()
    data: dict[str, Any] = resp.json()
    return data


def _post(url: str) -> None:
    httpx.post(url, timeout=30.0).raise_for_status()


def emulator_stats(url: str) -> dict[str, Any]:
    """The emulator's counters."""
    return _get_json(f"{url}/emulator/stats")


def reset_emulator(url: str) -> None:
    """Zero the emulator's counters and clear its prefix cache."""
    _post(f"{url}/emulator/reset")


def tool_stats(url: str) -> dict[str, Any]:
    """The tool service's counters."""
    return _get_json(f"{url}/stats")


def reset_tools(url: str) -> None:
    """Zero the tool service's counters."""
    _post(f"{url}/reset")


def _int(stats: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = stats.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return None


_COUNTERS = (
    "requests",
    "finished",
    "aborted",
    "prompt_tokens_received",
    "prefill_tokens_computed",
    "cached_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "generation_tokens",
    "preemptions",
    "evictions",
    "steps",
    "busy_time_s",
)


def subtract_baseline(after: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """Emulator counters of the measured run alone (the contender's warm-up taken out)."""
    out = dict(after)
    for key in _COUNTERS:
        a, b = after.get(key), baseline.get(key)
        if isinstance(a, int | float) and isinstance(b, int | float):
            out[key] = a - b
    return out


def tool_delta(after: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """Tool-service counters of the measured run alone (warm-up calls taken out)."""
    out = dict(after)
    out["executions"] = int(after.get("executions", 0)) - int(baseline.get("executions", 0))
    by_key = {k: v for k, v in (after.get("by_key") or {}).items() if WARMUP_KEY not in k}
    out["by_key"] = by_key
    out["distinct_keys"] = len(by_key)
    return out


def combine(
    client: Mapping[str, Any],
    emu: Mapping[str, Any],
    tools: Mapping[str, Any],
    *,
    time_scale: float,
) -> dict[str, Any]:
    """One contender's entry for the results JSON.

    Times are in EMULATED seconds (wall seconds x time_scale, the emulator's
    engine seconds per wall second), so they read as the same job on the
    emulated GPU; `wall_makespan_s` keeps the raw figure.
    """
    scale = time_scale
    emu = subtract_baseline(emu, client.get("baseline_emulator") or {})
    tools = tool_delta(tools, client.get("baseline_tools") or {})
    prompt = _int(emu, "prompt_tokens_received", "prompt_tokens")
    cached = _int(emu, "cached_tokens", "prefix_cache_hits")
    server = {
        "llm_requests": _int(emu, "requests", "requests_received"),
        "prompt_tokens": prompt,
        "prefill_tokens_computed": _int(emu, "prefill_tokens_computed"),
        "cached_tokens": cached,
        "cache_hit_rate": (cached / prompt) if prompt and cached is not None else None,
        "preemptions": _int(emu, "preemptions"),
        "generation_tokens": _int(emu, "generation_tokens"),
        "evictions": _int(emu, "evictions"),
        "server_lag_s": emu.get("max_lag_s", emu.get("lag_s")),
        "server_late_steps": emu.get("late_steps"),
        "engine_busy_s": emu.get("busy_time_s"),
    }
    return _entry(client, server, tools, scale)


def combine_live(
    client: Mapping[str, Any], delta: Mapping[str, float], tools: Mapping[str, Any]
) -> dict[str, Any]:
    """One contender's entry from a live server's `/metrics` delta (times: wall seconds)."""
    from langgraph_batch.bench.live import server_figures

    tools = tool_delta(tools, client.get("baseline_tools") or {})
    server = server_figures(delta) | {
        "evictions": None,
        "server_lag_s": None,
        "server_late_steps": None,
        "engine_busy_s": None,
    }
    return _entry(client, server, tools, 1.0)


def _entry(
    client: Mapping[str, Any], server: Mapping[str, Any], tools: Mapping[str, Any], scale: float
) -> dict[str, Any]:
    done = [c * scale for c in client.get("completions_s") or [] if c is not None]
    return {
        "makespan_s": client["makespan_s"] * scale,
        "latency_p50_s": percentile(done, 0.50),
        "latency_p95_s": percentile(done, 0.95),
        "latency_p99_s": percentile(done, 0.99),
        "first_result_s": min(done) if done else None,
        "llm_requests": server["llm_requests"],
        "tool_calls_requested": client.get("tool_calls_requested"),
        "tool_calls_executed": _int(tools, "executions"),
        "tool_distinct_keys": _int(tools, "distinct_keys"),
        "prompt_tokens": server["prompt_tokens"],
        "prefill_tokens_computed": server["prefill_tokens_computed"],
        "cached_tokens": server["cached_tokens"],
        "cache_hit_rate": server["cache_hit_rate"],
        "preemptions": server["preemptions"],
        "client_cpu_s": client.get("client_cpu_s"),
        "peak_rss_mb": client.get("peak_rss_mb"),
        "failures": client.get("failures"),
        "wall_makespan_s": client["makespan_s"],
        "generation_tokens": server["generation_tokens"],
        "evictions": server["evictions"],
        "server_lag_s": server["server_lag_s"],
        "server_late_steps": server["server_late_steps"],
        "engine_busy_s": server["engine_busy_s"],
        "warmup_error": client.get("warmup_error"),
        "tool_peak_waiting": tools.get("peak_waiting"),
        "errors": client.get("errors") or [],
        "run_error": client.get("run_error"),
        "samples": client.get("samples") or {},
        "events": client.get("events") or [],
    }
