"""Run a workload's contenders, one process each, against the emulator or a live server.

Emulator runs (the default) start the emulator (one process per replica)
and the tool service, reset both before each contender and read the
emulator's counters. Live runs (`--server`) start only the tool service,
name the server in the results, give each contender a fresh random prompt
prefix (a live server's prefix cache cannot be reset), size prompts with the
server's `/tokenize`, force the workload's shapes so any model (random
weights included) produces them, and read the server's `/metrics` before
and after. Both record every sibling's timeline and the server's phase
times (`/metrics`), and, when the server is the emulator, each request's
phases (`/emulator/requests`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from importlib import metadata
from typing import Any

import httpx

from langgraph_batch.bench import collect, live, report, timeline
from langgraph_batch.bench._paths import child_env
from langgraph_batch.bench.contenders import RESULT_PREFIX, sum_stats
from langgraph_batch.bench.extension import active
from langgraph_batch.bench.toolservice import tool_service
from langgraph_batch.bench.workloads import (
    SINGLE_TURN,
    WORKLOADS,
    Workload,
    bounded_concurrency,
    emulator_settings,
    make_job,
    params,
    system_rng,
    task_head,
    task_rng,
    tool_config,
)

logger = logging.getLogger(__name__)

MODULES = {
    "naive": "langgraph_batch.bench.contenders.naive",
    "naive-bounded": "langgraph_batch.bench.contenders.naive",
    "langgraph-batch": "langgraph_batch.bench.contenders.lgb",
    "langgraph-batch-rr": "langgraph_batch.bench.contenders.lgb",
}
SINGLE_TURN_MODULE = "langgraph_batch.bench.contenders.single"
SIMULATION_MODULE = "langgraph_batch.bench.contenders.simulation"
SINGLE_TURN_CONTENDERS = (
    "abatch-bounded",
    "abatch",
    "langgraph-batch",
    "langgraph-batch-fan-out",
    "langgraph-batch-nobatch",
)
MODEL = "emulated-llama-3-8b"
BOUND = "ideal"
"""The lower bound's entry (the research harness computes it: `BenchExtension.bound`)."""
LAG_WARN_S = 0.5


def log(msg: str) -> None:
    """One timestamped progress line on stderr."""
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def versions() -> dict[str, Any]:
    """Versions of everything that shapes the numbers."""
    out: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    for dist in ("langgraph-batch", "langgraph", "langchain-core", "langchain-openai", "openai"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    out["cpu_count"] = os.cpu_count()
    # An installed package has no checkout to ask: the research harness fills these in.
    out["installed"] = True
    out["git_commit"] = None
    return out


def module_for(workload: str, name: str) -> str:
    """The module a contender of `workload` runs (a variant, such as a router one: its base's)."""
    ext = active()
    if (module := ext.module(name)) is not None:
        return module
    name = ext.base(name)
    if workload in SINGLE_TURN:
        return SINGLE_TURN_MODULE
    if workload in WORKLOADS and WORKLOADS[workload].simulation:  # a replay: agents
        return SIMULATION_MODULE
    if bounded_concurrency(name) is not None:
        return MODULES["naive"]
    return MODULES[name]


def replica_stats(urls: Sequence[str]) -> dict[str, Any]:
    """The emulator counters summed over every replica (lags: the worst replica's)."""
    return sum_stats([collect.emulator_stats(u) for u in urls])


def run_contender(
    name: str,
    job: dict[str, Any],
    *,
    timeout: float,
    trace_urls: Sequence[str] | None = None,
) -> tuple[dict[str, Any] | None, str | None, list[list[float]]]:
    """Run one contender process; returns (client report, error, server trace).

    With `trace_urls`, the emulator's running/waiting counts (summed over the
    replicas) are sampled every 0.25 s while the contender runs:
    `[wall_s, running, waiting, busy_s]` rows that show how the contender
    loads the server.
    """
    env = child_env()
    env.setdefault("LANGSMITH_TRACING", "false")
    cmd = [sys.executable, "-m", module_for(job["workload"], name)]
    try:
        cmd, env = active().command(name, cmd, env)
    except RuntimeError as exc:
        return None, str(exc), []
    trace: list[list[float]] = []
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=out, stderr=err, text=True, env=env
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(job))
        proc.stdin.close()
        t0 = time.monotonic()
        deadline = t0 + timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                return None, f"timed out after {timeout:.0f} s", trace
            if trace_urls:
                try:
                    st = replica_stats(trace_urls)
                    trace.append(
                        [
                            round(time.monotonic() - t0, 3),
                            st.get("running", 0),
                            st.get("waiting", 0),
                            round(st.get("busy_time_s", 0.0), 3),
                        ]
                    )
                except (httpx.HTTPError, ValueError):
                    pass
            time.sleep(0.25)
        out.seek(0)
        stdout = out.read()
        err.seek(0)
        stderr = err.read()
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
            return result, None, trace
    tail = (stderr or stdout or "")[-1500:]
    return None, f"exit code {proc.returncode}, no result; output tail: {tail}", trace


