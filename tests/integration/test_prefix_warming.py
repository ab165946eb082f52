"""Prefix warming against the emulator: SGLang recomputes a shared prefix per prefill batch.

20 siblings share a ~2600-token prefix (a ~2170-token system prompt plus
three tools, which the chat template renders into the system turn) and each
adds a unique ~190-token user message. On the SGLang-flavoured emulator
(RadixAttention: a prefix is inserted only after the prefill step that
computed it ran) the burst lands in one prefill batch and every member of
it computes the prefix again; with warming, one request computes it and the
other 19 find it cached. On the vLLM flavour (same-step sharing) `auto`
does not hold anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from langgraph_batch.backends import backend_from_url
from langgraph_batch.backends.base import ChatRequest
from langgraph_batch.scheduler import BatchPolicy, Scheduler, SchedulerStats

N = 20
_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "theta",
    "kappa",
    "lambda",
    "sigma",
    "omega",
]
SYSTEM = "You review code. " + " ".join(f"{_WORDS[i % 11]}{i}" for i in range(1000))
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{k}",
            "description": "Looks things up: " + " ".join(_WORDS),
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    for k in range(3)
]
# SGLang's chunked-prefill size on an H100 (`--chunked-prefill-size 16384`).
EMULATOR = {"scenario": "echo", "output_tokens": 16, "max_batched_tokens": 16384}


def _requests() -> list[ChatRequest]:
    return [
        ChatRequest(
            model="emulated-llama-3-8b",
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": " ".join(f"u{i}w{j}" for j in range(100))},
            ],
            params={"tools": TOOLS, "max_tokens": 16},
            request_id=f"sib-{i}",
        )
        for i in range(N)
    ]


async def _run(url: str, scheme: str, mode: str) -> tuple[dict[str, Any], SchedulerStats]:
    async with httpx.AsyncClient() as client:
        (await client.post(f"{url}/emulator/reset")).raise_for_status()
    backend = backend_from_url(f"{scheme}://{url.removeprefix('http://')}")
    policy = BatchPolicy(max_inflight=64, prefix_warming=mode)  # type: ignore[arg-type]
    async with Scheduler(backend, policy=policy, owns_backend=True) as s:
        responses = await asyncio.gather(*(s.submit(r) for r in _requests()))
        stats = s.stats()
    assert sorted(r.request_id for r in responses) == sorted(f"sib-{i}" for i in range(N))
    assert all(r.content for r in responses)
    async with httpx.AsyncClient() as client:
        counters = (await client.get(f"{url}/emulator/stats")).json()
    assert counters["requests"] == N, counters
    return counters, stats


async def test_sglang_warming_computes_the_shared_prefix_once(
    start_emulator: Callable[..., str],
) -> None:
    url = await asyncio.to_thread(start_emulator, flavor="sglang", **EMULATOR)
    off, off_stats = await _run(url, "sglang", "off")
    on, on_stats = await _run(url, "sglang", "auto")  # auto = on for SGLang
    assert off["prompt_tokens_received"] == on["prompt_tokens_received"]
    ratio = on["prefill_tokens_computed"] / off["prefill_tokens_computed"]
    print(
        f"prefill tokens computed: warming {on['prefill_tokens_computed']}, "
        f"none {off['prefill_tokens_computed']} (ratio {ratio:.2f})"
    )
    assert ratio <= 0.5, (on, off)
    # One request computed the prefix; the other N-1 found it cached.
    per_request = on["prompt_tokens_received"] / N
    assert on["prefill_tokens_computed"] < 2 * per_request + (N - 1) * 0.2 * per_request
    assert (off_stats.warmups, off_stats.warm_held) == (0, 0)
    assert (on_stats.warmups, on_stats.warm_held) == (1, N - 1)
    assert on_stats.completed == N


async def test_vllm_auto_does_not_hold(start_emulator: Callable[..., str]) -> None:
    url = await asyncio.to_thread(start_emulator, flavor="vllm", **EMULATOR)
    counters, stats = await _run(url, "vllm", "auto")
    assert (stats.warmups, stats.warm_held, stats.completed) == (0, 0, N)
    # vLLM V1 shares the prefix among requests of the same step on its own.
    per_request = counters["prompt_tokens_received"] / N
    assert counters["prefill_tokens_computed"] < 2 * per_request + (N - 1) * 0.2 * per_request
