"""Chaos: 200 fan_out ReAct siblings against a faulty, killed and restarted emulator.

Each round runs N=200 siblings (4 concurrent fan_out runs of 50; a prebuilt
ReAct agent with a coalesced lookup tool) against an emulator process that
faults about 35% of requests with every fault it knows (429 with Retry-After,
500, 503, a dropped connection, a truncated response or stream, malformed
tool arguments, a slow first token). Meanwhile:

- random in-flight model calls are cancelled at random points (queued in the
  scheduler, waiting for a connection, mid-stream), the way an
  `asyncio.timeout` around a call cancels it; the agent then asks again, or,
  when part of a stream had already reached it, gives up (`ChaosGaveUp`);
- a few whole runs are cancelled and started again;
- in the first round the server is SIGKILLed mid-run and restarted on its port.

Rounds repeat until 1,000 cancellations were made. Every sibling is then
checked against what the emulator's deterministic scenario answers for it
(its own tool call, its own tool result, its own final answer), and the
figures are computed Jepsen-style:

| figure | meaning | must be |
| --- | --- | --- |
| lost | a sibling with neither a result nor an error | 0 |
| silently wrong | reported successful, but not its own correct answer | 0 |
| hung | siblings of runs that did not finish in time | 0 |
| leaked tasks | asyncio tasks left after the scheduler closed | 0 |
| leaked connections | busy connections, or requests holding one, once idle | 0 |
| recovered by retry | correct siblings that needed a scheduler retry to get there | reported |
| failed typed | siblings failed with a library error (or gave up mid-stream) | reported |

The table is printed and written to `chaos_figures.json` under pytest's tmp dir.
Run alone with `pytest -m chaos` (or `make chaos`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import operator
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models.chat_models import agenerate_from_stream
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph

from langgraph_batch import errors as lgb_errors
from langgraph_batch._context import current_sibling
from langgraph_batch.backends.openai_compat import OpenAICompatibleBackend
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.emulator import FAULTS, EmulatorConfig
from langgraph_batch.emulator.scenarios import ScenarioOptions, plan_chat
from langgraph_batch.nodes import SiblingError, fan_out
from langgraph_batch.scheduler import BatchPolicy, RetryPolicy
from langgraph_batch.tools import BatchToolNode, coalesce
from tests.chaos.conftest import KillableEmulator

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:create_react_agent has been moved"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

MODEL = "emulated-llama-3-8b"
N = 200
RUNS = 4
KEYS = 20
OUTPUT_TOKENS = 12
CANCELS = 1000
FAULT_RATE = 0.35
SEED = 7
TYPED = set(lgb_errors.__all__) | {"ChaosGaveUp"}


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"debug": False})


class ChaosGaveUp(Exception):
    """The caller cancelled its call after part of a stream had reached it."""


class _Entry:
    __slots__ = ("cm", "waiting")

    def __init__(self) -> None:
        self.cm: asyncio.Timeout | None = None
        self.waiting = False


class Chaos:
    """The canceller's view of the model calls in flight, and what it did."""

    def __init__(self) -> None:
        self.entries: set[_Entry] = set()
        self.call_cancels = 0
        self.run_cancels = 0
        self.reasked = 0
        self.gave_up = 0
        self.calls_done = 0

    @property
    def cancels(self) -> int:
        return self.call_cancels + self.run_cancels

    def cancel_one(self, rng: random.Random) -> bool:
        waiting = [e for e in self.entries if e.waiting and e.cm is not None]
        if not waiting:
            return False
        victim = rng.choice(sorted(waiting, key=id))
        assert victim.cm is not None
        victim.cm.reschedule(asyncio.get_running_loop().time())
        victim.waiting = False
        self.call_cancels += 1
        return True


CHAOS = Chaos()


