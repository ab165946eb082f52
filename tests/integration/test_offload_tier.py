"""Pausing into a second KV tier: a paused sibling's context comes back by transfer.

The long-horizon job of `test_long_horizon.py` (twelve agents of eight turns,
~100k tokens of contexts against a 48k-token cache) runs as a `fan_out` on two
emulators alike but for one thing: the second has vLLM's native CPU offload
tier (`kv_offload_tokens`, `langgraph_batch/emulator/offload.py`), which its
`/metrics` reports, so the gate pauses into it. On both the gate pauses
siblings; with the tier their prompts were written to host memory as they
were computed, and a resumed sibling loads its context instead of computing it
again: the server computes fewer prefill tokens.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from langgraph_batch.chat_model import BatchedChatModel
from tests.integration.test_long_horizon import (
    KV_TOKENS,
    MODEL,
    N,
    agent_graph,
    answered,
    fan_out_graph,
    read,
    stats,
    task,
)

pytestmark = pytest.mark.timeout(180)

OFFLOAD_TOKENS = 400_000
"""Host memory for ~4x the contexts: every paused context fits beside the live ones."""


async def _run(url: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    llm = BatchedChatModel(model=MODEL, base_url=url.replace("http", "vllm", 1))
    events: list[dict[str, Any]] = []
    final: dict[str, Any] = {}
    graph = fan_out_graph(agent_graph(llm, [read]))
    tasks = [task(i) for i in range(N)]
    async for mode, data in graph.astream({"tasks": tasks}, stream_mode=["custom", "values"]):
        if mode == "custom":
            events.append(data)
        else:
            final = data
    assert all(answered(m, i) for i, m in enumerate(final["results"]))
    ledger = await llm.get_scheduler().kv_ledger()
    assert ledger is not None
    return {"offload_capacity": ledger.offload_capacity}, events


async def test_paused_siblings_come_back_by_transfer_with_less_prefill(
    start_emulator: Callable[..., str],
) -> None:
    plain_url, tier_url = await asyncio.gather(
        asyncio.to_thread(start_emulator, kv_tokens=KV_TOKENS),
        asyncio.to_thread(start_emulator, kv_tokens=KV_TOKENS, kv_offload_tokens=OFFLOAD_TOKENS),
    )
    # One after the other: run side by side on a loaded host, one of them may not
    # outgrow the cache at all (its siblings' timing spreads), which compares nothing.
    plain_ledger, plain_events = await _run(plain_url)
    tier_ledger, tier_events = await _run(tier_url)
    plain, tier = await asyncio.gather(
        asyncio.to_thread(stats, plain_url), asyncio.to_thread(stats, tier_url)
    )
    # The library learned the tier from the server's /metrics (and no tier from the other).
    assert plain_ledger["offload_capacity"] is None
    assert tier_ledger["offload_capacity"] == OFFLOAD_TOKENS
    for events, served in ((plain_events, plain), (tier_events, tier)):
        done = next(e for e in events if e["event"] == "done")
        assert done["pauses"] > 0, done  # the contexts outgrew the cache on both
        assert served["preemptions"] == 0
    # With the tier, contexts the GPU lost were loaded from host memory ...
    assert tier["offload"]["external_hits"] > 0, tier["offload"]
    assert tier["offload"]["loaded_tokens"] >= tier["offload"]["external_hits"]
    # ... not computed again.
    assert tier["prefill_tokens_computed"] < plain["prefill_tokens_computed"], (tier, plain)
