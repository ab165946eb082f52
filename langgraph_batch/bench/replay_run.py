"""`langgraph-batch bench --replay FILE`: run a recorded job's shape with every contender.

The emulator (or `--server URL`) and the tool service run in their own
processes, as for a workload (`harness`); each contender runs the replay
job (`replay.make_replay_job`) in its own process after a reset; with the
repository's research harness, an `ideal` entry holds the replay's resident
bound. The results hold, beside each contender's usual entry, `recorded`
(the recorded run's figures, measured the same way) and `fidelity`: each
contender's replayed figure over the recorded one, for the token counts,
cache hits, tool waits and makespan.
Written as `<out>/replay.json` and `<out>/replay.md`. `FILE` may also be a
trace in another format (`--format`; `langgraph_batch.record.import_trace`).

Tool waits are tools only on both sides: the recorded tool time of each
turn (`replay_plan.recorded_figures`) against the replayed tool calls'
spans; the time a sibling back from its tools waits before its next model
call (a fan_out's admission hold) is `hold_mean_s`, reported apart. Both
come from `timeline.split_gaps`, the definition the bench report's "where
the time went" table reads too.

Siblings start at their recorded offsets (scaled by the time scale) unless
`start="together"`; every synthesized prompt, output or kept prefix that
differs from the recording is in `deviations` (the first 20 also among the
Markdown report's warnings, with the count of the rest).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from langgraph_batch.bench import collect, live, replay, timeline
from langgraph_batch.bench.extension import active
from langgraph_batch.bench.harness import (
    MODEL,
    _finish_entry,
    log,
    request_phases,
    run_contender,
    versions,
)
from langgraph_batch.bench.replay_cost import cost_markdown
from langgraph_batch.bench.report import breakdown_markdown, dumps
from langgraph_batch.bench.toolservice import tool_service
from langgraph_batch.record import TraceFormat, import_trace

__all__ = (
    "REPLAY_CONTENDERS",
    "STARTS",
    "compare",
    "gap_figures",
    "markdown",
    "replay_contenders",
    "run_replay",
    "write",
)

REPLAY_CONTENDERS = ("naive", "naive-bounded", "langgraph-batch")
"""The wheel's replay contenders (the research harness adds `ideal`, `replay_contenders`)."""


def replay_contenders() -> tuple[str, ...]:
    """`REPLAY_CONTENDERS`, then `ideal` when the active extension computes the bound."""
    bound = ("ideal",) if active().knows("replay", "ideal") else ()
    return (*REPLAY_CONTENDERS, *bound)


PROFILE = "h100-llama3-8b"
STARTS = ("recorded", "together")
"""How replayed siblings start: at their recorded offsets, or all at once."""
SHOWN_DEVIATIONS = 20
COMPARED = (
    "llm_requests",
    "prompt_tokens",
    "cached_tokens",
    "cache_hit_rate",
    "generation_tokens",
    "tool_calls_requested",
    "tool_wait_mean_s",
    "makespan_s",
)


def gap_figures(timeline_: Mapping[str, Sequence[Sequence[Any]]]) -> dict[str, Any]:
    """Mean tool and hold time between model calls over every sibling (`timeline.split_gaps`)."""
    gaps = [g for events in timeline_.values() for g in timeline.split_gaps(events)]
    if not gaps:
        return {"tool_wait_mean_s": None, "tool_wait_total_s": 0.0, "hold_mean_s": None,
                "gap_mean_s": None}  # fmt: skip
    return {
        "tool_wait_mean_s": statistics.fmean(g["tool"] for g in gaps),
        "tool_wait_total_s": sum(g["tool"] for g in gaps),
        "hold_mean_s": statistics.fmean(g["hold"] for g in gaps),
        "gap_mean_s": statistics.fmean(g["gap"] for g in gaps),
    }


