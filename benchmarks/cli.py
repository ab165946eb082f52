"""`langgraph-batch bench <W1|...|W6|all> [--n N] [--contenders a,b] [--time-scale X] ...`.

For each workload: start the emulator (one process per replica: W4 has 4)
and the tool service in their own processes, then run every contender one
after another, each in its own fresh process, against the same servers
(reset between contenders), and write `<out>/<workload>.json`, `.md` and `.png`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks import metrics, report
from benchmarks.contenders._common import RESULT_PREFIX, sum_stats
from benchmarks.toolservice import ROOT, ToolServiceConfig, tool_service
from benchmarks.workloads import WORKLOADS, Workload, emulator_settings, make_job, params

ALL_CONTENDERS = (
    "naive",
    "naive-bounded",
    "batchagent",
    "langgraph-batch",
    "langgraph-batch-rr",
    "ideal",
)
MODULES = {
    "naive": "benchmarks.contenders.naive",
    "naive-bounded": "benchmarks.contenders.naive",
    "langgraph-batch": "benchmarks.contenders.lgb",
    "langgraph-batch-rr": "benchmarks.contenders.lgb",
    "batchagent": "benchmarks.contenders.batchagent_runner",
}
BATCHAGENT_VENV = ROOT / "benchmarks" / ".venv-batchagent"
BATCHAGENT_SPEC = "batch-agent==0.2.0"
MODEL = "emulated-llama-3-8b"
LAG_WARN_S = 0.5


def log(msg: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def batchagent_python() -> Path:
    """The batchagent venv's python, creating the venv on first use.

    Raises:
        RuntimeError: if the venv cannot be created or batch-agent not installed.
    """
    py = BATCHAGENT_VENV / "bin" / "python"
    check = [str(py), "-c", "import batch_agent"]
    if py.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return py
    log(f"creating {BATCHAGENT_VENV} with {BATCHAGENT_SPEC} (first run only)")
    steps = [
        [sys.executable, "-m", "venv", str(BATCHAGENT_VENV)],
        [str(py), "-m", "pip", "install", "-q", BATCHAGENT_SPEC],
    ]
    # The main venv may itself have been created without pip in its base python.
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"could not set up the batchagent venv: `{shlex.join(cmd)}` failed: "
                f"{(proc.stderr or proc.stdout)[-500:]}"
            )
    if subprocess.run(check, capture_output=True).returncode != 0:
        raise RuntimeError(f"{BATCHAGENT_SPEC} installed but `import batch_agent` fails")
    return py


def versions() -> dict[str, Any]:
    """Versions of everything that shapes the numbers."""
    out: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    for dist in ("langgraph-batch", "langgraph", "langchain-core", "langchain-openai", "openai"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    out["batch-agent"] = BATCHAGENT_SPEC.split("==")[1]
    out["cpu_count"] = os.cpu_count()
    try:
        out["git_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        ).stdout.strip()
    except OSError:
        out["git_commit"] = None
    return out


def replica_stats(urls: Sequence[str]) -> dict[str, Any]:
    """The emulator counters summed over every replica (lags: the worst replica's)."""
    return sum_stats([metrics.emulator_stats(u) for u in urls])


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
    python: Path | str = sys.executable
    if name == "batchagent":
        try:
            python = batchagent_python()
        except RuntimeError as exc:
            return None, str(exc), []
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.setdefault("LANGSMITH_TRACING", "false")
    cmd = [str(python), "-m", MODULES[name]]
    trace: list[list[float]] = []
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=out, stderr=err, text=True, env=env, cwd=ROOT
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
                except Exception:
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
) -> dict[str, Any]:
    """Run every contender on one workload; returns the results dict."""
    from benchmarks.contenders import ideal
    from langgraph_batch.emulator.config import EmulatorConfig
    from langgraph_batch.emulator.process import EmulatorProcess

    # Tool latencies shrink with the emulator's clock so that ratios hold.
    tool_cfg = ToolServiceConfig(
        latency_s=wl.tool_latency_s / time_scale,
        latency_range_s=(
            None
            if wl.tool_latency_range_s is None
            else (wl.tool_latency_range_s[0] / time_scale, wl.tool_latency_range_s[1] / time_scale)
        ),
        concurrency=wl.tool_concurrency,
        result_words=wl.tool_result_words,
        seed=seed,
    )
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
    cfg = EmulatorConfig(**emu_kwargs)
    results: dict[str, Any] = {}
    warnings: list[str] = []
    log(
        f"{wl.id}: N={n}, time scale {time_scale}, {wl.replicas} {wl.flavor} replica(s), "
        f"contenders {', '.join(contenders)}"
    )
    with ExitStack() as stack:
        urls = [stack.enter_context(EmulatorProcess(cfg)).url for _ in range(wl.replicas)]
        tool_url = stack.enter_context(tool_service(tool_cfg))
        for name in contenders:
            if name == "ideal":
                results[name] = ideal.ideal(wl, n=n, seed=seed)
                log(f"{wl.id}: ideal makespan {results[name]['makespan_s']:.2f} s (emulated)")
                continue
            for url in urls:
                metrics.reset_emulator(url)
            metrics.reset_tools(tool_url)
            job = make_job(
                wl,
                n=n,
                seed=seed,
                llm_url=urls,
                tool_url=tool_url,
                model=MODEL,
                contender=name,
            )
            if lgb_options:
                job["lgb_options"] = lgb_options
            t0 = time.monotonic()
            client, error, samples = run_contender(
                name, job, timeout=timeout, trace_urls=urls if trace else None
            )
            wall = time.monotonic() - t0
            if client is None:
                log(f"{wl.id}: {name} FAILED: {error}")
                results[name] = {"error": error}
                continue
            stats = replica_stats(urls)
            entry = metrics.combine(
                client,
                stats,
                metrics.tool_stats(tool_url),
                time_scale=time_scale,
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
            else:
                entry.pop("events", None)  # the per-sibling timeline only with --trace
            results[name] = entry
            log(
                f"{wl.id}: {name}: makespan {entry['makespan_s']:.2f} s (emulated), "
                f"p95 {entry['latency_p95_s'] or 0:.2f} s, failures {entry['failures']}, "
                f"prefill {entry['prefill_tokens_computed']}, lag {entry['server_lag_s']}, "
                f"CPU {entry['client_cpu_s']:.1f} s, process {wall:.1f} s"
            )
    out: dict[str, Any] = {
        "workload": wl.id,
        "params": params(wl, n=n, seed=seed, time_scale=time_scale)
        | {
            "times": "emulated seconds (wall seconds x time_scale)",
            "model": MODEL,
            "lgb_options": lgb_options or {},
        },
        "versions": versions(),
        "contenders": results,
    }
    out["ratios"] = report.ratios(results)
    out["goals"] = report.goals(wl.id, results, n)
    out["warnings"] = warnings
    return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="langgraph-batch bench",
        description="Run benchmark workloads on the emulated server (see benchmarks/README.md).",
    )
    parser.add_argument("workload", choices=[*WORKLOADS, "all"], help="which workload to run")
    parser.add_argument("--n", type=int, default=None, help="siblings (default: the workload's)")
    parser.add_argument(
        "--contenders",
        default=None,
        help=f"comma-separated subset of {','.join(ALL_CONTENDERS)} (default: the workload's)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="emulated seconds per wall second, e.g. 4 runs 4x faster (default: the workload's)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="emulated server replicas, one process each (default: the workload's; W4: 4)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds allowed per contender run"
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="sample the emulator's running/waiting counts during each run (server_trace)",
    )
    parser.add_argument(
        "--lgb-option",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="diagnostics: a BatchedChatModel option for the langgraph-batch contender "
        "(recorded in params; reported runs use none)",
    )
    return parser.parse_args(list(argv))


