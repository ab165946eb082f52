"""Write a workload's results: JSON (all raw numbers) and a Markdown table.

A result's `goals`, when it has any (the research harness evaluates the
issues' goals, `benchmarks/goals.py`), are printed under its table; the
research harness also draws each workload's chart (`BenchExtension.written`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from langgraph_batch.bench.extension import active

__all__ = ("markdown", "ratios", "summary_markdown", "write")

LGB = "langgraph-batch"


def _num(entry: Mapping[str, Any] | None, key: str) -> float | None:
    if not entry or entry.get("error"):
        return None
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    if b == 0:
        return 0.0 if a == 0 else math.inf
    return a / b


#: Per-contender keys every non-ideal entry carries (the issue's list).
METRIC_KEYS = (
    "makespan_s",
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "first_result_s",
    "llm_requests",
    "tool_calls_requested",
    "tool_calls_executed",
    "prompt_tokens",
    "prefill_tokens_computed",
    "cache_hit_rate",
    "preemptions",
    "client_cpu_s",
    "peak_rss_mb",
    "failures",
)


#: Workloads whose point is the prefill the server computes, and why.
PREFILL_WORKLOADS = {
    "W4": "cache-affinity routing vs round robin over 4 replicas",
    "W6": "what prefix warming saves on SGLang's radix cache",
}


def ratios(contenders: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each contender's makespan, p95 and prefill tokens computed relative to langgraph-batch.

    Plus langgraph-batch's makespan relative to ideal. The ideal entry's prefill
    figure is `prefill_tokens` (the bound's own count), so its prefill ratio is None.
    """
    lgb = contenders.get(LGB)
    out: dict[str, Any] = {}
    for name, entry in contenders.items():
        if name == LGB:
            continue
        out[f"{name}/{LGB}"] = {
            "makespan": _ratio(_num(entry, "makespan_s"), _num(lgb, "makespan_s")),
            "latency_p95": _ratio(_num(entry, "latency_p95_s"), _num(lgb, "latency_p95_s")),
            # W4 (affinity vs round robin) and W6 (prefix warming) are about this one.
            "prefill_tokens_computed": _ratio(
                _num(entry, "prefill_tokens_computed"), _num(lgb, "prefill_tokens_computed")
            ),
        }
    if "ideal" in contenders:
        out[f"{LGB}/ideal"] = {
            "makespan": _ratio(_num(lgb, "makespan_s"), _num(contenders["ideal"], "makespan_s"))
        }
    return out


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def server_line(params: Mapping[str, Any]) -> str:
    """Which server produced the numbers, in one sentence."""
    server = params.get("server") or {}
    if not server.get("live"):
        return (
            f"N={params.get('n')}, time scale {params.get('time_scale')}, seed "
            f"{params.get('seed')}, emulated profile `{params.get('profile')}` "
            "(EMULATED server, not a GPU)."
        )
    what = (
        f"the langgraph-batch emulator ({server.get('emulator_evidence')})"
        if server.get("emulator")
        else "a live server (it does not identify as the emulator)"
    )
    engine = f" running {server['engine']}" if server.get("engine") else ""
    return (
        f"N={params.get('n')}, seed {params.get('seed')}, server `{server.get('url')}`{engine} "
        f"(version {server.get('version')}, model `{server.get('model')}`): {what}. Shapes "
        f"forced; prompts sized by {server.get('prompt_sizing')}; times in wall seconds."
    )


