"""The engine honours the priority the scheduler sends (`--scheduling-policy priority`).

The engine runs at most two requests (`max_num_seqs=2`). Two long blockers
(sent straight to the engine) fill both places; then two fresh calls (turn 0)
and one call of a conversation three turns along queue on the engine, in that
order, through BatchedChatModel. The scheduler's default
`depth_first` priority gives the later one `priority=-3` (lower runs sooner on
vLLM). One blocker is cancelled (aborted on the engine): the one place it frees
goes to the best priority waiting. With priority sent, the conversation three
turns along finishes first; without it
(same engine, `priority_scheduling=False`: every priority 0, ties in arrival
order) the first fresh call gets the place. No timing is involved: each step
waits for the engine's own queue counts.

The same small engine (16,384 KV tokens, 16,352 usable) then shows a
preemption as the library reads it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from benchmarks.vllm_cpu import VLLMCPUServer
from langgraph_batch import BatchedChatModel
from langgraph_batch.backends.vllm import VLLMBackend
from langgraph_batch.scheduler import BatchPolicy
from tests.engine._client import counter, wait_metric

SMALL = {
    "scheduling_policy": "priority",
    "max_num_seqs": 2,
    "kv_tokens": 16384,
    "max_model_len": 9000,
}


@pytest.fixture(scope="module")
def small(start_engine: Callable[..., VLLMCPUServer]) -> VLLMCPUServer:
    """A priority-scheduling engine with two places and 4,096 KV tokens."""
    return start_engine(**SMALL)


def model(server: VLLMCPUServer, *, priority: bool) -> BatchedChatModel:
    """A model whose scheduler sends every call at once (a fixed limit of 8).

    By default the scheduler stops adding to an engine that keeps a queue of
    its own (its adaptive limit grows only while `num_requests_waiting` is 0)
    and orders its own queue by the same priority; a fixed limit lets the
    three calls reach the engine's queue, where the engine must order them.
    """
    backend = VLLMBackend(server.url, priority_scheduling=priority)
    return BatchedChatModel(
        model=server.model,
        backend=backend,
        policy=BatchPolicy(adaptive=False, inflight_limit=8, decode_cap=False),
        max_tokens=4,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )


def deep(text: str, turns: int) -> list[BaseMessage]:
    """A conversation `turns` model answers along, asking `text` next."""
    history: list[BaseMessage] = []
    for t in range(turns):
        history += [HumanMessage(f"step {t}"), AIMessage(f"done {t}")]
    return [*history, HumanMessage(text)]


async def hold(client: httpx.AsyncClient, server: VLLMCPUServer, text: str) -> None:
    """A long request straight to the engine (priority 0); cancelling it aborts it there.

    Sent past the library, so that its own KV-aware admission (which would hold
    the small calls back behind two long ones on this small cache) stays out of
    the way: the engine alone decides the order here.
    """
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 8000,  # two of them fit the 16,352 usable KV tokens: no preemption
        "ignore_eos": True,
    }
    # Not streamed: the engine's API process stays free to answer /metrics at once.
    await client.post(f"{server.url}/v1/chat/completions", json=body)


async def run_order(server: VLLMCPUServer, *, priority: bool) -> list[str]:
    """Queue low, low, high behind two blockers; free one place; the order of completion."""
    llm = model(server, priority=priority)
    done: list[str] = []
    calls: dict[str, asyncio.Task[Any]] = {}
    async with httpx.AsyncClient(timeout=120) as client:
        blockers = [asyncio.create_task(hold(client, server, f"hold {i}")) for i in range(2)]
        await wait_metric(server, lambda m: m.num_requests_running == 2, what="2 running")
        queue = [
            ("low-1", deep("fresh a", 0)),
            ("low-2", deep("fresh b", 0)),
            ("high", deep("go", 3)),
        ]
        for n, (name, messages) in enumerate(queue, start=1):
            task = asyncio.create_task(llm.ainvoke(messages))
            task.add_done_callback(lambda t, name=name: done.append(name))
            calls[name] = task
            try:
                await wait_metric(
                    server, lambda m, n=n: m.num_requests_waiting == n, what=f"{n} waiting"
                )
            except AssertionError as exc:  # say whether the client or the engine held it
                stats = llm.get_scheduler().stats()
                raise AssertionError(f"{exc}; scheduler: {stats}; done: {done}") from None
        blockers[0].cancel()  # one place frees: the engine picks who gets it
        await asyncio.wait(calls.values(), return_when=asyncio.FIRST_COMPLETED)
        blockers[1].cancel()
        await asyncio.gather(*blockers, return_exceptions=True)
        await asyncio.gather(*calls.values())
    await wait_metric(server, lambda m: m.num_requests_running == 0, what="idle")
    await llm.get_scheduler().aclose()
    return done


async def test_higher_priority_finishes_before_lower_ones_queued_earlier(
    small: VLLMCPUServer,
) -> None:
    order = await run_order(small, priority=True)
    assert order[0] == "high", order
    # Control: the same engine and sequence with no priority sent is first come first served.
    order = await run_order(small, priority=False)
    assert order[0] == "low-1", order


async def test_preemptions_are_read_from_the_engine(small: VLLMCPUServer) -> None:
    # Two contexts of 8,500 tokens cannot both stay in 16,352 usable KV tokens: vLLM
    # preempts one (and recomputes it later). Sent past the library, whose KV-aware
    # admission would not send them together; the library reads the count.
    backend = VLLMBackend(small.url)
    before = await backend.metrics()
    assert before is not None
    assert before.num_preemptions_total is not None
    body = {"model": small.model, "max_tokens": 4500, "ignore_eos": True}
    prompts = [[100 + (i + j) % 400 for j in range(4000)] for i in range(2)]
    async with httpx.AsyncClient(timeout=300) as client:
        answers = await asyncio.gather(
            *(
                client.post(f"{small.url}/v1/completions", json=body | {"prompt": p})
                for p in prompts
            )
        )
    assert [a.json()["usage"]["completion_tokens"] for a in answers] == [4500, 4500]
    after = await backend.metrics()
    assert after is not None
    assert after.num_preemptions_total is not None
    assert after.num_preemptions_total > before.num_preemptions_total
    assert await counter(small, "vllm:num_preemptions_total") == after.num_preemptions_total
    await backend.aclose()
