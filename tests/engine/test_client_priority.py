"""The engine honours the priority the scheduler sends (`--scheduling-policy priority`).

The engine runs at most two requests (`max_num_seqs=2`). Two long blockers
(sent straight to the engine) fill both places; then two fresh calls (turn 0)
and one call of a conversation three turns along queue on the engine, in that
order, through BatchedChatModel. The scheduler's default
`depth_first` priority gives the later one `priority=-3` (lower runs sooner on
vLLM). One blocker is cancelled (aborted on the engine): the one place it frees
goes to the best priority waiting: the conversation three turns along finishes
first (or sooner: vLLM 0.32 may preempt a running lower-priority request for
it as it arrives; it then finishes while both fresh calls still wait). Each
step waits for the engine's own queue counts; an attempt in which a blocker
ended before the queue was built is void and made again (3 attempts).

Known weakness (issue 24): on the shared 2-core machine the queue sometimes
does not build while the blockers run (~40 s): a call the scheduler has sent
is not seen in `vllm:num_requests_waiting` until a blocker ends. All three
attempts can then be void and the test fails with "the queue never built up";
it has never failed on the order itself.

Without priority (every request 0) vLLM 0.32 gave the place to the first
fresh call in 3 of 5 runs and to the later one in 2: ties are not reliably
served in arrival order, so there is no "without priority" control here.

The same small engine (32,768 KV tokens, 32,736 usable) then shows a
preemption as the library reads it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from benchmarks.vllm_cpu import VLLMCPUServer
from langgraph_batch import BatchedChatModel
from langgraph_batch.backends.base import EngineMetrics
from langgraph_batch.backends.vllm import VLLMBackend
from langgraph_batch.scheduler import BatchPolicy
from tests.engine._client import counter, wait_metric
from tests.faultproxy import FaultProxy

SMALL = {
    "scheduling_policy": "priority",
    "max_num_seqs": 2,
    "kv_tokens": 32768,
    "max_model_len": 16640,
}


@pytest.fixture(scope="module")
def small(start_engine: Callable[..., VLLMCPUServer]) -> VLLMCPUServer:
    """A priority-scheduling engine with two places and 4,096 KV tokens."""
    return start_engine(**SMALL)


def model(url: str) -> BatchedChatModel:
    """A model whose scheduler sends every call at once (a fixed limit of 8).

    By default the scheduler stops adding to an engine that keeps a queue of
    its own (its adaptive limit grows only while `num_requests_waiting` is 0)
    and orders its own queue by the same priority; a fixed limit lets the
    three calls reach the engine's queue, where the engine must order them.
    """
    backend = VLLMBackend(url, priority_scheduling=True)
    return BatchedChatModel(
        model="tiny-llama",
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
        "max_tokens": 16000,  # two of them fit the 32,736 usable KV tokens: no preemption
        "ignore_eos": True,
    }
    # Not streamed: the engine's API process stays free to answer /metrics at once.
    await client.post(f"{server.url}/v1/chat/completions", json=body)


class Void(Exception):
    """An attempt that proves nothing: a blocker ended before the queue was built."""

    def __init__(self, step: str) -> None:
        super().__init__(step)
        self.step = step


async def queue_behind(
    server: VLLMCPUServer, blockers: list[asyncio.Task[None]], n: int, call: asyncio.Task[Any]
) -> None:
    """Wait until `n` requests wait on the engine while both blockers still run.

    Or until `call` is already answered: vLLM 0.32's priority policy may serve a
    higher-priority arrival at once, preempting the lowest-priority running
    request, so it is never seen waiting.
    """

    def ready(m: EngineMetrics) -> bool:
        if any(b.done() for b in blockers):
            raise Void(f"{n} waiting")
        return call.done() or (m.num_requests_waiting == n and m.num_requests_running == 2)

    await wait_metric(server, ready, deadline_s=120, what=f"{n} waiting")


async def run_order(server: VLLMCPUServer, url: str) -> list[str]:
    """Queue low, low, high behind two blockers; free one place; the order of completion.

    The blockers run ~40 s; on a loaded machine the queue may take longer to
    build. Such an attempt is void (nothing is asserted on it) and made again.
    """
    llm = model(url)
    await llm.ainvoke("warm up")  # the scheduler and the engine's chat path are ready
    void: list[str] = []
    try:
        for _ in range(3):
            try:
                order = await attempt(server, llm)
                print(f"\npriority: {order} after {len(void)} void attempt(s) {void}")
                return order
            except Void as exc:
                void.append(exc.step)
                await wait_metric(server, lambda m: m.num_requests_running == 0, what="idle")
        raise AssertionError(f"the queue never built up while the blockers ran: {void}")
    finally:
        await llm.get_scheduler().aclose()


async def attempt(server: VLLMCPUServer, llm: BatchedChatModel) -> list[str]:
    done: list[str] = []
    calls: dict[str, asyncio.Task[Any]] = {}
    async with httpx.AsyncClient(timeout=120) as client:
        blockers = [asyncio.create_task(hold(client, server, f"hold {i}")) for i in range(2)]
        try:
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
                await queue_behind(server, blockers, n, task)
            blockers[0].cancel()  # one place frees: the engine picks who gets it
            await asyncio.wait(calls.values(), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for b in blockers:
                b.cancel()
            await asyncio.gather(*blockers, *calls.values(), return_exceptions=True)
    await wait_metric(server, lambda m: m.num_requests_running == 0, what="idle")
    return done


async def test_higher_priority_finishes_before_lower_ones_queued_earlier(
    small: VLLMCPUServer,
) -> None:
    async with FaultProxy(small.url) as proxy:  # records what the library sent
        order = await run_order(small, proxy.url)
        sent = [json.loads(s.body) for s in proxy.seen if s.path.startswith("/v1/chat")]
    assert order[0] == "high", order
    # The priorities on the wire are the scheduler's depth_first ones: -turns.
    by_text = {b["messages"][-1]["content"]: b["priority"] for b in sent}
    assert (by_text["fresh a"], by_text["fresh b"], by_text["go"]) == (0, 0, -3)


async def test_preemptions_are_read_from_the_engine(small: VLLMCPUServer) -> None:
    # Two contexts of 16,500 tokens cannot both stay in 32,736 usable KV tokens: vLLM
    # preempts one (and recomputes it later). Sent past the library, whose KV-aware
    # admission would not send them together; the library reads the count.
    backend = VLLMBackend(small.url)
    before = await backend.metrics()
    assert before is not None
    assert before.num_preemptions_total is not None
    body = {"model": small.model, "max_tokens": 500, "ignore_eos": True}
    prompts = [[100 + (i + j) % 400 for j in range(16000)] for i in range(2)]
    async with httpx.AsyncClient(timeout=300) as client:
        answers = await asyncio.gather(
            *(
                client.post(f"{small.url}/v1/completions", json=body | {"prompt": p})
                for p in prompts
            )
        )
    assert [a.json()["usage"]["completion_tokens"] for a in answers] == [500, 500]
    after = await backend.metrics()
    assert after is not None
    assert after.num_preemptions_total is not None
    assert after.num_preemptions_total > before.num_preemptions_total
    assert await counter(small, "vllm:num_preemptions_total") == after.num_preemptions_total
    await backend.aclose()
