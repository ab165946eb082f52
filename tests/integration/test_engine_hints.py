"""Engine hints against the emulator flavours that accept them.

- Request priority: vLLM (`--scheduling-policy priority`, lower first) and
  SGLang (`--enable-priority-scheduling`, HIGHER first, so the backend flips
  the sign) both run the scheduler's most urgent request first.
- `SessionConfig(engine_hints="agentic_context")`: vllm-router's program
  metadata (`vllm_xargs.agentic_context`) reaches an engine that accepts it
  (`EmulatorConfig(agentic_context=True)`) with one program per sibling and its
  turns as steps; a stock vLLM (the default emulator) refuses it with HTTP 400,
  which is why the option is off by default.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, StateGraph

from langgraph_batch.backends import ChatRequest, SessionConfig, SGLangBackend, VLLMBackend
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.errors import BackendBadRequestError
from langgraph_batch.nodes import SiblingError, fan_out

MODEL = "emulated-llama-3-8b"
TURNS = 3
ORDER = ["blocker", "p-3", "p1", "p3", "p5"]
"""The order the engine must finish them in: lower priority values sooner."""


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
async def test_the_engine_runs_the_most_urgent_request_first(
    start_emulator: Callable[..., str], flavor: str
) -> None:
    url = await asyncio.to_thread(
        start_emulator,
        flavor=flavor,
        scenario="echo",
        scheduling_policy="priority",
        max_num_seqs=1,
        output_tokens=32,
        time_scale=5.0,
    )
    cls = SGLangBackend if flavor == "sglang" else VLLMBackend
    done: list[str] = []

    def request(name: str, priority: int) -> ChatRequest:
        # ~0.5 s of decode at time scale 5; each answer's length names it at the engine
        tokens = 400 if name == "blocker" else 8 + ORDER.index(name)
        return ChatRequest(
            model=MODEL,
            messages=[{"role": "user", "content": f"{name} words to echo back"}],
            params={"max_tokens": tokens, "emulator": {"output_tokens": tokens}},
            priority=priority,
            request_id=name,
        )

    async with cls(url, priority_scheduling=True) as backend:
        running = asyncio.Event()

        async def run(name: str, priority: int) -> None:
            await backend.chat(request(name, priority))
            done.append(name)

        async def block() -> None:  # streams, so its first token says it holds the slot
            streamed = replace(request("blocker", 0), stream=True)
            await backend.chat(streamed, on_chunk=lambda chunk: running.set())
            done.append("blocker")

        blocker = asyncio.create_task(block())
        await running.wait()
        queued = [asyncio.create_task(run(f"p{p}", p)) for p in (5, 1, -3, 3)]
        await asyncio.gather(blocker, *queued)
    assert sorted(done) == sorted(ORDER)
    # Ours: lower runs sooner (the SGLang backend sends the negation). The order
    # is the engine's: a loaded client may take in the blocker's 400-chunk
    # stream after p-3's whole answer.
    async with httpx.AsyncClient(base_url=url) as client:
        phases = (await client.get("/emulator/requests")).json()
    finish = phases["fields"].index("finish")
    rows = sorted(phases["requests"], key=lambda row: row[finish])
    by_length = {400 if n == "blocker" else 8 + ORDER.index(n): n for n in ORDER}
    assert [by_length[row[-1]] for row in rows] == ORDER, rows


def stats(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/emulator/stats", timeout=10).json())


class Parent(TypedDict, total=False):
    items: list[int]
    out: Annotated[list[Any], operator.add]


class Sibling(TypedDict, total=False):
    item: int
    answer: str


def graph(llm: BatchedChatModel) -> Any:
    async def talk(state: Sibling) -> dict[str, Any]:
        messages: list[Any] = [HumanMessage(f"sibling {state['item']} starts talking")]
        for turn in range(TURNS):
            answer: AIMessage = await llm.ainvoke(messages)
            messages += [answer, HumanMessage(f"go on, turn {turn}")]
        return {"answer": str(messages[-2].content)}

    sub = StateGraph(Sibling)
    sub.add_node("talk", talk)
    sub.add_edge(START, "talk")
    parent = StateGraph(Parent)
    parent.add_node(
        "all",
        fan_out(sub.compile(), items="items", into="out", make_input=lambda x, i: {"item": x}),
    )
    parent.add_edge(START, "all")
    return parent.compile()


async def test_agentic_context_reaches_an_engine_that_accepts_it(
    start_emulator: Callable[..., str],
) -> None:
    url = await asyncio.to_thread(
        start_emulator, scenario="echo", agentic_context=True, output_tokens=8
    )
    hints = SessionConfig(engine_hints="agentic_context")
    llm = BatchedChatModel(
        model=MODEL, base_url=f"vllm://{url[7:]}", max_tokens=16, session_affinity=hints
    )
    try:
        out = await graph(llm).ainvoke({"items": list(range(6))})
    finally:
        await llm.get_scheduler().aclose()
    assert not [r for r in out["out"] if isinstance(r, SiblingError)]
    hints = (await asyncio.to_thread(stats, url))["agentic_context"]
    assert hints["requests"] == 6 * TURNS
    assert hints["programs"] == 6  # one program per sibling: its session key
    assert hints["steps_per_program"] == [TURNS]
    assert hints["step_ids"] == list(range(TURNS))
    assert hints["expected_output_length"] == [16]


async def test_stock_vllm_refuses_agentic_context_so_it_is_off_by_default(
    start_emulator: Callable[..., str],
) -> None:
    url = await asyncio.to_thread(start_emulator, scenario="echo", output_tokens=8)
    base = f"vllm://{url[7:]}"
    hinted = BatchedChatModel(
        model=MODEL,
        base_url=base,
        max_retries=0,
        session_affinity=SessionConfig(engine_hints="agentic_context"),
    )
    plain = BatchedChatModel(model=MODEL, base_url=base)
    try:
        with pytest.raises(BackendBadRequestError, match="vllm_xargs"):
            await hinted.ainvoke("hello")
        assert (await plain.ainvoke("hello")).content
    finally:
        await hinted.get_scheduler().aclose()
        await plain.get_scheduler().aclose()
    assert (await asyncio.to_thread(stats, url))["agentic_context"]["requests"] == 0


TOOL_S = 0.25


def tool_agent(llm: BatchedChatModel) -> Any:
    """A ReAct agent whose one tool takes `TOOL_S` (the emulator asks for it by the doc's key)."""
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    from langgraph_batch import BatchMiddleware

    @tool
    async def lookup(key: str) -> str:
        """Look a key up in the knowledge base."""
        await asyncio.sleep(TOOL_S)
        return f"value-of-{key}"

    return create_agent(llm, [lookup], middleware=[BatchMiddleware()])


async def test_the_learned_tool_wait_reaches_the_engine_as_kv_retention(
    start_emulator: Callable[..., str],
) -> None:
    from benchmarks.routers.process import router_unavailable, start_router

    url = await asyncio.to_thread(
        start_emulator, agentic_context=True, output_tokens=8, time_scale=1.0
    )
    # Through the real vllm-router with program scheduling, which validates the field
    # ("kv_retention_ttl_seconds must be seconds as a number") and passes it on.
    assert await asyncio.to_thread(router_unavailable, "vllm-router") is None
    router = await asyncio.to_thread(
        start_router, "router-ps", [url], profile="h100-llama3-8b", time_scale=1.0
    )
    llm = BatchedChatModel(
        model=MODEL,
        base_url=router.url.replace("http://", "vllm://"),
        max_tokens=64,
        session_affinity=SessionConfig(engine_hints="agentic_context"),
    )
    b = StateGraph(Parent)
    b.add_node(
        "all",
        fan_out(
            tool_agent(llm),
            items="items",
            into="out",
            make_input=lambda x, i: {"messages": [HumanMessage(f"review doc #{x} key=k{x}")]},
            max_active=4,
        ),
    )
    b.add_edge(START, "all")
    try:
        out = await b.compile().ainvoke({"items": list(range(24))})
    finally:
        await llm.get_scheduler().aclose()
        await asyncio.to_thread(router.stop)
    assert not [r for r in out["out"] if isinstance(r, SiblingError)]
    ttl = (await asyncio.to_thread(stats, url))["agentic_context"]["kv_retention_ttl_seconds"]
    # Hints start once the run has seen 8 tool waits; each covers 9 in 10 of them: at
    # least the tool's own time, and far below what a stuck tool would take.
    print(f"\nkv_retention_ttl_seconds hints: {ttl}")
    assert ttl["requests"] > 0, ttl
    assert TOOL_S <= ttl["min"] <= ttl["max"] < 10 * TOOL_S, ttl
