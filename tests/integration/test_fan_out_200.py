"""fan_out at scale against the emulator: 200 ReAct siblings, real scheduler, coalesced tool.

Each sibling is a prebuilt ReAct agent (`create_react_agent`) whose model is a
`BatchedChatModel` pointed at the emulator (agent scenario: one tool call,
then an answer) and whose tools run in a `BatchToolNode` with a coalesced
lookup tool. Sibling i asks about `key=k<i % 20>`, so 20 distinct tool calls.
"""

from __future__ import annotations

import asyncio
import operator
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph

from langgraph_batch._context import SiblingInfo, current_sibling
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.nodes import SiblingError, fan_out
from langgraph_batch.scheduler import Scheduler
from langgraph_batch.tools import BatchToolNode, coalesce

pytestmark = [
    pytest.mark.filterwarnings("ignore:create_react_agent has been moved"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

MODEL = "emulated-llama-3-8b"
N = 200
KEYS = 20


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    # Debug mode records a stack for every task and future; with 200 siblings
    # of ~20 tasks each it triples the runtime. The unit tests keep it on.
    return ("asyncio", {"debug": False})


class Parent(TypedDict, total=False):
    docs: list[str]
    reviews: Annotated[list[Any], operator.add]


class Probe:
    """What the tool saw: executions per key, and violations of the in-tool rules."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.executions: Counter[str] = Counter()
        self.violations: list[str] = []
        self.in_tool: set[str] = set()
        self.tool_enters = 0

    def check_no_slot_in_tool(self) -> None:
        """No sibling that is inside a tool has an inference request on the wire."""
        busy = set(self.scheduler.inflight_by_sibling()) & self.in_tool
        if busy:
            self.violations.append(f"inference slot held in a tool: {sorted(busy)}")

    def instrument(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Check at every `SiblingInfo.tool_enter` (followers of coalesced calls included)."""
        enter, exit_ = SiblingInfo.tool_enter, SiblingInfo.tool_exit
        probe = self

        async def tool_enter(info: SiblingInfo, name: str | None = None) -> None:
            await enter(info, name)
            probe.tool_enters += 1
            probe.in_tool.add(info.sibling_id)
            probe.check_no_slot_in_tool()

        async def tool_exit(info: SiblingInfo) -> None:
            probe.in_tool.discard(info.sibling_id)
            await exit_(info)

        monkeypatch.setattr(SiblingInfo, "tool_enter", tool_enter)
        monkeypatch.setattr(SiblingInfo, "tool_exit", tool_exit)


def build(
    url: str,
    probe_box: list[Probe],
    *,
    max_inflight: int = 64,
    fail_key: str | None = None,
    create_agent: bool = False,
) -> tuple[Any, BatchedChatModel]:
    """A ReAct agent with one coalesced tool (`create_agent=True`: langchain's
    `create_agent` with the coalescing middleware, else the prebuilt one)."""
    from langgraph.prebuilt import create_react_agent

    llm = BatchedChatModel(
        model=MODEL,
        base_url=url.replace("http://", "vllm://"),  # vLLM flavour: KV capacity in /metrics
        max_inflight=max_inflight,
        max_tokens=256,
        extra_body={"emulator": {"output_tokens": 8}},
    )

    @tool
    async def lookup(key: str) -> str:
        """Look a key up in the knowledge base."""
        probe = probe_box[0]
        probe.executions[key] += 1
        sib = current_sibling()
        if sib is None or not sib.in_tool:
            probe.violations.append(f"tool without in-tool sibling: {sib}")
        elif sib.admission is not None and sib.admission.holds(sib):
            probe.violations.append(f"{sib.sibling_id} holds an active place in a tool")
        probe.check_no_slot_in_tool()
        await asyncio.sleep(0.01)  # a slow-ish lookup: other siblings overlap with it
        if key == fail_key:
            raise LookupError(f"no entry for {key}")
        return f"value-of-{key}"

    if create_agent:
        from langchain.agents import create_agent as make_agent

        from langgraph_batch import BatchMiddleware

        return make_agent(llm, [coalesce(lookup)], middleware=[BatchMiddleware()]), llm
    agent = create_react_agent(llm, tools=BatchToolNode([coalesce(lookup)]))
    return agent, llm


def parent_graph(agent: Any, **kw: Any) -> Any:
    b = StateGraph(Parent)
    b.add_node(
        "review",
        fan_out(
            agent,
            items="docs",
            into="reviews",
            make_input=lambda doc, i: {"messages": [HumanMessage(doc)]},
            result=lambda final: final["messages"],
            name="review",
            **kw,
        ),
    )
    b.add_edge(START, "review")
    return b.compile()


def docs(n: int = N) -> list[str]:
    return [f"review doc #{i} key=k{i % KEYS}" for i in range(n)]


def long_docs(n: int, tag: str = "") -> list[str]:
    """Documents of ~1,200 tokens each: a few siblings' contexts fill a small cache.

    A `tag` makes them differ from another run's (identical prompts would share
    their KV on the server, and the gate rightly counts that once).
    """
    return [f"{tag}review doc #{i} key=k{i % KEYS}" + " page" * 1200 for i in range(n)]


ROOM_FOR_3 = 3 * 1400 + 600
"""KV tokens for ~3 of those siblings' contexts (and the shared prefix)."""


def check_sibling(i: int, messages: list[Any]) -> None:
    assert messages[0].content == f"review doc #{i} key=k{i % KEYS}"
    tool_msgs = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.content for m in tool_msgs] == [f"value-of-k{i % KEYS}"]
    assert messages[-1].type == "ai"
    assert not messages[-1].tool_calls


async def test_200_react_siblings_in_order_one_failure_one_execution_per_distinct_key(
    emulator_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    box: list[Probe] = []
    agent, llm = build(emulator_url, box, fail_key="boom")
    scheduler = llm.get_scheduler()
    box.append(Probe(scheduler))
    box[0].instrument(monkeypatch)
    items = docs()
    items[57] = "review doc #57 key=boom"
    events: list[dict[str, Any]] = []
    final: dict[str, Any] = {}
    async for mode, data in parent_graph(agent, scheduler=scheduler).astream(
        {"docs": items}, stream_mode=["custom", "values"]
    ):
        if mode == "custom":
            events.append(data)
        else:
            final = data
    reviews = final["reviews"]
    assert len(reviews) == N
    # the failing sibling is a SiblingError in its place; the 199 others are intact
    err = reviews[57]
    assert isinstance(err, SiblingError)
    assert (err.index, err.item, err.error_type) == (57, items[57], "LookupError")
    assert "no entry for boom" in err.message
    for i, messages in enumerate(reviews):
        if i != 57:
            check_sibling(i, messages)
    # coalescing: one execution per distinct key (20 keys + "boom")
    probe = box[0]
    assert probe.violations == []
    assert probe.tool_enters == N  # every sibling entered the tool node once
    assert probe.in_tool == set()
    assert sorted(probe.executions) == sorted([f"k{j}" for j in range(KEYS)] + ["boom"])
    assert sum(probe.executions.values()) == KEYS + 1
    # progress events and scheduler stats
    done = events[-1]
    assert (done["event"], done["done"], done["failed"], done["total"]) == ("done", N, 1, N)
    assert done["stats"]["completed"] >= 2 * N - 1
    assert sum(e["event"] == "sibling_finished" for e in events) == N - 1
    assert [e["index"] for e in events if e["event"] == "sibling_failed"] == [57]
    # admission: no cap on active siblings was given (the KV budget admits them:
    # these small contexts all fit), and the run leaves the server's ledger empty
    assert events[0]["event"] == "started"
    assert events[0]["max_active"] is None
    assert done["pauses"] == 0
    assert scheduler.stats().queued == 0


async def test_cancelling_mid_run_leaves_no_task_and_no_queued_request(
    emulator_url: str,
) -> None:
    box: list[Probe] = []
    agent, llm = build(emulator_url, box, max_inflight=4)
    scheduler = llm.get_scheduler()
    box.append(Probe(scheduler))
    graph = parent_graph(agent)
    before = asyncio.all_tasks()
    finished = 0
    saw_queue = False
    reached = asyncio.Event()

    async def consume() -> None:
        nonlocal finished, saw_queue
        async for data in graph.astream({"docs": docs()}, stream_mode="custom"):
            if data.get("event") == "sibling_finished":
                finished += 1
                saw_queue = saw_queue or scheduler.stats().queued > 0
                if finished >= 10:
                    reached.set()

    run = asyncio.create_task(consume())
    await asyncio.wait_for(reached.wait(), 30)
    assert scheduler.stats().queued > 0 or saw_queue  # requests were waiting for a slot
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert finished < N
    stats = scheduler.stats()
    assert stats.queued == 0
    assert stats.in_flight == 0
    assert scheduler.inflight_by_sibling() == {}
    assert stats.cancelled > 0
    await scheduler.aclose()
    await asyncio.sleep(0)
    leftover = {t for t in asyncio.all_tasks() - before if not t.done()}
    assert leftover == set(), [t.get_name() for t in leftover]


async def test_without_scheduler_the_gate_is_sized_by_the_server_the_models_found(
    start_emulator: Callable[..., str],
) -> None:
    # A server with room for ~3 siblings' contexts: fan_out has no scheduler=,
    # learns of the one its first sibling's model creates (pushed by the
    # registry, nothing polls), reads the capacity and holds the run to it.
    url = await asyncio.to_thread(start_emulator, kv_tokens=ROOM_FOR_3, time_scale=1.0)
    box: list[Probe] = []
    agent, llm = build(url, box)

    class Lazy:  # the probe's view of the scheduler, resolved only once a tool runs
        def inflight_by_sibling(self) -> dict[str, int]:
            return llm.get_scheduler().inflight_by_sibling()

    box.append(Probe(Lazy()))  # type: ignore[arg-type]
    events: list[dict[str, Any]] = []
    async for data in parent_graph(agent).astream({"docs": long_docs(12)}, stream_mode="custom"):
        if isinstance(data, dict) and data.get("type") == "lgb.fan_out":
            events.append(data)
    done = events[-1]
    assert (done["event"], done["done"], done["failed"]) == ("done", 12, 0)
    assert 1 <= done["peak_active"] <= 3


class TwoRuns(TypedDict, total=False):
    docs_a: list[str]
    docs_b: list[str]
    reviews_a: list[Any]
    reviews_b: list[Any]


@pytest.mark.parametrize("shared", [True, False], ids=["one-ledger", "ledger-per-run"])
async def test_two_concurrent_fan_outs_share_the_servers_kv_budget(
    start_emulator: Callable[..., str], monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    # Two fan_out nodes in parallel branches of one graph, no scheduler= on
    # either: both find the scheduler their models create and book the one
    # KV ledger it owns, so together they keep to a server with room for ~3
    # siblings' contexts. With a ledger per run (the design before), each
    # would budget the whole cache and together they would run about twice
    # as many.
    from langgraph_batch.nodes._admission import SiblingAdmission
    from langgraph_batch.scheduler._capacity import KVLedger

    if not shared:

        async def own_ledger(self: Scheduler) -> KVLedger | None:
            capacity = await self.kv_capacity()
            return None if capacity is None else KVLedger(capacity)

        monkeypatch.setattr(Scheduler, "kv_ledger", own_ledger)
    active: set[str] = set()  # siblings holding a place, over both runs
    peak = 0
    grant, release, finish = (
        SiblingAdmission._grant,
        SiblingAdmission.release,
        SiblingAdmission.finish,
    )

    def counting_grant(self: SiblingAdmission, sid: str, sibling: SiblingInfo | None) -> None:
        nonlocal peak
        grant(self, sid, sibling)
        active.add(sid)
        peak = max(peak, len(active))

    def counting_release(self: SiblingAdmission, sibling: SiblingInfo) -> None:
        active.discard(sibling.sibling_id)
        release(self, sibling)

    def counting_finish(self: SiblingAdmission, sibling: SiblingInfo) -> None:
        active.discard(sibling.sibling_id)
        finish(self, sibling)

    monkeypatch.setattr(SiblingAdmission, "_grant", counting_grant)
    monkeypatch.setattr(SiblingAdmission, "release", counting_release)
    monkeypatch.setattr(SiblingAdmission, "finish", counting_finish)
    url = await asyncio.to_thread(start_emulator, kv_tokens=ROOM_FOR_3, time_scale=1.0)
    box: list[Probe] = []
    agent, llm = build(url, box)

    class Lazy:
        def inflight_by_sibling(self) -> dict[str, int]:
            return llm.get_scheduler().inflight_by_sibling()

    box.append(Probe(Lazy()))  # type: ignore[arg-type]
    b = StateGraph(TwoRuns)
    for part in ("a", "b"):
        b.add_node(
            f"review_{part}",
            fan_out(
                agent,
                items=f"docs_{part}",
                into=f"reviews_{part}",
                make_input=lambda doc, i: {"messages": [HumanMessage(doc)]},
                result=lambda final: final["messages"][-1].content,
                name=f"review_{part}",
            ),
        )
        b.add_edge(START, f"review_{part}")
    out = await asyncio.wait_for(
        b.compile().ainvoke({"docs_a": long_docs(8, "a "), "docs_b": long_docs(8, "b ")}), 120
    )
    assert len(out["reviews_a"]) == len(out["reviews_b"]) == 8
    assert not any(isinstance(r, SiblingError) for r in out["reviews_a"] + out["reviews_b"])
    assert not active
    ledger = await llm.get_scheduler().kv_ledger()
    assert ledger is not None
    assert ledger.resident_tokens() == 0
    if shared:
        assert 1 <= peak <= 3, peak
        assert ledger.members == 0  # both runs left it when they ended
    else:
        assert peak > 3, peak  # the check above can fail: each run budgets alone
