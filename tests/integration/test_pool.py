"""EndpointPool against real emulator replicas: affinity keeps each sibling's prefix warm.

Each sibling sends a unique ~1500-token context and grows its conversation
over 3 turns. With affinity routing, turns 2 and 3 land on the replica that
cached turn 1, so they prefill only the new tokens; round robin scatters
them and recomputes most prefixes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from langgraph_batch._context import SiblingInfo, sibling_scope
from langgraph_batch.backends import ChatRequest, EndpointPool, VLLMBackend, backend_from_url
from langgraph_batch.errors import BackendConnectionError
from langgraph_batch.scheduler import BatchPolicy, Scheduler

REPLICAS = 3
SIBLINGS = 25  # not a multiple of REPLICAS: lockstep turns would realign round robin
TURNS = 3
MODEL = "emulated-llama-3-8b"


def _context(index: int) -> str:
    rng = random.Random(index)
    words = ("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=4)) for _ in range(1500))
    return f"Sibling {index} document: " + " ".join(words)


async def _sibling(scheduler: Scheduler, index: int) -> None:
    info = SiblingInfo(group="pool-test", index=index, total=SIBLINGS)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You summarise documents."},
        {"role": "user", "content": _context(index)},
    ]
    with sibling_scope(info):
        for turn in range(TURNS):
            request = ChatRequest(model=MODEL, messages=list(messages), params={"max_tokens": 16})
            resp = await scheduler.submit(request, turn=turn, sibling=info)
            messages.append({"role": "assistant", "content": resp.content or ""})
            messages.append({"role": "user", "content": f"Go on with part {turn + 2}."})


async def _sibling_via_model(llm: Any, index: int) -> None:
    """The same conversation through BatchedChatModel (turn 1 is runner-batched)."""
    from langchain_core.messages import HumanMessage, SystemMessage

    messages: list[Any] = [
        SystemMessage("You summarise documents."),
        HumanMessage(_context(index)),
    ]
    with sibling_scope(SiblingInfo(group="pool-model", index=index, total=SIBLINGS)):
        for turn in range(TURNS):
            messages.append(await llm.ainvoke(messages))
            messages.append(HumanMessage(f"Go on with part {turn + 2}."))


async def _stats(client: httpx.AsyncClient, urls: list[str]) -> list[dict[str, Any]]:
    responses = await asyncio.gather(*(client.get(f"{u}/emulator/stats") for u in urls))
    return [r.raise_for_status().json() for r in responses]


async def _run(urls: list[str], routing: str, *, via_model: bool = False) -> dict[str, int]:
    async with httpx.AsyncClient(timeout=30) as client:
        for u in urls:
            (await client.post(f"{u}/emulator/reset")).raise_for_status()
        pool = EndpointPool([VLLMBackend(u) for u in urls], routing=routing)  # type: ignore[arg-type]
        if via_model:
            from langgraph_batch.chat_model import BatchedChatModel

            llm = BatchedChatModel(model=MODEL, backend=pool, max_tokens=16, temperature=0.0)
            try:
                async with asyncio.TaskGroup() as tg:
                    for i in range(SIBLINGS):
                        tg.create_task(_sibling_via_model(llm, i))
            finally:
                await llm.get_scheduler().aclose()
                await pool.aclose()
        else:
            scheduler = Scheduler(pool, policy=BatchPolicy(inflight_limit=64), owns_backend=True)
            async with scheduler, asyncio.TaskGroup() as tg:
                for i in range(SIBLINGS):
                    tg.create_task(_sibling(scheduler, i))
        stats = await _stats(client, urls)
    return {
        "prefill": sum(st["prefill_tokens_computed"] for st in stats),
        "cached": sum(st["cached_tokens"] for st in stats),
        "requests": sum(st["requests"] for st in stats),
        "replicas_used": sum(1 for st in stats if st["requests"]),
    }


@pytest.fixture
def replicas(start_emulator: Callable[..., str]) -> list[str]:
    return [start_emulator(profile="zero", output_tokens=16) for _ in range(REPLICAS)]


async def test_affinity_prefills_far_fewer_tokens_than_round_robin(replicas: list[str]) -> None:
    affinity = await _run(replicas, "affinity")
    round_robin = await _run(replicas, "round_robin")
    report = (affinity, round_robin)
    assert affinity["requests"] == round_robin["requests"] == SIBLINGS * TURNS, report
    assert affinity["replicas_used"] == round_robin["replicas_used"] == REPLICAS, report
    # Affinity: each context is prefilled once (turn 1), later turns only add a few tokens.
    # Round robin hits a sibling's own replica on about 1 turn in 3 -> ratio ~0.45.
    assert affinity["prefill"] < 0.65 * round_robin["prefill"], report
    assert affinity["prefill"] < 1.2 * SIBLINGS * 1600, report  # ~ one prefill per context
    assert affinity["cached"] > 1.5 * round_robin["cached"], report


async def test_affinity_through_batched_chat_model(replicas: list[str]) -> None:
    # Turn 1 (no assistant message yet) is merged by the scheduler's runner into
    # complete_batch, outside the sibling's context; turns 2-3 must still find it.
    stats = await _run(replicas, "affinity", via_model=True)
    assert stats["requests"] == SIBLINGS * TURNS, stats
    assert stats["prefill"] < 1.2 * SIBLINGS * 1600, stats


async def test_host_list_url_and_failover(replicas: list[str]) -> None:
    hosts = ",".join(u.removeprefix("http://") for u in replicas)
    dead = "127.0.0.1:9"  # discard port: connection refused
    pool = backend_from_url(f"vllm://{dead},{hosts}", timeout=10.0)
    assert isinstance(pool, EndpointPool)
    async with pool:
        assert await pool.health()
        assert {m.id for m in await pool.models()} == {MODEL}
        # Which conversations the ring gives the dead replica depends on the ports:
        # go on until one did (every call must still succeed, by failing over).
        for i in range(200):
            with sibling_scope(SiblingInfo(group="failover", index=i)):
                resp = await pool.chat(
                    ChatRequest(
                        model=MODEL,
                        messages=[{"role": "user", "content": f"q{i}"}],
                        params={"max_tokens": 4},
                    )
                )
            assert resp.content
            if i >= 11 and pool.is_down(0):
                break
        assert pool.is_down(0)
        metrics = await pool.metrics()
        assert metrics is not None
        assert metrics.kv_capacity_tokens is not None
        assert metrics.kv_capacity_tokens > 0
    only_dead = backend_from_url(f"vllm://{dead},127.0.0.1:7", timeout=5.0)
    async with only_dead:
        with pytest.raises(BackendConnectionError):
            await only_dead.chat(
                ChatRequest(model=MODEL, messages=[{"role": "user", "content": "x"}])
            )