def compare(recorded: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    """Replayed over recorded, per figure of `COMPARED` (None where either is unknown)."""
    out: dict[str, Any] = {}
    for key in COMPARED:
        a, b = entry.get(key), recorded.get(key)
        ok = isinstance(a, int | float) and isinstance(b, int | float) and b
        out[key] = round(a / b, 4) if ok else None  # type: ignore[operator]
    return out


def run_replay(
    path: Path,
    *,
    contenders: Sequence[str] = REPLAY_CONTENDERS,
    time_scale: float = 1.0,
    seed: int = 0,
    timeout: float = 600.0,
    target: live.ServerTarget | None = None,
    trace_format: TraceFormat | None = None,
    max_gap_s: float | None = None,
    start: str = "recorded",
) -> dict[str, Any]:
    """Replay the recording at `path` with `contenders`; returns the results dict.

    Args:
        path: the recording (`langgraph_batch.record`).
        contenders: which of `REPLAY_CONTENDERS` run (or `naive-bounded-<k>`).
        time_scale: the emulator's clock speed-up; tool latencies and start
            offsets shrink with it (1.0 on a live server).
        seed: the emulator's and the synthesis's seed.
        timeout: seconds each contender may run.
        target: a live server, or None for the emulator.
        start: `"recorded"` (each sibling at its recorded start offset) or
            `"together"` (all at once).
        trace_format: `record.import_trace`'s `format` (None: detected): a
            trace in another format replays the same way.
        max_gap_s: `record.import_trace`'s `max_gap_s` (caps the waits).

    Raises:
        ValueError: the file is not a recording this library can replay.
        RuntimeError: a live server does not answer or lacks the model.
    """
    from langgraph_batch.emulator.config import EmulatorConfig
    from langgraph_batch.emulator.process import EmulatorProcess

    if start not in STARTS:
        raise ValueError(f"start={start!r}: choose from {', '.join(STARTS)}")
    recording = import_trace(path, format=trace_format, max_gap_s=max_gap_s)
    rp = replay.plan(recording)
    syn = replay.synthesize(rp, seed=seed)
    scale = 1.0 if target is not None else time_scale
    n = len(rp.siblings)
    longest = max(p + c["max_tokens"] for ps, cs in zip(syn.prompts, syn.calls, strict=True)
                  for p, c in zip(ps, cs, strict=False))  # fmt: skip
    log(
        f"replay of {path}: {n} siblings, {rp.recorded['llm_requests']} model calls, "
        f"{rp.recorded['tool_calls_requested']} tool calls; contenders {', '.join(contenders)}"
    )
    results: dict[str, Any] = {}
    warnings = list(rp.warnings) + syn.deviations[:SHOWN_DEVIATIONS]
    if len(syn.deviations) > SHOWN_DEVIATIONS:
        warnings.append(
            f"... and {len(syn.deviations) - SHOWN_DEVIATIONS} more deviations "
            "(all of them under `deviations` in replay.json)"
        )
    with ExitStack() as stack:
        if target is None:
            cfg = EmulatorConfig(
                host="127.0.0.1",
                port=0,
                profile=PROFILE,
                scenario="agent",
                time_scale=scale,
                model=MODEL,
                seed=seed,
                turns=2,
                max_model_len=max(32_768, longest + 1024),
            )
            llm_url = stack.enter_context(EmulatorProcess(cfg)).url
            server: dict[str, Any] = {"url": llm_url, "emulator": True, "profile": PROFILE}
            model, live_opts, prompts = MODEL, None, None
        else:
            server = live.identify(target) | {"live": True}
            llm_url, model = target.base_url, target.model
            live_opts = {"flavor": target.flavor, "lgb_url": target.lgb_url}
            sizer = live.Sizer(target)
            prompts = replay.live_texts(syn, rp, sizer, live.run_nonce())
            server["prompt_sizing"] = sizer.method
            resets = sum(1 for cs in syn.calls for c in cs if "keep" in c)
            if resets:  # only the system prompt and tasks are sized with /tokenize
                warnings.append(
                    f"{resets} reset messages are sized in the emulator's tokens, not the "
                    "server's: their prompts are estimates"
                )
        tool_url = stack.enter_context(tool_service(replay.tool_config(syn, scale, seed)))
        for name in contenders:
            if name == "ideal":
                results[name] = active().replay_bound(rp, syn, profile_name=PROFILE, start=start)
                continue
            if target is None:
                collect.reset_emulator(llm_url)
            elif prompts is not None:  # a fresh prefix per contender: no reuse of another's cache
                nonce_end = prompts[0].index(".") + 1
                prompts = (live.run_nonce() + prompts[0][nonce_end:], prompts[1])
            collect.reset_tools(tool_url)
            job = replay.make_replay_job(
                rp, syn, llm_url=llm_url, tool_url=tool_url, model=model, contender=name,
                live=live_opts, prompts=prompts, time_scale=scale, start=start,
            )  # fmt: skip
            t0 = time.monotonic()
            client, error, _ = run_contender(name, job, timeout=timeout)
            if client is None:
                log(f"replay: {name} FAILED: {error}")
                results[name] = {"error": error}
                continue
            after = live.metrics(llm_url)
            delta = live.metrics_delta(after, client.get("baseline_metrics") or {})
            if target is None:
                entry = collect.combine(
                    client,
                    collect.emulator_stats(llm_url),
                    collect.tool_stats(tool_url),
                    time_scale=scale,
                )
            else:
                entry = collect.combine_live(client, delta, collect.tool_stats(tool_url))
            since = (client.get("baseline_emulator") or {}).get("engine_time_s")
            phases = request_phases(llm_url, since) if target is None else None
            _finish_entry(
                entry, job=job, client=client, server_delta=delta, phases=phases, scale=scale
            )
            entry.update(gap_figures(entry.get("timeline") or {}))
            entry["fidelity"] = compare(rp.recorded, entry)
            results[name] = entry
            log(
                f"replay: {name}: makespan {entry['makespan_s']:.2f} s "
                f"(recorded {rp.recorded['makespan_s']:.2f}), prompt tokens "
                f"{entry['prompt_tokens']} ({rp.recorded['prompt_tokens']}), cached "
                f"{entry['cached_tokens']} ({rp.recorded['cached_tokens']}), "
                f"process {time.monotonic() - t0:.1f} s"
            )
    return {
        "workload": "replay",
        "params": {
            "recording": str(path),
            "recording_header": dict(recording.header),
            "n": n,
            "seed": seed,
            "time_scale": scale,
            "times": "emulated seconds (wall seconds x time_scale)"
            if target is None
            else "wall seconds",
            "server": server,
            "shared_prefix_tokens": rp.shared_tokens,
            "tool_keys": len(syn.latency),
            "start": start,
            "resets": sum(t.kept_tokens is not None for s in rp.siblings for t in s.turns),
        },
        "versions": versions(),
        "recorded": rp.recorded,
        "contenders": results,
        "warnings": warnings,
        "deviations": syn.deviations,
    }


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(result: Mapping[str, Any]) -> str:
    """The replay's tables: recorded vs each contender, and the ratios."""
    rec = result["recorded"]
    params = result["params"]
    where = params["server"].get("url")
    lines = [
        f"### Replay of `{params['recording']}`",
        "",
        f"{params['n']} siblings, {rec['llm_requests']} model calls, "
        f"{rec['tool_calls_requested']} tool calls, on {where} "
        f"({'EMULATED' if params['server'].get('emulator') else 'live'}; times in "
        f"{params['times']}).",
        "",
        "| run | makespan s | prompt tokens | cached tokens | hit rate | output tokens "
        "| model calls | tool calls | mean tool wait s | mean hold s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def row(name: str, e: Mapping[str, Any]) -> str:
        return (
            f"| {name} | {_fmt(e.get('makespan_s'))} | {_fmt(e.get('prompt_tokens'))} | "
            f"{_fmt(e.get('cached_tokens'))} | {_fmt(e.get('cache_hit_rate'), 3)} | "
            f"{_fmt(e.get('generation_tokens'))} | {_fmt(e.get('llm_requests'))} | "
            f"{_fmt(e.get('tool_calls_requested'))} | {_fmt(e.get('tool_wait_mean_s'), 3)} | "
            f"{_fmt(e.get('hold_mean_s'), 3)} |"
        )

    lines.append(row("recorded", rec))
    for name, entry in result["contenders"].items():
        if "error" in entry:
            lines.append(f"| {name} | FAILED: {str(entry['error'])[:80]} |")
        elif name == "ideal":
            lines.append(f"| ideal (bound) | {_fmt(entry.get('makespan_s'))} | | | | | | | | |")
        else:
            lines.append(row(name, entry))
    lines += [
        "",
        "Mean tool wait: inside tool calls only; mean hold: back from the tools, before the "
        "next model call (admission holds, graph steps); see `bench.timeline.split_gaps`.",
        "",
        "Replayed / recorded:",
        "",
    ]
    lines.append("| contender | " + " | ".join(COMPARED) + " |")
    lines.append("|" + " --- |" * (len(COMPARED) + 1))
    for name, entry in result["contenders"].items():
        fid = entry.get("fidelity")
        if fid:
            lines.append(f"| {name} | " + " | ".join(_fmt(fid[k], 3) for k in COMPARED) + " |")
    split = breakdown_markdown(result["contenders"])  # the same split of the waits
    if split:
        lines += ["", *(split[:-1] if split[-1] == "" else split)]
    if result.get("cost"):
        lines += cost_markdown(result["cost"])
    if result.get("warnings"):
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in result["warnings"]]
    return "\n".join(lines) + "\n"


def write(result: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write `<out>/replay.json` and `<out>/replay.md`; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "replay.json", "md": out_dir / "replay.md"}
    paths["json"].write_text(dumps(result) + "\n")
    paths["md"].write_text(markdown(result))
    return paths
