"""`langgraph-batch demo`: a sibling fan-out, batched, then the same job run naively.

On a machine with no GPU it starts the built-in emulator in its own process
(clearly labelled: an EMULATED vLLM server, not a GPU), runs a W1-like job
(N research agents sharing a long system prompt; each calls a web-search tool
whose arguments repeat across siblings, then answers in JSON) with
`fan_out` + `BatchedChatModel` + a coalesced tool, showing a live progress
bar, then prints a short per-sibling summary, the scheduler's statistics and
a side-by-side with the same job written the plain LangGraph way (`Send` +
`ChatOpenAI`, no concurrency control, no coalescing).

With `--backend-url http://host:port` it runs against a real vLLM or SGLang
server instead (the model is taken from `/v1/models` unless `--model`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import operator
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import httpx
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Send

__all__ = ("main",)

_PROFILE = "h100-llama3-8b"
_SYSTEM_TOKENS = 2048
_TASK_TOKENS = 500
_ANSWER_TOKENS = 200
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
    url: str, model: str, n: int, service: _ToolService, *, progress: bool
) -> _RunReport:
    from langgraph_batch._progress import render_progress
    from langgraph_batch.chat_model import BatchedChatModel
    from langgraph_batch.nodes.fan_out import SiblingError, fan_out
    from langgraph_batch.tools import BatchToolNode, coalesce, tool_stats

    report = _RunReport(label="langgraph-batch (fan_out + BatchedChatModel + coalesce)")
    clock = [time.monotonic()]
    search = coalesce(_make_tool(service))
    base = BatchedChatModel(
        model_name=model, base_url=_vllm_url(url), max_tokens=256, temperature=0.0
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
        "max_inflight": stats.max_inflight,
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


async def _run_naive(url: str, model: str, n: int, service: _ToolService) -> _RunReport:
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
        llm = BatchedChatModel(model_name=model, base_url=_vllm_url(url), max_tokens=256)
    else:
        label = "plain LangGraph (Send + ChatOpenAI + ToolNode)"
        llm = ChatOpenAI(  # type: ignore[call-arg]
            model=model,
            base_url=url.rstrip("/") + "/v1",
            api_key="not-needed",  # type: ignore[arg-type]
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


def _vllm_url(url: str) -> str:
    """`http://host:port[/v1]` -> `vllm://host:port` (the backend with vLLM's extras)."""
    rest = url.split("://", 1)[-1].rstrip("/")
    if rest.endswith("/v1"):
        rest = rest[:-3]
    return f"vllm://{rest}"


def _server_stats(url: str, emulated: bool) -> dict[str, Any]:
    if not emulated:
        return {}
    try:
        data: dict[str, Any] = httpx.get(f"{url}/emulator/stats", timeout=10.0).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return data


def _reset_server(url: str, emulated: bool) -> None:
    if emulated:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{url}/emulator/reset", timeout=10.0)


def _first_model(url: str) -> str:
    resp = httpx.get(f"{url.rstrip('/')}/v1/models", timeout=10.0)
    resp.raise_for_status()
    models = resp.json().get("data") or []
    if not models:
        raise RuntimeError(f"{url}/v1/models lists no model; pass --model")
    return str(models[0]["id"])


@contextlib.contextmanager
def _backend(args: argparse.Namespace) -> Iterator[tuple[str, bool]]:
    """Yields (base URL without /v1, emulated?)."""
    if args.backend_url:
        url = args.backend_url.rstrip("/")
        if url.endswith("/v1"):
            url = url[:-3]
        yield url, False
        return
    try:
        from langgraph_batch.emulator.config import EmulatorConfig
        from langgraph_batch.emulator.process import EmulatorProcess
    except ImportError:  # the optional `emulator` extra (part of `demo`)
        from langgraph_batch._extras import missing_extra

        raise missing_extra(
            "demo",
            "the demo's built-in emulator needs starlette and uvicorn "
            "(or pass --backend-url to use your own server)",
        ) from None

    cfg = EmulatorConfig(
        port=0,
        profile=_PROFILE,
        time_scale=args.time_scale,
        turns=2,
        output_tokens=_ANSWER_TOKENS,
        model="emulated-llama-3-8b",
    )
    with EmulatorProcess(cfg) as emu:
        yield emu.url, True


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
    with _backend(args) as (url, emulated):
        scale = args.time_scale if emulated else 1.0
        if emulated:
            _say(
                f"EMULATED vLLM ({_PROFILE} profile, time scale {scale:g}) — not a real GPU. "
                f"Times below are emulated seconds."
            )
        else:
            _say(f"Real inference server at {url}")
        model = args.model or ("emulated-llama-3-8b" if emulated else _first_model(url))
        service = _ToolService(latency_s=_TOOL_LATENCY_S / scale)
        _say(
            f"Job: {n} research agents, shared {_SYSTEM_TOKENS}-token system prompt, "
            f"{_TASK_TOKENS}-token tasks, web_search tool ({_TOOL_LATENCY_S * 1000:.0f} ms, "
            f"{_distinct_keys(n)} distinct queries, at most {_TOOL_CONCURRENCY} at once), "
            f"JSON answer. Model {model}."
        )
        # Warm both stacks up (imports, clients, graph compilation) with one
        # sibling each, so neither run is charged one-time start-up costs.
        await _run_batched(url, model, 1, service, progress=False)
        await _run_naive(url, model, 1, service)
        service.reset()
        _say("")
        _say("1) langgraph-batch: fan_out + BatchedChatModel + coalesced tool")
        _reset_server(url, emulated)
        batched = await _run_batched(url, model, n, service, progress=not args.no_progress)
        batched.server = _server_stats(url, emulated)
        _print_summary(batched, n, keys)
        _print_stats(batched)
        if args.skip_naive:
            return 0 if not batched.failures else 1
        _say("")
        _say("2) the same job, plain LangGraph: Send + ChatOpenAI + ToolNode, no limits")
        _reset_server(url, emulated)
        service.reset()
        naive = await _run_naive(url, model, n, service)
        naive.server = _server_stats(url, emulated)
        _say(
            f"   done: {len(naive.answers)}/{n} answered"
            + (f" (run failed: {naive.error[:100]})" if naive.error else "")
        )
        _say("")
        _say("Side by side" + (" (emulated seconds)" if emulated else "") + ":")
        _side_by_side(batched, naive, scale)
    return 0 if not batched.failures else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns the exit code (0: every batched sibling answered)."""
    parser = argparse.ArgumentParser(
        prog="langgraph-batch demo",
        description=(
            "Fan out N research agents through langgraph-batch, then run the same job "
            "naively, against the built-in emulator (default) or a real server."
        ),
    )
    parser.add_argument("--n", type=int, default=50, help="number of sibling agents (default 50)")
    parser.add_argument(
        "--backend-url",
        default=None,
        help="a real vLLM/SGLang server, e.g. http://127.0.0.1:8000 (default: start the emulator)",
    )
    parser.add_argument("--model", default=None, help="model name (default: the server's first)")
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
