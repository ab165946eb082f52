"""1,000 concurrent streaming requests against one emulator subprocess."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

N = 1000


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_thousand_concurrent_streams(start_emulator: Callable[..., str]) -> None:
    # Starting a process blocks: do it off the event loop.
    url = await asyncio.to_thread(start_emulator, time_scale=5.0, scenario="echo")
    limits = httpx.Limits(max_connections=N + 10, max_keepalive_connections=N + 10)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one(i: int) -> int:
            body = {
                "model": "emulated-llama-3-8b",
                "stream": True,
                "stream_options": {"include_usage": True},
                "max_tokens": 8,
                "messages": [
                    {"role": "system", "content": "You are a careful agent. " * 40},
                    {"role": "user", "content": f"task {i} key=k{i % 10}"},
                ],
            }
            completion = -1
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        if chunk.get("usage"):
                            completion = chunk["usage"]["completion_tokens"]
            return completion

        results = await asyncio.gather(*(one(i) for i in range(N)))
        stats = (await client.get("/emulator/stats")).json()
        metrics = (await client.get("/metrics")).text
    assert results == [8] * N
    assert stats["finished"] == N
    assert stats["generation_tokens"] == 8 * N
    # The shared system prompt is computed once per step wave, not 1000 times.
    assert stats["cached_tokens"] > 0.5 * stats["prompt_tokens_received"]
    # The engine reports how far behind schedule the host made it run.
    assert "emulator:max_lag_seconds" in metrics
    assert stats["max_lag_s"] >= 0.0
    assert stats["max_lag_s"] < 5.0
