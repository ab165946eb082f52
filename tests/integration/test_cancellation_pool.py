"""Cancellation never poisons the connection pool (issue 10, item 1).

200 concurrent callers go through `BatchedChatModel` (scheduler, real HTTP,
the emulator process); 1,000 of them are cancelled at random points: queued
in the scheduler, waiting for the response, mid-stream, and some twice (a
second cancellation during cleanup is what interrupted httpcore's own
cleanup). Before the transport seam, httpcore kept connections that no
request owned and later calls waited forever. Afterwards every fresh call must
complete, the pools must be idle (asserted through the transport's own
`state()`), and no task or queued request may be left behind.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from langgraph_batch.backends import ChatRequest, VLLMBackend
from langgraph_batch.backends.openai_compat import OpenAICompatibleBackend
from langgraph_batch.chat_model import BatchedChatModel

MODEL = "emulated-llama-3-8b"
N = 200
CANCELS = 1000


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    # Debug mode records a stack per task; with thousands of tasks it dominates.
    return ("asyncio", {"debug": False})


async def _wait_idle(backend: OpenAICompatibleBackend) -> Any:
    async with asyncio.timeout(10):
        while True:
            state = backend.transport.state()
            if state.requests_active == 0 and state.connections_active == 0:
                return state
            await asyncio.sleep(0.05)


async def _storm(make_call: Callable[[int], Any], cancels: int, rng: random.Random) -> int:
    """N concurrent callers; cancel `cancels` of them at random points (20% twice)."""
    tasks: set[asyncio.Task[Any]] = set()
    done = 0

    async def call(i: int) -> None:
        nonlocal done
        await make_call(i)
        done += 1

    cancelled = i = 0
    while cancelled < cancels:
        while len(tasks) < N:
            t = asyncio.create_task(call(i))
            i += 1
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        await asyncio.sleep(rng.uniform(0, 0.01))
        victims = rng.sample(sorted(tasks, key=id), min(len(tasks), rng.randint(1, 6)))
        for victim in victims:
            victim.cancel()
        if rng.random() < 0.3:
            # A second cancellation while the first one's cleanup runs.
            await asyncio.sleep(0)
            victims[0].cancel()
        cancelled += len(victims)
    for t in list(tasks):
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return done


async def test_1000_random_cancellations_leave_a_healthy_idle_pool(
    start_emulator: Callable[..., str],
) -> None:
    url = await asyncio.to_thread(start_emulator, scenario="echo", output_tokens=160)
    # Fewer connections than callers: requests wait for a connection, and a
    # connection that no request owns takes a slot that a later request waits
    # for (forever, before this seam: httpcore had no pool timeout set).
    backend = VLLMBackend(url, limits=httpx.Limits(max_connections=64))
    llm = BatchedChatModel(
        model=MODEL, backend=backend, max_inflight=64, max_retries=0, max_tokens=160
    )
    streaming = llm.model_copy(update={"streaming": True})
    scheduler = llm.get_scheduler()
    before = asyncio.all_tasks()
    rng = random.Random(10)

    async def direct(i: int) -> None:
        messages = [{"role": "user", "content": f"caller {i}"}]
        await backend.chat(
            ChatRequest(
                model=MODEL, messages=messages, params={"max_tokens": 160}, stream=bool(i % 2)
            )
        )

    async def through_the_scheduler(i: int) -> None:
        model = streaming if i % 2 else llm
        if i % 4 == 1:
            async for _ in model.astream(f"caller {i}"):
                pass
        else:
            await model.ainvoke(f"caller {i}")

    async with asyncio.timeout(90):
        # 200 callers on the backend itself (beyond its 64 connections), then 200
        # through the scheduler (queued there beyond max_inflight).
        finished = await _storm(direct, CANCELS // 2, rng)
        finished += await _storm(through_the_scheduler, CANCELS // 2, rng)
    assert finished > 0  # calls also completed between the cancellations

    state = await _wait_idle(backend)
    assert state.requests_waiting == 0
    assert state.pools_draining == 0
    stats = scheduler.stats()
    assert (stats.queued, stats.in_flight) == (0, 0)
    assert scheduler.inflight_by_sibling() == {}

    # Every fresh call completes (the pool is not poisoned), streams included.
    async with asyncio.timeout(30):
        answers = await asyncio.gather(
            *(llm.ainvoke(f"fresh {k}") for k in range(N // 2)),
            *(streaming.ainvoke(f"fresh {k}") for k in range(N // 2)),
        )
    assert all(a.text for a in answers)
    state = await _wait_idle(backend)
    assert state.connections_idle > 0  # connections were kept alive and reused

    await scheduler.aclose()
    await backend.aclose()
    await asyncio.sleep(0)
    leftover = {t for t in asyncio.all_tasks() - before if not t.done()}
    assert leftover == set(), [t.get_name() for t in leftover]