def _parse_option(text: str) -> tuple[str, Any]:
    name, _, value = text.partition("=")
    try:
        return name.strip(), json.loads(value)
    except json.JSONDecodeError:
        return name.strip(), value


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    ids = list(WORKLOADS) if args.workload == "all" else [args.workload]
    if args.n is not None and args.n < 1:
        log("--n must be >= 1")
        return 2
    if args.replicas is not None and args.replicas < 1:
        log("--replicas must be >= 1")
        return 2
    if args.time_scale is not None and args.time_scale <= 0:
        log("--time-scale must be > 0")
        return 2
    chosen: list[str] | None = None
    if args.contenders:
        chosen = [c.strip() for c in args.contenders.split(",") if c.strip()]
        unknown = [c for c in chosen if c not in ALL_CONTENDERS]
        if unknown:
            log(f"unknown contender(s) {unknown}; choose from {', '.join(ALL_CONTENDERS)}")
            return 2
    written: list[dict[str, Any]] = []
    t_start = time.monotonic()
    for wid in ids:
        wl = WORKLOADS[wid]
        if args.replicas is not None:
            wl = replace(wl, replicas=args.replicas)
        result = run_workload(
            wl,
            n=args.n or wl.n,
            contenders=chosen or list(wl.contenders),
            time_scale=args.time_scale or wl.time_scale,
            seed=args.seed,
            timeout=args.timeout,
            trace=args.trace,
            lgb_options=dict(_parse_option(o) for o in args.lgb_option),
        )
        paths = report.write(result, args.out)
        written.append(result)
        sys.stdout.write(report.markdown(result) + "\n")
        log(f"{wid}: wrote {', '.join(str(p) for p in paths.values())}")
    if len(written) > 1:
        command = "langgraph-batch bench " + " ".join(sys.argv[2:] if argv is None else argv)
        summary = report.summary_markdown(written, command.strip(), dt.date.today().isoformat())
        (args.out / "SUMMARY.md").write_text(summary)
    log(f"done in {time.monotonic() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