def request_phases(url: str, since: float | None) -> list[list[Any]] | None:
    """The emulator's per-request phases since engine time `since`, relative to it (None: none)."""
    if since is None:
        return None
    try:
        resp = httpx.get(f"{url}/emulator/requests", params={"since": since}, timeout=30.0)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    data = resp.json()
    fields = data["fields"]
    rows = []
    for raw in data["requests"]:
        row = dict(zip(fields, raw, strict=True))
        rows.append(
            [
                row["request_id"],
                *(
                    None if row[k] is None else round(row[k] - since, 4)
                    for k in ("arrival", "first_scheduled", "first_token", "finish")
                ),
                row["preemptions"],
                row["prompt_tokens"],
                row["cached_tokens"],
                row["output_tokens"],
            ]
        )
    return rows


def shape_check(job: dict[str, Any], client: dict[str, Any]) -> dict[str, Any]:
    """Did the forced shapes hold? Answers' lengths and tool arguments, as the client saw them."""
    answers = (client.get("output_tokens") or {}).get("answer") or []
    known = [t for t in answers if t is not None]
    want = int(job["answer_tokens"])
    keys = set(job.get("tool_keys") or [])
    args = client.get("tool_args") or []
    out: dict[str, Any] = {
        "forced": bool(job.get("forced_shapes")),
        "answer_tokens_wanted": want,
        "answers": len(answers),
        "answers_with_usage": len(known),
        "answer_tokens_min": min(known) if known else None,
        "answer_tokens_max": max(known) if known else None,
        "tool_args_seen": sorted(args)[:20],
        "tool_args_valid": all(a in keys for a in args) if keys else None,
    }
    out["held"] = (
        bool(job.get("forced_shapes"))
        and all(t == want for t in known)
        and out["tool_args_valid"] is not False
    )
    return out


def _finish_entry(
    entry: dict[str, Any],
    *,
    job: dict[str, Any],
    client: dict[str, Any],
    server_delta: dict[str, float],
    phases: list[list[Any]] | None,
    scale: float,
) -> dict[str, Any]:
    events = entry.pop("events", None) or []
    sib = timeline.per_sibling(events, client.get("completions_s") or [], scale=scale)
    entry["timeline"] = sib
    entry["server_metrics_delta"] = server_delta
    entry["breakdown"] = timeline.breakdown(sib, server_delta)
    entry["server_requests"] = phases
    entry["shape"] = shape_check(job, client)
    return entry


def _log_entry(wid: str, name: str, entry: dict[str, Any], wall: float) -> None:
    log(
        f"{wid}: {name}: makespan {entry['makespan_s']:.2f} s, "
        f"p95 {entry['latency_p95_s'] or 0:.2f} s, failures {entry['failures']}, "
        f"prefill {entry['prefill_tokens_computed']}, lag {entry.get('server_lag_s')}, "
        f"CPU {entry['client_cpu_s']:.1f} s, process {wall:.1f} s"
    )


