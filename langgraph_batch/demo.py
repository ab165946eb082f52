"""`langgraph-batch demo`: a sibling fan-out, batched, then the same job run naively.

On a machine with no GPU it starts the built-in emulator in its own process
(clearly labelled: an EMULATED vLLM server, not a GPU), runs a W1-like job
(N research agents sharing a long system prompt; each calls a web-search tool
whose arguments repeat across siblings, then answers in JSON) with
`fan_out` + `BatchedChatModel` + a coalesced tool, showing a live progress
bar, then prints a short per-sibling summary, the scheduler's statistics and
a side-by-side with the same job written the plain LangGraph way (`Send` +
`ChatOpenAI`, no concurrency control, no coalescing).

With `--backend-url URL` (any URL `backend_from_url` accepts: `vllm://host:8000`,
`sglang://host:30000`, `http(s)://host:port`) it runs against that server
instead (the model is taken from `/v1/models` unless `--model`). A server
that is really the emulator says so in its `/version` answer, and is
labelled EMULATED however it was reached. A baseline that fails is reported
as failed, never as a speed-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import operator
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Send

from langgraph_batch._demo_server import (
    EMULATOR_OUTPUT_TOKENS,
    DemoError,
    Server,
    demo_backend_url,
    probe,
    reset_server,
    server_stats,
)

__all__ = ("main",)

_SYSTEM_TOKENS = 2048
_TASK_TOKENS = 500
_ANSWER_TOKENS = EMULATOR_OUTPUT_TOKENS
_TOOL_LATENCY_S = 0.8
_TOOL_CONCURRENCY = 10
_MAX_DISTINCT_KEYS = 10
# Short words: each is one token of the emulator's tokenizer.
_WORDS: tuple[str, ...] = (
    "data", "kv", "gpu", "page", "hit", "miss", "node", "edge", "tool", "call", "turn", "plan",
    "task", "goal", "step", "fact", "test", "case", "run", "map", "sum", "list", "item", "key",
)  # fmt: skip


def _say(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _filler(n_words: int, rng: random.Random) -> str:
    return "".join(" " + rng.choice(_WORDS) for _ in range(n_words))


def _system_prompt() -> str:
    head = (
        "You are a careful research agent. Use the web_search tool to look up the key "
        "named in the task, then answer with a JSON object that matches the schema. Notes:"
    )
    return head + _filler(_SYSTEM_TOKENS - 40, random.Random("demo-system"))


def _distinct_keys(n: int) -> int:
    """How many distinct search queries N siblings ask (10 for N >= 50, as in W1)."""
    return max(1, min(_MAX_DISTINCT_KEYS, n // 5))


def _task(index: int, n: int) -> str:
    head = f"Task {index}: investigate the topic key=topic{index % _distinct_keys(n)} and report."
    return head + _filler(_TASK_TOKENS - 20, random.Random(f"demo-task-{index}"))


def _answer_schema() -> dict[str, Any]:
    # The emulator pads string fields to minLength (4 characters per token),
    # so this sizes the emulated JSON answer at about _ANSWER_TOKENS tokens.
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "Finding",
            "strict": True,
            "schema": {
                "title": "Finding",
                "type": "object",
                "properties": {
                    "summary": {"type": "string", "minLength": 4 * (_ANSWER_TOKENS - 12)},
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                },
                "required": ["summary", "confidence"],
                "additionalProperties": False,
            },
        },
    }


@dataclass(slots=True)
class _ToolService:
    """The demo's emulated external API, as in W1.

    Fixed latency, at most `concurrency` calls at once (real search APIs
    rate-limit), executions counted per query.
    """

    latency_s: float
    concurrency: int = _TOOL_CONCURRENCY
    executions: dict[str, int] = field(default_factory=dict)
    _sem: asyncio.Semaphore | None = None

    async def search(self, query: str) -> str:
        if self._sem is None:  # created in the running loop
            self._sem = asyncio.Semaphore(self.concurrency)
        async with self._sem:
            self.executions[query] = self.executions.get(query, 0) + 1
            await asyncio.sleep(self.latency_s)
        return f"Top passages for {query}: " + _filler(60, random.Random(query))

    def reset(self) -> None:
        self.executions.clear()

    @property
    def total(self) -> int:
        return sum(self.executions.values())


def _make_tool(service: _ToolService) -> BaseTool:
    async def web_search(query: str) -> str:
        """Search the web and return the most relevant passages for the query."""
        return await service.search(query)

    return StructuredTool.from_function(coroutine=web_search, name="web_search")


class _AgentState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    index: int
    answer: str
    finished_at: float


def _build_agent(llm: Any, tool_node: Any, clock: list[float]) -> Any:
    """A ReAct-style sibling: model -> (tools -> model)* -> finish."""

    async def model(state: _AgentState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    def finish(state: _AgentState) -> dict[str, Any]:
        last = state["messages"][-1]
        text = last.content if isinstance(last, AIMessage) else str(last)
        return {
            "answer": text if isinstance(text, str) else json.dumps(text),
            "finished_at": time.monotonic() - clock[0],
        }

    def route(state: _AgentState) -> str:
        return "tools" if tools_condition(dict(state)) == "tools" else "finish"

    g = StateGraph(_AgentState)
    g.add_node("model", model)
    g.add_node("tools", tool_node)
    g.add_node("finish", finish)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["tools", "finish"])
    g.add_edge("tools", "model")
    g.add_edge("finish", END)
    return g.compile(name="research_agent")


def _inputs(n: int) -> list[dict[str, Any]]:
    system = _system_prompt()
    return [
        {"messages": [SystemMessage(system), HumanMessage(_task(i, n))], "index": i}
        for i in range(n)
    ]


@dataclass(slots=True)
class _RunReport:
    label: str
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


class _BatchedState(TypedDict, total=False):
    tasks: list[dict[str, Any]]
    findings: list[Any]


async def _run_batched(
    server: Server, n: int, service: _ToolService, *, progress: bool
) -> _RunReport:
    from langgraph_batch._progress import render_progress
    from langgraph_batch.chat_model import BatchedChatModel
    from langgraph_batch.nodes.fan_out import SiblingError, fan_out
    from langgraph_batch.tools import BatchToolNode, coalesce, tool_stats

    report = _RunReport(label="langgraph-batch (fan_out + BatchedChatModel + coalesce)")
    clock = [time.monotonic()]
    search = coalesce(_make_tool(service))
    base = BatchedChatModel(
        model=server.model,
        base_url=server.url,
        api_key=server.secret,
        max_tokens=256,
        temperature=0.0,
    )
    llm = base.bind_tools([search], response_format=_answer_schema())
    agent = _build_agent(llm, BatchToolNode([search]), clock)

    builder = StateGraph(_BatchedState)
    builder.add_node(
        "research",
        fan_out(agent, items="tasks", into="findings", name="research"),
    )
    builder.add_edge(START, "research")
    builder.add_edge("research", END)
    graph = builder.compile()

    before = tool_stats()
    clock[0] = time.monotonic()
    final: dict[str, Any] = {}
    stream = graph.astream({"tasks": _inputs(n)}, stream_mode=["custom", "values"], subgraphs=True)
    chunks = render_progress(stream, stream=sys.stdout) if progress else stream
    async for chunk in chunks:
        ns, mode, data = chunk
        if not ns and mode == "values" and isinstance(data, dict):
            final = data
    report.makespan_s = time.monotonic() - clock[0]
    for i, res in enumerate(final.get("findings") or []):
        if isinstance(res, SiblingError):
            report.failures[i] = f"{res.error_type}: {res.message}"
        else:
            report.answers[i] = str(res.get("answer", ""))
            report.latencies.append(float(res.get("finished_at", report.makespan_s)))
    after = tool_stats()
    report.tool_requested = after.requested - before.requested
    report.tool_executed = service.total
    scheduler = base.get_scheduler()
    stats = scheduler.stats()
    report.scheduler = {
        "requests": stats.completed,
        "failed": stats.failed,
        "retries": stats.retries,
        "max_inflight": stats.inflight_limit,
        "slot_utilisation": stats.slot_utilisation,
        "batches": stats.batches,
        "batch_size_mean": stats.batch_size_mean,
        "batch_size_max": stats.batch_size_max,
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
        "queue_wait_p95": stats.queue_wait_p95,
    }
    await scheduler.aclose()
    return report


class _NaiveState(TypedDict, total=False):
    tasks: list[dict[str, Any]]
    findings: Annotated[list[dict[str, Any]], operator.add]


_NO_CHAT_OPENAI_SAID: list[bool] = []  # say it once, not again for the warm-up run


async def _run_naive(server: Server, n: int, service: _ToolService) -> _RunReport:
    clock = [time.monotonic()]
    search = _make_tool(service)
    llm: Any
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:  # the demo still runs: Send + BatchedChatModel, no fan_out/coalescing
        from langgraph_batch.chat_model import BatchedChatModel

        label = "plain Send + BatchedChatModel (langchain-openai not installed)"
        if not _NO_CHAT_OPENAI_SAID:
            _NO_CHAT_OPENAI_SAID.append(True)
            _say(
                "langchain-openai is not installed: the plain-LangGraph baseline calls the "
                "server through BatchedChatModel instead of ChatOpenAI. For the real baseline: "
                "pip install 'langgraph-batch[demo]'"
            )
        llm = BatchedChatModel(
            model=server.model, base_url=server.url, api_key=server.secret, max_tokens=256
        )
    else:
        label = "plain LangGraph (Send + ChatOpenAI + ToolNode)"
        # ChatOpenAI speaks plain HTTP(S): give it the first endpoint's http(s) root.
        llm = ChatOpenAI(  # type: ignore[call-arg]
            model=server.model,
            base_url=server.http_base + "/v1",
            api_key=server.api_key or "not-needed",  # type: ignore[arg-type]
            max_tokens=256,
            temperature=0.0,
        )
    report = _RunReport(label=label)
    bound = llm.bind_tools([search], response_format=_answer_schema(), strict=True)
    agent = _build_agent(bound, ToolNode([search]), clock)

    async def run_one(state: _AgentState) -> dict[str, Any]:
        out = await agent.ainvoke(state)
        return {"findings": [{"index": state["index"], **out}]}

    def fan(state: _NaiveState) -> list[Send]:
        return [Send("agent", task) for task in state["tasks"]]

    builder = StateGraph(_NaiveState)
    builder.add_node("agent", run_one)
    builder.add_conditional_edges(START, fan, ["agent"])
    builder.add_edge("agent", END)
    graph = builder.compile()
    clock[0] = time.monotonic()
    try:
        final = await graph.ainvoke({"tasks": _inputs(n)})
    except Exception as exc:  # a bare Send fan-out fails as a whole on the first error
        report.error = f"{type(exc).__name__}: {exc}"
        final = {}
    report.makespan_s = time.monotonic() - clock[0]
    for res in final.get("findings") or []:
        report.answers[int(res["index"])] = str(res.get("answer", ""))
        report.latencies.append(float(res.get("finished_at", report.makespan_s)))
    for i in range(n):
        if i not in report.answers:
            report.failures[i] = report.error or "no result"
    report.tool_requested = sum(
        len(getattr(m, "tool_calls", None) or [])
        for r in final.get("findings") or []
        for m in r["messages"]
    )
    report.tool_executed = service.total
    return report


def _print_summary(report: _RunReport, n: int, keys: dict[int, str]) -> None:
    ok = len(report.answers)
    _say(f"Results: {ok}/{n} siblings answered, {len(report.failures)} failed.")
    for i in sorted(report.answers)[:5]:
        answer = report.answers[i].replace("\n", " ")
        if len(answer) > 70:
            answer = answer[:67] + "..."
        _say(f"  #{i:<3} {keys[i]:<8} {answer}")
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
        f"retries {s.get('retries')}), in-flight limit {s.get('max_inflight')}, "
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


def _side_by_side(batched: _RunReport, naive: _RunReport, scale: float) -> None:
    rows: list[tuple[str, str, str]] = []

    def fmt_s(v: float) -> str:
        return "-" if math.isnan(v) else f"{v * scale:.2f} s"

    def hit(r: _RunReport) -> str:
        p = r.server.get("prompt_tokens_received") or 0
        c = r.server.get("cached_tokens") or 0
        return f"{100 * c / p:.0f}%" if p else "-"

    rows.append(("makespan", fmt_s(batched.makespan_s), fmt_s(naive.makespan_s)))
    rows.append(
        (
            "p95 sibling latency",
            fmt_s(_pct(batched.latencies, 0.95)),
            fmt_s(_pct(naive.latencies, 0.95)),
        )
    )
    rows.append(
        (
            "first result",
            fmt_s(min(batched.latencies, default=math.nan)),
            fmt_s(min(naive.latencies, default=math.nan)),
        )
    )
    rows.append(("siblings failed", str(len(batched.failures)), str(len(naive.failures))))
    rows.append(
        (
            "LLM requests",
            str(batched.server.get("requests", batched.scheduler.get("requests", "-"))),
            str(naive.server.get("requests", "-")),
        )
    )
    rows.append(
        (
            "tool calls requested/executed",
            f"{batched.tool_requested}/{batched.tool_executed}",
            f"{naive.tool_requested}/{naive.tool_executed}",
        )
    )
    if batched.server and naive.server:
        rows.append(
            (
                "prefill tokens computed",
                f"{batched.server.get('prefill_tokens_computed', 0):,}",
                f"{naive.server.get('prefill_tokens_computed', 0):,}",
            )
        )
        rows.append(("prefix cache hit rate", hit(batched), hit(naive)))
        rows.append(
            (
                "preemptions",
                str(batched.server.get("preemptions", 0)),
                str(naive.server.get("preemptions", 0)),
            )
        )
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len("langgraph-batch"), *(len(r[1]) for r in rows))
    _say(f"  {'':<{w0}}  {'langgraph-batch':>{w1}}  {'plain LangGraph':>16}")
    for name, a, b in rows:
        _say(f"  {name:<{w0}}  {a:>{w1}}  {b:>16}")
    if batched.makespan_s > 0 and naive.makespan_s > 0:
        _say(f"  speed-up: {naive.makespan_s / batched.makespan_s:.2f}x")


async def _demo(args: argparse.Namespace) -> int:
    n: int = args.n
    keys = {i: f"topic{i % _distinct_keys(n)}" for i in range(n)}
    api_key = args.api_key or os.environ.get("LGB_API_KEY") or os.environ.get("OPENAI_API_KEY")
    with demo_backend_url(args.backend_url, time_scale=args.time_scale) as url:
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
        service = _ToolService(latency_s=_TOOL_LATENCY_S / scale)
        _say(
            f"Job: {n} research agents, shared {_SYSTEM_TOKENS}-token system prompt, "
            f"{_TASK_TOKENS}-token tasks, web_search tool ({_TOOL_LATENCY_S * 1000:.0f} ms, "
            f"{_distinct_keys(n)} distinct queries, at most {_TOOL_CONCURRENCY} at once), "
            f"JSON answer. Model {server.model}."
        )
        # Warm both stacks up (imports, clients, graph compilation) with one
        # sibling each, so neither run is charged one-time start-up costs.
        await _run_batched(server, 1, service, progress=False)
        if not args.skip_naive:
            await _run_naive(server, 1, service)
        service.reset()
        _say("")
        _say("1) langgraph-batch: fan_out + BatchedChatModel + coalesced tool")
        await reset_server(server)
        batched = await _run_batched(server, n, service, progress=not args.no_progress)
        batched.server = await server_stats(server)
        _print_summary(batched, n, keys)
        _print_stats(batched)
        code = 0 if not batched.failures else 1
        if args.skip_naive:
            return code
        _say("")
        _say("2) the same job, plain LangGraph: Send + ChatOpenAI + ToolNode, no limits")
        await reset_server(server)
        service.reset()
        naive = await _run_naive(server, n, service)
        naive.server = await server_stats(server)
        if naive.error or naive.failures:
            # A baseline that failed measured nothing: no speed-up to report.
            _say(f"   BASELINE FAILED: {len(naive.answers)}/{n} answered")
            _say(f"   {(naive.error or next(iter(naive.failures.values())))[:300]}")
            _say("   No comparison is reported: the plain LangGraph run did not complete.")
            return code or 3
        _say(f"   done: {n}/{n} answered")
        _say("")
        _say("Side by side" + (" (emulated seconds)" if server.emulated else "") + ":")
        _side_by_side(batched, naive, scale)
    return code


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
            "Fan out N research agents through langgraph-batch, then run the same job "
            "naively, against the built-in emulator (default) or a real server."
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
        return asyncio.run(_demo(args))
    except KeyboardInterrupt:
        return 130
    except DemoError as exc:
        sys.stderr.write(f"langgraph-batch demo: {exc}\n")
        return exc.code
    except Exception as exc:  # one line, no traceback: the demo is a user's first contact
        sys.stderr.write(f"langgraph-batch demo failed: {type(exc).__name__}: {exc}\n")
        return 1
