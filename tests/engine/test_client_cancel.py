"""Cancellation reaches the engine: a cancelled call's request is aborted there.

Each test starts calls that would generate for minutes (`max_tokens` 32,000
with `ignore_eos`), waits until the engine runs them (its own
`vllm:num_requests_running`), cancels, then measures how long the engine takes
to run nothing, and checks from the engine's token counter that the requests
stopped generating far short of `max_tokens` (vLLM 0.32 does not count a
client's abort in `vllm:request_success_total{finished_reason="abort"}`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph

from benchmarks.vllm_cpu import VLLMCPUServer
from langgraph_batch import BatchedChatModel, fan_out
from tests.engine._client import counter, vllm_url, wait_metric

MAX_TOKENS = 32000
"""Near the default engine's `max_model_len` (32,768, prompt included): 20,000 took 90 s here."""
LONG = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "extra_body": {"ignore_eos": True}}
QUICKLY_S = 10.0
"""How soon the engine must be idle after the cancel (it would otherwise run for minutes)."""
ATTEMPTS = 3


class FinishedFirst(Exception):
    """The call completed before the cancel reached it: nothing was measured.

    On 2 cores vLLM's busy processes could stall this test's event loop for tens
    of seconds (CI logged steps of 56 and 80 s) while the engine generated at full
    speed, so even 20,000 tokens were all generated before the test got to cancel.
    The server's `nice` did not count then: it ran in a session of its own, and
    the kernel shares the CPU between sessions first (it now stays in ours).
    """


def finished_normally(task: asyncio.Task[Any]) -> bool:
    """Whether `task` ended with a result (not cancelled, no exception)."""
    return task.done() and not task.cancelled() and task.exception() is None


async def measure_a_cancel(
    server: VLLMCPUServer,
    start: Callable[[], asyncio.Task[Any]],
    n: int,
    first: Callable[[], asyncio.Event | None] = lambda: None,
) -> float:
    """`cancel_and_measure` on a fresh call, again when the call finished first."""
    for attempt in range(1, ATTEMPTS + 1):
        event = first()
        try:
            return await cancel_and_measure(server, start(), n, event)
        except FinishedFirst:
            print(f"\nattempt {attempt}: the call finished before the cancel; again")
    raise AssertionError(f"the call finished before the cancel in all {ATTEMPTS} attempts")


async def cancel_and_measure(
    server: VLLMCPUServer, task: asyncio.Task[Any], n: int, first: asyncio.Event | None = None
) -> float:
    """Cancel `task` once the engine runs `n` requests; seconds until it runs none.

    A streamed call's `first` chunk proves the engine generates for it: on 2 cores
    vLLM's busy processes can starve this test's polls for seconds while a
    stream runs, so the gauge may never be read at the right moment.
    """
    try:
        if first is not None:
            async with asyncio.timeout(120):
                await first.wait()
        else:
            await wait_metric(
                server, lambda m: m.num_requests_running == n, what=f"{n} running", task=task
            )
    except AssertionError:
        if finished_normally(task):
            raise FinishedFirst from None
        raise
    generated_before = await counter(server, "vllm:generation_tokens_total")
    t0 = time.monotonic()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    else:
        # Completed before the cancel landed; wait for the engine to be idle.
        await wait_metric(server, lambda m: m.num_requests_running == 0, what="idle")
        raise FinishedFirst
    _, waited = await wait_metric(
        server,
        lambda m: m.num_requests_running == 0 and m.num_requests_waiting == 0,
        deadline_s=QUICKLY_S,
        what="engine idle after the cancel",
    )
    elapsed = time.monotonic() - t0
    assert waited <= elapsed
    # Stopped, not finished: what the engine generated is far short of max_tokens.
    generated = await counter(server, "vllm:generation_tokens_total")
    assert generated - generated_before < n * MAX_TOKENS / 4
    print(f"\n{n} request(s) aborted, engine idle {elapsed:.2f} s after the cancel")
    return elapsed


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
async def test_a_cancelled_call_is_aborted_on_the_engine(
    engine: VLLMCPUServer, stream: bool
) -> None:
    llm = BatchedChatModel(model=engine.model, base_url=vllm_url(engine), **LONG)

    first = asyncio.Event()

    async def call() -> None:
        if stream:
            async for _ in llm.astream("Write forever."):
                first.set()
        else:
            await llm.ainvoke("Write forever.")

    def new_event() -> asyncio.Event | None:
        nonlocal first
        first = asyncio.Event()
        return first if stream else None

    await measure_a_cancel(engine, lambda: asyncio.create_task(call()), 1, new_event)
    stats = llm.get_scheduler().stats()
    assert (stats.in_flight, stats.queued) == (0, 0)
    assert stats.cancelled >= 1
    await llm.get_scheduler().aclose()


class Sib(TypedDict, total=False):
    topic: str
    text: str


class Parent(TypedDict, total=False):
    topics: list[str]
    texts: list[Any]


async def test_cancelling_a_fan_out_aborts_its_siblings_requests_and_frees_the_ledger(
    engine: VLLMCPUServer,
) -> None:
    llm = BatchedChatModel(model=engine.model, base_url=vllm_url(engine), **LONG)
    scheduler = llm.get_scheduler()

    async def write(state: Sib) -> Sib:
        msg = await llm.ainvoke(f"Write about {state['topic']}.")
        return {"text": str(msg.content)}

    sib = StateGraph(Sib)
    sib.add_node("write", write)
    sib.add_edge(START, "write")
    parent = StateGraph(Parent)
    parent.add_node(
        "fan",
        fan_out(
            sib.compile(),
            items="topics",
            into="texts",
            make_input=lambda topic, i: {"topic": topic},
            result=lambda s: s["text"],
            scheduler=scheduler,
        ),
    )
    parent.add_edge(START, "fan")
    graph = parent.compile()
    topics = ["kv caches", "schedulers", "tokenizers", "samplers"]
    await measure_a_cancel(
        engine, lambda: asyncio.create_task(graph.ainvoke({"topics": topics})), len(topics)
    )
    stats = scheduler.stats()
    assert (stats.in_flight, stats.queued) == (0, 0)
    assert scheduler.inflight_by_sibling() == {}
    ledger = await scheduler.kv_ledger()
    assert ledger is not None
    assert ledger.capacity == engine.config.kv_tokens
    # The cancelled run left the ledger itself (members are held weakly, so a
    # run that vanished would stop counting only once collected: not relied on).
    assert ledger.resident_tokens() == 0
    assert ledger.active() == 0
    assert ledger.members == 0
    await scheduler.aclose()
