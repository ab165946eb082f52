"""`langgraph-batch demo` (`make demo`): the benchmark's W1 job, batched, then the plain way.

An application built from the benchmark's parts, not library code: the job
is W1 (`workloads`: N research agents sharing a 2,048-token
system prompt, each calling a `web_search` tool whose queries repeat across
siblings, then answering in JSON) scaled to `--n`; the tool is the
benchmark's tool service (`toolservice`: 800 ms, at most 10 calls
at once, executions counted); the two runs are the benchmark's contenders,
built by their own code: `langgraph-batch` (`contenders.lgb`:
`fan_out` + `BatchedChatModel` + a coalesced tool) and `naive`
(`contenders.naive`: `Send` + `ChatOpenAI` + `ToolNode`, no
limits). The demo adds what a first look needs: a live progress bar, a short
per-sibling summary, the scheduler's statistics, a side-by-side.

On a machine with no GPU it starts the built-in emulator in its own process
(clearly labelled: an EMULATED vLLM server, not a GPU). With `--backend-url
URL` (any URL `backend_from_url` accepts: `vllm://host:8000`,
`sglang://host:30000`, `http(s)://host:port`) it runs against that server
instead (the model is taken from `/v1/models` unless `--model`). A server
that is really the emulator says so in its `/version` answer, and is labelled
EMULATED however it was reached. A baseline that fails is reported as
failed, never as a speed-up.

Needs the `demo` extra (`pip install 'langgraph-batch[demo]'`): the emulator, the
tool service and ChatOpenAI.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from langgraph_batch.bench.contenders import (
    RECORDER,
    bind,
    lgb,
    make_http_client,
    make_tools,
    naive,
    warmup_job,
)
from langgraph_batch.bench.demo_server import (
    W1,
    DemoError,
    Server,
    demo_backend_url,
    probe,
    reset_server,
    server_stats,
)
from langgraph_batch.bench.toolservice import tool_service
from langgraph_batch.bench.workloads import make_job, tool_config

__all__ = ("main",)

_SEED = 0


def _say(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _workload(n: int) -> Any:
    """W1 at N siblings: 10 distinct queries from N = 50 up, N // 5 below (coalescing shows)."""
    return dataclasses.replace(W1, n=n, distinct_keys=max(1, min(10, n // 5)))


@dataclass(slots=True)
class _RunReport:
    makespan_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    answers: dict[int, str] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    tool_requested: int = 0
    tool_executed: int = 0
    server: dict[str, Any] = field(default_factory=dict)
    scheduler: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _pct(values: Sequence[float], q: float) -> float:
    data = sorted(values)
    if not data:
        return math.nan
    pos = (len(data) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


async def _tool_calls(job: dict[str, Any], *, reset: bool = False) -> int:
    """Executions the tool service counted (then zeroed, with `reset`)."""
    async with httpx.AsyncClient(timeout=10.0) as client:
        executed = int((await client.get(job["tool_url"] + "/stats")).json()["executions"])
        if reset:
            await client.post(job["tool_url"] + "/reset")
    return executed


def _start() -> None:
    RECORDER.clear()
    RECORDER.t0 = time.monotonic()


def _finish(report: _RunReport, n: int, answers: dict[int, str]) -> None:
    report.makespan_s = time.monotonic() - RECORDER.t0
    report.answers = answers
    report.latencies = [RECORDER.completions[i] for i in answers if i in RECORDER.completions]
    for i in range(n):
        if i not in answers:
            report.failures[i] = RECORDER.errors.get(i) or report.error or "no result"
    report.tool_requested = RECORDER.tool_calls_requested


async def _run_batched(job: dict[str, Any], client: Any, *, progress: bool) -> _RunReport:
    """The `langgraph-batch` contender's graph, streamed through the progress bar."""
    from langgraph_batch._observe.progress import render_progress
    from langgraph_batch.nodes import SiblingError
    from langgraph_batch.tools import coalesce

    report = _RunReport()
    tools = [coalesce(t) for t in make_tools(job, client)]
    base = lgb.make_llm(job)
    graph = lgb.build(job, bind(base, tools, job), tools)
    n = len(job["tasks"])
    _start()
    final: dict[str, Any] = {}
    stream = graph.astream(
        {"tasks": [{"index": i} for i in range(n)]},
        {"recursion_limit": 10_000},
        stream_mode=["custom", "values"],
        subgraphs=True,
    )
    chunks = render_progress(stream, stream=sys.stdout) if progress else stream
    async for ns, mode, data in chunks:
        if not ns and mode == "values" and isinstance(data, dict):
            final = data
    answers: dict[int, str] = {}
    for i, res in enumerate(final.get("results") or []):
        if isinstance(res, SiblingError):
            RECORDER.failed(i, f"{res.error_type}: {res.message}")
        else:
            answers[i] = str(res)
    _finish(report, n, answers)
    scheduler = base.get_scheduler()
    stats = scheduler.stats()
    report.scheduler = {
        "requests": stats.completed,
        "failed": stats.failed,
        "retries": stats.retries,
        "inflight_limit": stats.inflight_limit,
        "slot_utilisation": stats.slot_utilisation,
        "batches": stats.batches,
        "batch_size_mean": stats.batch_size_mean,
        "batch_size_max": stats.batch_size_max,
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
    }
    await scheduler.aclose()
    return report


_NO_CHAT_OPENAI_SAID: list[bool] = []  # say it once, not again for the warm-up run


def _naive_llm(job: dict[str, Any]) -> tuple[Any, str]:
    """ChatOpenAI as the `naive` contender makes it; BatchedChatModel without langchain-openai."""
    try:
        import langchain_openai  # noqa: F401
    except ImportError:  # the demo still runs: Send + BatchedChatModel, no fan_out/coalescing
        if not _NO_CHAT_OPENAI_SAID:
            _NO_CHAT_OPENAI_SAID.append(True)
            _say(
                "langchain-openai is not installed: the plain-LangGraph baseline calls the "
                "server through BatchedChatModel instead of ChatOpenAI. For the real baseline: "
                "pip install 'langgraph-batch[demo]'"
            )
        return lgb.make_llm(job), "plain Send + BatchedChatModel (langchain-openai not installed)"
    return naive.make_llm(job), "plain LangGraph (Send + ChatOpenAI + ToolNode)"


async def _run_naive(job: dict[str, Any], client: Any, llm: Any) -> _RunReport:
    """The `naive` contender's graph: a bare `Send` fan-out fails as a whole on a first error."""
    report = _RunReport()
    tools = make_tools(job, client)
    graph = naive.build(job, bind(llm, tools, job), tools)
    n = len(job["tasks"])
    _start()
    final: dict[str, Any] = {}
    try:
        final = await graph.ainvoke(
            {"tasks": [{"index": i} for i in range(n)], "results": []},
            {"recursion_limit": 10_000},
        )
    except Exception as exc:
        report.error = f"{type(exc).__name__}: {exc}"
    answers = {int(r["index"]): str(r.get("answer", "")) for r in final.get("results") or []}
    _finish(report, n, answers)
    return report


def _print_summary(report: _RunReport, wl: Any) -> None:
    ok, n = len(report.answers), wl.n
    _say(f"Results: {ok}/{n} siblings answered, {len(report.failures)} failed.")
    for i in sorted(report.answers)[:5]:
        answer = report.answers[i].replace("\n", " ")
        if len(answer) > 70:
            answer = answer[:67] + "..."
        _say(f"  #{i:<3} key={wl.key(i):<5} {answer}")
    if ok > 5:
        _say(f"  ... and {ok - 5} more")
    for i, err in sorted(report.failures.items())[:3]:
        _say(f"  #{i:<3} FAILED: {err[:100]}")


def _print_stats(report: _RunReport) -> None:
    s = report.scheduler
    server = report.server
    _say("Scheduler stats:")
    _say(
        f"  LLM requests: {s.get('requests')} (failed {s.get('failed')}, "
        f"retries {s.get('retries')}), in-flight limit {s.get('inflight_limit')}, "
        f"slot utilisation {100 * float(s.get('slot_utilisation') or 0):.0f}%"
    )
    if s.get("batches"):
        _say(
            f"  HTTP batches: {s['batches']}, mean size {s['batch_size_mean']:.1f}, "
            f"max {s['batch_size_max']}"
        )
    else:
        _say("  HTTP batches: none (agent turns with tools go out as single requests)")
    _say(f"  tool calls: {report.tool_requested} requested, {report.tool_executed} executed")
    prompt = int(s.get("prompt_tokens") or 0)
    cached = int(s.get("cached_tokens") or 0)
    if prompt:
        _say(
            f"  prefix cache: {cached:,} of {prompt:,} prompt tokens cached "
            f"({100 * cached / prompt:.0f}%)"
        )
    if server:
        _say(
            f"  server: {server.get('prefill_tokens_computed', 0):,} prefill tokens computed, "
            f"{server.get('preemptions', 0)} preemptions"
        )


def _side_by_side(batched: _RunReport, plain: _RunReport, scale: float) -> None:
    def fmt_s(v: float) -> str:
        return "-" if math.isnan(v) else f"{v * scale:.2f} s"

    def hit(r: _RunReport) -> str:
        p = r.server.get("prompt_tokens_received") or 0
        c = r.server.get("cached_tokens") or 0
        return f"{100 * c / p:.0f}%" if p else "-"

    rows: list[tuple[str, str, str]] = [
        ("makespan", fmt_s(batched.makespan_s), fmt_s(plain.makespan_s)),
        (
            "p95 sibling latency",
            fmt_s(_pct(batched.latencies, 0.95)),
            fmt_s(_pct(plain.latencies, 0.95)),
        ),
        (
            "first result",
            fmt_s(min(batched.latencies, default=math.nan)),
            fmt_s(min(plain.latencies, default=math.nan)),
        ),
        ("siblings failed", str(len(batched.failures)), str(len(plain.failures))),
        (
            "LLM requests",
            str(batched.server.get("requests", batched.scheduler.get("requests", "-"))),
            str(plain.server.get("requests", "-")),
        ),
        (
            "tool calls requested/executed",
            f"{batched.tool_requested}/{batched.tool_executed}",
            f"{plain.tool_requested}/{plain.tool_executed}",
        ),
    ]
    if batched.server and plain.server:
        rows += [
            (
                "prefill tokens computed",
                f"{batched.server.get('prefill_tokens_computed', 0):,}",
                f"{plain.server.get('prefill_tokens_computed', 0):,}",
            ),
            ("prefix cache hit rate", hit(batched), hit(plain)),
            (
                "preemptions",
                str(batched.server.get("preemptions", 0)),
                str(plain.server.get("preemptions", 0)),
            ),
        ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len("langgraph-batch"), *(len(r[1]) for r in rows))
    _say(f"  {'':<{w0}}  {'langgraph-batch':>{w1}}  {'plain LangGraph':>16}")
    for name, a, b in rows:
        _say(f"  {name:<{w0}}  {a:>{w1}}  {b:>16}")
    if batched.makespan_s > 0 and plain.makespan_s > 0:
        _say(f"  speed-up: {plain.makespan_s / batched.makespan_s:.2f}x")


def _job(wl: Any, server: Server, tool_url: str) -> dict[str, Any]:
    """The contenders' job for this server: W1 at N, the URL as given, the key if any."""
    job = make_job(
        wl,
        n=wl.n,
        seed=_SEED,
        llm_url=server.http_base,
        tool_url=tool_url,
        model=server.model,
        contender="langgraph-batch",
    )
    job["lgb_url"] = server.url  # BatchedChatModel takes the URL as the user gave it
    job["api_key"] = server.api_key
    return job


async def _demo(args: argparse.Namespace, url: str) -> int:
    wl = _workload(args.n)
    api_key = args.api_key or os.environ.get("LGB_API_KEY") or os.environ.get("OPENAI_API_KEY")
    server = await probe(url, api_key=api_key, model=args.model)
    scale = server.time_scale
    if server.emulated:
        engine = "SGLang" if server.flavor == "sglang" else "vLLM"
        where = f" at {url}" if args.backend_url else ""
        _say(
            f"EMULATED {engine} ({server.profile} profile, time scale {scale:g}){where}"
            f" — not a real GPU. Times below are emulated seconds."
        )
    else:
        _say(f"Real inference server at {url}")
    _say(
        f"Job: the benchmark's W1 at N={wl.n}: research agents, shared {wl.system_tokens}-token "
        f"system prompt, {wl.task_tokens}-token tasks, web_search tool "
        f"({wl.tool_latency_s * 1000:.0f} ms, {wl.distinct_keys} distinct queries, at most "
        f"{wl.tool_concurrency} at once), JSON answer. Model {server.model}."
    )
    # The tool's latency follows the emulator's clock, so that ratios hold.
    with tool_service(tool_config(wl, scale, _SEED)) as tool_url:
        return await _compare(args, wl, server, _job(wl, server, tool_url))


async def _compare(args: argparse.Namespace, wl: Any, server: Server, job: dict[str, Any]) -> int:
    client = make_http_client()
    try:
        # Warm both stacks up (imports, clients, graph compilation) with one
        # sibling each, so neither run is charged one-time start-up costs.
        await _run_batched(warmup_job(job), client, progress=False)
        naive_llm, naive_label = (None, "") if args.skip_naive else _naive_llm(job)
        if not args.skip_naive:
            await _run_naive(warmup_job(job), client, naive_llm)
        await _tool_calls(job, reset=True)
        _say("")
        _say("1) langgraph-batch: fan_out + BatchedChatModel + coalesced tool")
        await reset_server(server)
        batched = await _run_batched(job, client, progress=not args.no_progress)
        batched.tool_executed = await _tool_calls(job, reset=True)
        batched.server = await server_stats(server)
        _print_summary(batched, wl)
        _print_stats(batched)
        code = 0 if not batched.failures else 1
        if args.skip_naive:
            return code
        _say("")
        _say(f"2) the same job, {naive_label}, no limits")
        await reset_server(server)
        plain = await _run_naive(job, client, naive_llm)
        plain.tool_executed = await _tool_calls(job, reset=True)
        plain.server = await server_stats(server)
    finally:
        await client.aclose()
    if plain.error or plain.failures:
        # A baseline that failed measured nothing: no speed-up to report.
        _say(f"   BASELINE FAILED: {len(plain.answers)}/{wl.n} answered")
        _say(f"   {(plain.error or next(iter(plain.failures.values())))[:300]}")
        _say("   No comparison is reported: the plain LangGraph run did not complete.")
        return code or 3
    _say(f"   done: {wl.n}/{wl.n} answered")
    _say("")
    _say("Side by side" + (" (emulated seconds)" if server.emulated else "") + ":")
    _side_by_side(batched, plain, server.time_scale)
    return code


def _run(args: argparse.Namespace) -> int:
    with demo_backend_url(args.backend_url, time_scale=args.time_scale) as url:
        return asyncio.run(_demo(args, url))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns the exit code.

    0: every sibling of both runs answered; 1: a langgraph-batch sibling
    failed (or the run raised); 2: bad options, or the server cannot be
    used; 3: the plain LangGraph baseline failed (no comparison printed);
    130: interrupted.
    """
    parser = argparse.ArgumentParser(
        prog="langgraph-batch demo",
        description=(
            "Fan out N research agents (the benchmark's W1) through langgraph-batch, then "
            "run the same job the plain LangGraph way, against the built-in emulator "
            "(default) or a real server."
        ),
        epilog=(
            "exit codes: 0 ok; 1 a langgraph-batch sibling failed; 2 bad options or "
            "unreachable server; 3 the plain LangGraph baseline failed"
        ),
    )
    parser.add_argument("--n", type=int, default=50, help="number of sibling agents (default 50)")
    parser.add_argument(
        "--backend-url",
        default=None,
        help=(
            "a server URL as backend_from_url accepts it: vllm://host:8000, "
            "sglang://host:30000, http(s)://host:port (default: start the emulator)"
        ),
    )
    parser.add_argument("--model", default=None, help="model name (default: the server's first)")
    parser.add_argument(
        "--api-key",
        default=None,
        help="the server's API key (default: $LGB_API_KEY, then $OPENAI_API_KEY)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=4.0,
        help="emulator speed: emulated seconds per wall second (default 4)",
    )
    parser.add_argument("--skip-naive", action="store_true", help="skip the naive comparison run")
    parser.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.n < 1:
        parser.error("--n must be >= 1")
    if args.time_scale <= 0:
        parser.error("--time-scale must be > 0")
    try:
        return _run(args)
    except KeyboardInterrupt:
        return 130
    except DemoError as exc:
        sys.stderr.write(f"langgraph-batch demo: {exc}\n")
        return exc.code
    except Exception as exc:  # one line, no traceback: the demo is a user's first contact
        sys.stderr.write(f"langgraph-batch demo failed: {type(exc).__name__}: {exc}\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