def run_workload(
    wl: Workload,
    *,
    n: int,
    contenders: Sequence[str],
    time_scale: float,
    seed: int,
    timeout: float,
    trace: bool = False,
    lgb_options: dict[str, Any] | None = None,
    target: live.ServerTarget | None = None,
    emulator_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every contender on one workload; returns the results dict.

    `emulator_options` (diagnostics) override the emulated server's config.
    """
    if target is not None:
        return _run_live(
            wl, n=n, contenders=contenders, seed=seed, timeout=timeout, target=target,
            lgb_options=lgb_options,
        )  # fmt: skip
    from langgraph_batch.emulator.config import EmulatorConfig
    from langgraph_batch.emulator.process import EmulatorProcess

    emu_kwargs: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "profile": wl.profile,
        "flavor": wl.flavor,
        "scenario": "agent",
        "time_scale": time_scale,
        "model": MODEL,
        "seed": seed,
        **emulator_settings(wl),
    }
    if wl.kv_tokens is not None:
        emu_kwargs["kv_tokens"] = wl.kv_tokens
    emu_kwargs.update(emulator_options or {})
    cfg = EmulatorConfig(**emu_kwargs)
    results: dict[str, Any] = {}
    warnings: list[str] = []
    ext = active()
    log(
        f"{wl.id}: N={n}, time scale {time_scale}, {wl.replicas} {wl.flavor} replica(s), "
        f"contenders {', '.join(contenders)}"
    )
    with ExitStack() as stack:
        urls = [stack.enter_context(EmulatorProcess(cfg)).url for _ in range(wl.replicas)]
        tool_url = stack.enter_context(tool_service(tool_config(wl, time_scale, seed)))
        for name in contenders:
            if name == BOUND:
                results[name] = ext.bound(wl, n=n, seed=seed)
                log(f"{wl.id}: ideal makespan {results[name]['makespan_s']:.2f} s (emulated)")
                continue
            for url in urls:
                collect.reset_emulator(url)
            collect.reset_tools(tool_url)
            job = make_job(
                wl,
                n=n,
                seed=seed,
                llm_url=urls,
                tool_url=tool_url,
                model=MODEL,
                contender=name,
                time_scale=time_scale,
                base=ext.base(name),
            )
            if lgb_options:
                job["lgb_options"] = lgb_options
            around = ExitStack()  # e.g. a router in front of the replicas, for this run only
            try:
                added = around.enter_context(
                    ext.around(name, job, urls=urls, profile=wl.profile, time_scale=time_scale)
                )
            except RuntimeError as exc:
                log(f"{wl.id}: {name} skipped: {exc}")
                results[name] = {"error": f"skipped: {str(exc)[:300]}"}
                continue
            load_before = os.getloadavg()
            t0 = time.monotonic()
            with around:
                client, error, samples = run_contender(
                    name, job, timeout=timeout, trace_urls=urls if trace else None
                )
            wall = time.monotonic() - t0
            if client is None:
                log(f"{wl.id}: {name} FAILED: {error}")
                results[name] = {"error": error}
                continue
            stats = replica_stats(urls)
            after: dict[str, float] = {}
            for url in urls:
                for key, value in live.metrics(url).items():
                    after[key] = after.get(key, 0.0) + value
            delta = live.metrics_delta(after, client.get("baseline_metrics") or {})
            entry = collect.combine(
                client, stats, collect.tool_stats(tool_url), time_scale=time_scale
            )
            since = (client.get("baseline_emulator") or {}).get("engine_time_s")
            phases = request_phases(urls[0], since) if len(urls) == 1 else None
            _finish_entry(
                entry, job=job, client=client, server_delta=delta, phases=phases, scale=time_scale
            )
            lag = entry.get("server_lag_s")
            if isinstance(lag, int | float) and lag > LAG_WARN_S:
                warnings.append(
                    f"{name}: the emulator fell {lag:.2f} s behind real time "
                    f"(time scale {time_scale} too small for this machine); its times are inflated"
                )
            if len(urls) > 1:
                # Raw per-replica counts (the contender's one-sibling warm-up included).
                entry["requests_per_replica"] = stats.get("per_replica_requests")
            if trace:
                entry["server_trace"] = samples
            entry.update(added)
            entry["loadavg"] = {"before": load_before, "after": os.getloadavg()}
            results[name] = entry
            _log_entry(wl.id, name, entry, wall)
    server: dict[str, Any] = {
        "url": urls[0] if len(urls) == 1 else urls,
        "emulator": True,
        "profile": wl.profile,
        "flavor": wl.flavor,
        "model": MODEL,
        "options": emulator_options or {},
    }
    return _result(wl, n, seed, time_scale, lgb_options, results, warnings, server)


def _result(
    wl: Workload,
    n: int,
    seed: int,
    time_scale: float,
    lgb_options: dict[str, Any] | None,
    results: dict[str, Any],
    warnings: list[str],
    server: dict[str, Any],
) -> dict[str, Any]:
    emulated = bool(server.get("emulator")) and not server.get("live")
    out: dict[str, Any] = {
        "workload": wl.id,
        "params": params(wl, n=n, seed=seed, time_scale=time_scale)
        | {
            "times": (
                "emulated seconds (wall seconds x time_scale)" if emulated else "wall seconds"
            ),
            "model": server.get("model"),
            "lgb_options": lgb_options or {},
            "server": server,
        },
        "versions": versions(),
        "loadavg_end": os.getloadavg(),
        "contenders": results,
    }
    out["ratios"] = report.ratios(results)
    out["goals"] = []  # the research harness evaluates the issues' goals (`finish`)
    out["warnings"] = warnings
    active().finish(out)
    return out


def _live_prompts(wl: Workload, n: int, seed: int, sizer: live.Sizer) -> tuple[str, list[str]]:
    """The shared system prompt (with a placeholder run prefix) and the tasks, in server tokens."""
    specs = [(live.run_nonce() + " " + wl.system_head, wl.system_tokens, system_rng(seed))]
    specs += [(task_head(wl, i, seed), wl.task_tokens, task_rng(seed, i)) for i in range(n)]
    texts = asyncio.run(sizer.fit_all(specs))
    return texts[0], texts[1:]


def _run_live(
    wl: Workload,
    *,
    n: int,
    contenders: Sequence[str],
    seed: int,
    timeout: float,
    target: live.ServerTarget,
    lgb_options: dict[str, Any] | None,
) -> dict[str, Any]:

    if wl.replicas > 1:
        raise ValueError(f"{wl.id} needs {wl.replicas} replicas: run it on the emulator")
    identity = live.identify(target)
    identity["live"] = True
    identity["engine_time_scale"] = live.engine_time_scale(target.base_url)
    identity["engine"] = target.engine
    log(
        f"{wl.id}: N={n} against {target.url} (version {identity['version']}, model "
        f"{target.model}, {'the emulator' if identity['emulator'] else 'not the emulator'}), "
        f"contenders {', '.join(contenders)}"
    )
    sizer = live.Sizer(target)
    system, tasks = _live_prompts(wl, n, seed, sizer)
    identity["prompt_sizing"] = sizer.method
    nonce_end = system.index(".") + 1
    results: dict[str, Any] = {}
    warnings: list[str] = []
    if sizer.method != "tokenize":
        warnings.append(f"{target.url} has no /tokenize: prompts sized at one token per word")
    with ExitStack() as stack:
        tools = tool_config(wl, 1.0, seed)
        tools = dataclasses.replace(
            tools,
            tokens_per_word=live.tool_tokens_per_word(sizer, bool(wl.tool_result_tokens_range)),
        )
        identity["tool_tokens_per_word"] = tools.tokens_per_word
        tool_url = stack.enter_context(tool_service(tools))
        ext = active()
        for name in contenders:
            if name == BOUND:
                entry = ext.bound(wl, n=n, seed=seed)
                entry["note"] += (
                    f"; the {wl.profile} cost model, not {target.url}: a reference only"
                )
                results[name] = entry
                continue
            if (refusal := ext.live_refusal(name)) is not None:
                results[name] = {"error": refusal}
                continue
            # A fresh random prefix per contender: no contender reuses another's cache.
            prompts = (live.run_nonce() + system[nonce_end:], tasks)
            collect.reset_tools(tool_url)
            job = make_job(
                wl,
                n=n,
                seed=seed,
                llm_url=target.base_url,
                tool_url=tool_url,
                model=target.model,
                contender=name,
                prompts=prompts,
                live={"flavor": target.flavor, "lgb_url": target.lgb_url},
                base=ext.base(name),
            )
            if lgb_options:
                job["lgb_options"] = lgb_options
            load_before = os.getloadavg()
            t0 = time.monotonic()
            client, error, _ = run_contender(name, job, timeout=timeout)
            wall = time.monotonic() - t0
            if client is None:
                log(f"{wl.id}: {name} FAILED: {error}")
                results[name] = {"error": error}
                continue
            delta = live.to_wall_seconds(
                live.metrics_delta(live.metrics(target.base_url), client["baseline_metrics"]),
                identity["engine_time_scale"],
            )
            entry = collect.combine_live(client, delta, collect.tool_stats(tool_url))
            since = (client.get("baseline_emulator") or {}).get("engine_time_s")
            phases = request_phases(target.base_url, since)
            _finish_entry(
                entry, job=job, client=client, server_delta=delta, phases=phases, scale=1.0
            )
            if not entry["shape"]["held"]:
                warnings.append(f"{name}: the forced shapes did not hold: {entry['shape']}")
            entry["loadavg"] = {"before": load_before, "after": os.getloadavg()}
            results[name] = entry
            _log_entry(wl.id, name, entry, wall)
    return _result(wl, n, seed, 1.0, lgb_options, results, warnings, identity)