class ChaosModel(BatchedChatModel):
    """BatchedChatModel whose calls the chaos driver can cancel; a quarter of siblings stream."""

    async def _agenerate(
        self,
        messages: list[Any],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        sibling = current_sibling()
        if sibling is not None and sibling.index % 4 == 1:
            return await agenerate_from_stream(self._chaos_stream(messages, stop, **kwargs))
        while True:
            entry = _Entry()
            CHAOS.entries.add(entry)
            try:
                entry.cm = asyncio.timeout(None)
                entry.waiting = True
                async with entry.cm:
                    result = await super()._agenerate(messages, stop, run_manager, **kwargs)
                CHAOS.calls_done += 1
                return result
            except TimeoutError:
                if entry.cm is None or not entry.cm.expired():
                    raise
                CHAOS.reasked += 1  # the caller asks again
            finally:
                entry.waiting = False
                CHAOS.entries.discard(entry)

    async def _chaos_stream(
        self, messages: list[Any], stop: list[str] | None, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        while True:
            entry = _Entry()
            CHAOS.entries.add(entry)
            agen = self._astream(messages, stop=stop, **kwargs).__aiter__()
            yielded = False
            try:
                while True:
                    entry.cm = asyncio.timeout(None)
                    entry.waiting = True
                    try:
                        async with entry.cm:
                            chunk = await agen.__anext__()
                    except StopAsyncIteration:
                        CHAOS.calls_done += 1
                        return
                    finally:
                        entry.waiting = False
                    yielded = True
                    yield chunk
            except TimeoutError:
                if entry.cm is None or not entry.cm.expired():
                    raise
                if yielded:
                    CHAOS.gave_up += 1
                    raise ChaosGaveUp("cancelled after part of the stream arrived") from None
                CHAOS.reasked += 1
            finally:
                CHAOS.entries.discard(entry)
                await agen.aclose()


@tool
async def lookup(key: str) -> str:
    """Look a key up in the knowledge base."""
    await asyncio.sleep(0.005)
    return f"value-of-{key}"


class Parent(TypedDict, total=False):
    docs: list[str]
    reviews: Annotated[list[Any], operator.add]


def prompt(i: int) -> str:
    return f"chaos doc #{i} key=k{i % KEYS}"


def expected_answer(i: int) -> str:
    """What the emulator's scenario answers sibling i after its tool result."""
    messages = [
        {"role": "user", "content": prompt(i)},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": f"value-of-k{i % KEYS}"},
    ]
    plan = plan_chat(
        messages,
        tools=[{"type": "function", "function": {"name": "lookup"}}],
        tool_choice="auto",
        response_format=None,
        options=ScenarioOptions(scenario="agent", output_tokens=OUTPUT_TOKENS, turns=2, seed=SEED),
    )
    assert plan.content is not None
    return plan.content


def check_sibling(i: int, messages: Any) -> str | None:
    """None when sibling i's conversation is exactly its own correct one, else why not."""
    key = f"k{i % KEYS}"
    if not isinstance(messages, list):
        return f"{messages!r} instead of messages (sibling {i})"
    if len(messages) != 4:
        return f"{len(messages)} messages (sibling {i}: {[type(m).__name__ for m in messages]})"
    human, call, result, answer = messages
    if not isinstance(human, HumanMessage) or human.content != prompt(i):
        return "not its own question"
    if not isinstance(call, AIMessage) or call.invalid_tool_calls:
        return "invalid tool call passed off as a result"
    if [(c["name"], c["args"]) for c in call.tool_calls] != [("lookup", {"key": key})]:
        return f"wrong tool call {call.tool_calls}"
    if not isinstance(result, ToolMessage) or result.content != f"value-of-{key}":
        return f"wrong tool result {getattr(result, 'content', result)!r}"
    if not isinstance(answer, AIMessage) or answer.tool_calls or answer.invalid_tool_calls:
        return "no final answer"
    if answer.content != expected_answer(i):
        meta = answer.response_metadata
        return (
            f"wrong or truncated answer {answer.content!r} (sibling {i}, "
            f"finish_reason {meta.get('finish_reason')!r}, request {meta.get('request_id')!r}, "
            f"usage {answer.usage_metadata!r})"
        )
    if answer.response_metadata.get("finish_reason") != "stop":
        return f"finish_reason {answer.response_metadata.get('finish_reason')!r}"
    return None


def build(url: str) -> tuple[Any, ChaosModel]:
    from langgraph.prebuilt import create_react_agent

    llm = ChaosModel(
        model=MODEL,
        base_url=url.replace("http://", "vllm://"),
        max_tokens=256,
        max_retries=8,
        policy=BatchPolicy(
            inflight_limit=64,
            inflight_cap=64,
            initial_inflight=64,
            retry=RetryPolicy(initial_interval=0.05, max_interval=1.5),
        ),
        extra_body={"emulator": {"output_tokens": OUTPUT_TOKENS}},
    )
    agent = create_react_agent(llm, tools=BatchToolNode([coalesce(lookup)]))
    builder = StateGraph(Parent)
    builder.add_node(
        "review",
        fan_out(
            agent,
            items="docs",
            into="reviews",
            make_input=lambda doc, i: {"messages": [HumanMessage(doc)]},
            result=lambda final: final["messages"],
        ),
    )
    builder.add_edge(START, "review")
    return builder.compile(), llm


class RetryLog(logging.Handler):
    """The request ids the scheduler retried (a retry keeps its id), and the errors."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.request_ids: set[str] = set()
        self.errors: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno == logging.INFO and "retry" in record.getMessage():
            self.errors[str(getattr(record, "error_type", "?"))] += 1
            rid = getattr(record, "request_id", None)
            if rid:
                self.request_ids.add(str(rid))


async def _round(
    graph: Any,
    rng: random.Random,
    emulator: KillableEmulator | None,
    figures: Counter[str],
    retry_log: RetryLog,
    deadline: float,
) -> None:
    """One job of N siblings under chaos; adds this round's figures."""
    per_run = N // RUNS
    results: dict[int, list[Any]] = {}
    runs: dict[int, asyncio.Task[Any]] = {}
    cancelled_by_chaos: set[asyncio.Task[Any]] = set()
    run_cancels = 0

    async def run(r: int) -> None:
        docs = [prompt(i) for i in range(r * per_run, (r + 1) * per_run)]
        while True:
            task = asyncio.create_task(graph.ainvoke({"docs": docs}))
            runs[r] = task
            try:
                out = await task
            except asyncio.CancelledError:
                if task in cancelled_by_chaos:
                    continue  # the user starts the cancelled run again
                raise
            results[r] = out["reviews"]
            return

    async def kill_and_restart() -> None:
        assert emulator is not None
        while CHAOS.calls_done < 150:  # noqa: ASYNC110 - polls a counter the calls update
            await asyncio.sleep(0.01)
        await asyncio.to_thread(emulator.restart)

    drivers = [asyncio.create_task(run(r)) for r in range(RUNS)]
    killer = asyncio.create_task(kill_and_restart()) if emulator is not None else None
    try:
        async with asyncio.timeout(max(1.0, deadline - time.monotonic())):
            while not all(d.done() for d in drivers):
                await asyncio.sleep(rng.uniform(0, 0.003))
                if CHAOS.cancels >= CANCELS:
                    continue
                live = [t for t in runs.values() if not t.done()]
                if live and run_cancels < 2 and rng.random() < 0.004:
                    victim = rng.choice(live)
                    cancelled_by_chaos.add(victim)
                    victim.cancel()
                    run_cancels += 1
                    CHAOS.run_cancels += 1
                else:
                    CHAOS.cancel_one(rng)
            await asyncio.gather(*drivers)
            if killer is not None:
                await killer
    except TimeoutError:
        figures["hung"] += N - sum(len(v) for v in results.values())
        for d in (*drivers, *runs.values()):
            d.cancel()
    figures["siblings"] += N
    for r in range(RUNS):
        reviews = results.get(r)
        for k in range(per_run):
            i = r * per_run + k
            if reviews is None:
                continue  # counted as hung above
            if k >= len(reviews) or reviews[k] is None:
                figures["lost"] += 1
                continue
            value = reviews[k]
            if isinstance(value, SiblingError):
                kind = "failed_typed" if value.error_type in TYPED else "failed_untyped"
                figures[kind] += 1
                figures[f"error:{value.error_type}"] += 1
                continue
            why = check_sibling(i, value)
            if why is not None:
                figures["silently_wrong"] += 1
                figures[f"wrong:{why[:400]}"] += 1
                continue
            figures["ok"] += 1
            rids = {
                m.response_metadata.get("request_id") for m in value if isinstance(m, AIMessage)
            }
            if rids & retry_log.request_ids:
                figures["recovered_by_retry"] += 1
    figures["rounds"] += 1


async def test_chaos_200_siblings(
    killable_emulator: type[KillableEmulator], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator = killable_emulator(
        EmulatorConfig(
            port=0,
            time_scale=50.0,
            seed=SEED,
            fault_rate=FAULT_RATE,
            faults=FAULTS,
            retry_after_s=0.2,
            slow_first_token_s=2.0,
        )
    )
    await asyncio.to_thread(emulator.start)
    global CHAOS
    CHAOS = Chaos()
    retry_log = RetryLog()
    retry_logger = logging.getLogger("langgraph_batch.scheduler._retry")
    retry_logger.addHandler(retry_log)
    old_level = retry_logger.level
    retry_logger.setLevel(logging.INFO)
    before = asyncio.all_tasks()
    graph, llm = build(emulator.url)
    scheduler = llm.get_scheduler()
    backend = scheduler.backend
    assert isinstance(backend, OpenAICompatibleBackend)
    rng = random.Random(SEED)
    figures: Counter[str] = Counter()
    t0 = time.monotonic()
    deadline = t0 + 180.0
    try:
        while CHAOS.cancels < CANCELS and figures["rounds"] < 8 and not figures["hung"]:
            first = figures["rounds"] == 0
            await _round(graph, rng, emulator if first else None, figures, retry_log, deadline)
        # Idle now: no request may hold a slot or a connection.
        async with asyncio.timeout(10):
            while True:
                state = backend.transport.state()
                if state.requests_active == 0 and state.connections_active == 0:
                    break
                await asyncio.sleep(0.05)
    except TimeoutError:
        pass
    finally:
        retry_logger.removeHandler(retry_log)
        retry_logger.setLevel(old_level)
    state = backend.transport.state()
    stats = scheduler.stats()
    figures["leaked_connections"] = state.connections_active + state.requests_active
    figures["leaked_queued"] = stats.queued + stats.in_flight + len(scheduler.inflight_by_sibling())
    await scheduler.aclose()
    await asyncio.sleep(0.1)
    leftover = [t for t in asyncio.all_tasks() - before if not t.done()]
    figures["leaked_tasks"] = len(leftover)
    report = {
        "siblings": figures["siblings"],
        "rounds": figures["rounds"],
        "cancellations": CHAOS.cancels,
        "call_cancellations": CHAOS.call_cancels,
        "run_cancellations": CHAOS.run_cancels,
        "server_restarts": emulator.starts - 1,
        "ok": figures["ok"],
        "lost": figures["lost"],
        "silently_wrong": figures["silently_wrong"],
        "hung": figures["hung"],
        "leaked_tasks": figures["leaked_tasks"],
        "leaked_connections": figures["leaked_connections"],
        "leaked_queued_requests": figures["leaked_queued"],
        "recovered_by_retry": figures["recovered_by_retry"],
        "failed_typed": figures["failed_typed"],
        "failed_untyped": figures["failed_untyped"],
        "asked_again_after_cancel": CHAOS.reasked,
        "gave_up_mid_stream": CHAOS.gave_up,
        "retries": stats.retries,
        "retried_errors": dict(retry_log.errors),
        "malformed_tool_calls": stats.malformed_tool_calls,
        "pools_repaired": state.pools_repaired,
        "errors": {k[6:]: v for k, v in figures.items() if k.startswith("error:")},
        "wrong": {k[6:]: v for k, v in figures.items() if k.startswith("wrong:")},
        "wall_s": round(time.monotonic() - t0, 1),
    }
    path = tmp_path / "chaos_figures.json"
    await asyncio.to_thread(path.write_text, json.dumps(report, indent=2))
    table = "\n".join(
        [f"\nchaos figures ({path})", *(f"  {name:<26} {value}" for name, value in report.items())]
    )
    with capsys.disabled():
        await asyncio.to_thread(print, table)
    assert report["cancellations"] >= CANCELS
    assert report["server_restarts"] == 1
    for name in (
        "lost",
        "silently_wrong",
        "hung",
        "leaked_tasks",
        "leaked_connections",
        "leaked_queued_requests",
        "failed_untyped",
    ):
        assert report[name] == 0, (name, report["wrong"], report["errors"], report)
    assert report["ok"] + report["failed_typed"] == report["siblings"]
    assert report["recovered_by_retry"] > 0
    assert report["ok"] > report["siblings"] // 2