def breakdown_markdown(contenders: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The mean sibling's time by phase, per contender (see `langgraph_batch.bench.timeline`)."""
    rows = [(n, e["breakdown"]) for n, e in contenders.items() if e.get("breakdown")]
    if not rows:
        return []
    header = (
        "| contender | latency | not started | client queue | server queue | prefill | "
        "decode | tool | hold | other |"
    )
    lines = [
        "Where the mean sibling's time went (s; server phases from /metrics):",
        "",
        header,
        header_sep(header),
    ]
    for name, b in rows:
        cells = [
            b.get(k)
            for k in (
                "latency",
                "not_started",
                "client_queue",
                "server_queue",
                "prefill",
                "decode",
                "tool",
                "hold",
                "other",
            )
        ]
        lines.append("| " + " | ".join([name, *(_fmt(v) for v in cells)]) + " |")
    lines.append("")
    return lines


def markdown(result: Mapping[str, Any]) -> str:
    """A Markdown report of one workload's result dict."""
    wl = result["workload"]
    params = result["params"]
    contenders: Mapping[str, Mapping[str, Any]] = result["contenders"]
    lines = [f"### {wl}: {params.get('description', '')}", ""]
    lines.append(server_line(params))
    lines.append("")
    header = (
        "| contender | makespan s | x lgb | p50 s | p95 s | p99 s | first s | LLM req | "
        "tools req/exec | prompt tok | prefill tok | cache hit | preempt | CPU s | RSS MB | fail |"
    )
    lines += [header, header_sep(header)]
    lgb = contenders.get(LGB)
    for name, e in contenders.items():
        if e.get("error"):
            lines.append(f"| {name} | FAILED: {str(e['error'])[:120]} |" + " |" * 15)
            continue
        ratio = _ratio(_num(e, "makespan_s"), _num(lgb, "makespan_s"))
        tools = (
            f"{_fmt(e.get('tool_calls_requested'))}/{_fmt(e.get('tool_calls_executed'))}"
            if name != "ideal"
            else "-"
        )
        hit = e.get("cache_hit_rate")
        row = [
            name,
            _fmt(e.get("makespan_s")),
            _fmt(ratio),
            _fmt(e.get("latency_p50_s")),
            _fmt(e.get("latency_p95_s")),
            _fmt(e.get("latency_p99_s")),
            _fmt(e.get("first_result_s")),
            _fmt(e.get("llm_requests")),
            tools,
            _fmt(e.get("prompt_tokens")),
            _fmt(e.get("prefill_tokens_computed")),
            "-" if hit is None else f"{100 * hit:.1f}%",
            _fmt(e.get("preemptions")),
            _fmt(e.get("client_cpu_s")),
            _fmt(e.get("peak_rss_mb"), 0),
            _fmt(e.get("failures")),
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if wl in PREFILL_WORKLOADS and _num(lgb, "prefill_tokens_computed"):
        mine = _num(lgb, "prefill_tokens_computed")
        parts = [
            f"{name} {_fmt(_ratio(_num(e, 'prefill_tokens_computed'), mine))}x"
            for name, e in contenders.items()
            if name not in (LGB, "ideal") and _num(e, "prefill_tokens_computed") is not None
        ]
        if parts:
            lines.append(
                f"Prefill tokens computed, relative to langgraph-batch "
                f"({PREFILL_WORKLOADS[wl]}): " + ", ".join(parts) + "."
            )
            lines.append("")
    lines += breakdown_markdown(contenders)
    lines += active().sections(contenders)
    nobatch = _num(contenders.get("langgraph-batch-nobatch"), "makespan_s")
    if nobatch is not None and _num(lgb, "makespan_s"):
        lines.append(
            "HTTP batching (diagnostic): langgraph-batch with the scheduler's batching off "
            f"took {_fmt(_ratio(nobatch, _num(lgb, 'makespan_s')))}x as long."
        )
        lines.append("")
    goal_list = result.get("goals") or []
    if goal_list:
        lines.append("Goals (langgraph-batch):")
        lines.append("")
        for g in goal_list:
            met = g.get("met")
            mark = "MET" if met else ("MISSED" if met is False else "NOT MEASURED")
            note = ""
            if g.get("ideal_ratio") is not None:
                note = f" (the ideal bound itself: {_fmt(g['ideal_ratio'])})"
            if g.get("note"):
                note += f" ({g['note']})"
            lines.append(f"- {g['goal']}: measured {_fmt(g.get('measured'))} -> **{mark}**{note}")
        lines.append("")
    for warning in result.get("warnings") or []:
        lines.append(f"> warning: {warning}")
    return "\n".join(lines) + "\n"


def header_sep(header: str) -> str:
    """The `| --- | --- |` line matching a Markdown header row."""
    cols = header.count("|") - 1
    return "|" + " --- |" * cols


def _is_flat(value: Any) -> bool:
    return isinstance(value, list) and all(not isinstance(v, dict | list) for v in value)


def dumps(obj: Any, indent: int = 0) -> str:
    """JSON like `json.dumps(obj, indent=2)`, with lists kept short.

    A list of scalars stays on one line and a list of such lists gets one line
    per item (timelines, request rows).
    """
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(str(k))}: {dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if _is_flat(obj):
        return json.dumps(obj, separators=(",", ":"), default=str)
    if isinstance(obj, list):
        if not obj:
            return "[]"
        if all(_is_flat(v) for v in obj):
            rows = [inner + json.dumps(v, separators=(",", ":"), default=str) for v in obj]
        else:
            rows = [inner + dumps(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(rows) + f"\n{pad}]"
    return json.dumps(obj, default=str)


def write(result: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write `<out>/<workload>.json` and `.md` (and what the extension adds); returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    wl = result["workload"]
    paths = {"json": out_dir / f"{wl}.json", "md": out_dir / f"{wl}.md"}
    paths["json"].write_text(dumps(result) + "\n")
    paths["md"].write_text(markdown(result))
    active().written(result, paths)
    return paths


def summary_markdown(results: Sequence[Mapping[str, Any]], command: str, date: str) -> str:
    """The combined table for README: one section per workload plus the goals."""
    live = [r for r in results if (r["params"].get("server") or {}).get("live")]
    where = (
        f"against {live[0]['params']['server'].get('url')}"
        if live
        else "on the emulated server (not a GPU)"
    )
    parts = [f"Measured {date} with `{command}` {where}.", ""]
    parts += [markdown(r) for r in results]
    return "\n".join(parts)
