"""Prefix warming against the emulator: SGLang recomputes a shared prefix per prefill batch.

20 siblings share a ~2600-token prefix (a ~2170-token system prompt plus
three tools, which the chat template renders into the system turn) and each
adds a unique ~190-token user message. On the SGLang-flavoured emulator
(RadixAttention: a prefix is inserted only after the prefill step that
computed it ran) a burst that lands in one prefill batch computes the
prefix once per member; with warming, one request computes it and the other
19 find it cached. On the vLLM flavour (same-step sharing) `auto` does not
hold anything.

The server is busy when the burst arrives, as a loaded server is: another
client's long prompt (a "blocker", sent straight over HTTP, outside the
scheduler) occupies the engine for one long prefill step, so the whole burst
reaches the engine's next scheduling round together, independent of how fast
this machine sends it. Its tokens are subtracted from the counters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from langgraph_batch.backends import backend_from_url
from langgraph_batch.backends.base import ChatRequest
from langgraph_batch.emulator.tokenizer import count_tokens
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
BLOCKER = " ".join(f"z{j:x}" for j in range(8500))
# SGLang's chunked-prefill size on an H100 (`--chunked-prefill-size 16384`);
# time scale 0.5: the blocker's ~0.45 s prefill step lasts ~0.9 s of wall time.
EMULATOR = {
    "scenario": "echo",
    "output_tokens": 16,
    "max_batched_tokens": 16384,
    "time_scale": 0.5,
}


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


async def _blocker(client: httpx.AsyncClient, url: str) -> int:
    body = {
        "model": "emulated-llama-3-8b",
        "messages": [{"role": "user", "content": BLOCKER}],
        "max_tokens": 1,
    }
    r = await client.post(f"{url}/v1/chat/completions", json=body)
    r.raise_for_status()
    tokens: int = r.json()["usage"]["prompt_tokens"]
    return tokens


async def _run(url: str, scheme: str, mode: str) -> tuple[dict[str, Any], SchedulerStats]:
    """The burst through a Scheduler; emulator counters without the blocker's tokens."""
    backend = backend_from_url(f"{scheme}://{url.removeprefix('http://')}")
    policy = BatchPolicy(inflight_limit=64, prefix_warming=mode)  # type: ignore[arg-type]
    async with httpx.AsyncClient(timeout=30.0) as client:
        (await client.post(f"{url}/emulator/reset")).raise_for_status()
        blocker = asyncio.create_task(_blocker(client, url))
        for _ in range(2500):  # until the blocker is in the engine (at most ~5 s)
            if (await client.get(f"{url}/emulator/stats")).json()["requests"] >= 1:
                break
            await asyncio.sleep(0.002)
        else:
            raise AssertionError("the blocker request never reached the emulator's engine")
        async with Scheduler(backend, policy=policy, owns_backend=True) as s:
            responses = await asyncio.gather(*(s.submit(r) for r in _requests()))
            stats = s.stats()
        blocker_tokens = await blocker
        counters = (await client.get(f"{url}/emulator/stats")).json()
    assert sorted(r.request_id for r in responses) == sorted(f"sib-{i}" for i in range(N))
    assert all(r.content for r in responses)
    assert counters["requests"] == N + 1, counters
    assert counters["preemptions"] == 0, counters
    for k in ("prompt_tokens_received", "prefill_tokens_computed"):
        counters[k] -= blocker_tokens
    return counters, stats


def test_blocker_fits_one_prefill_step() -> None:
    assert 12_000 < count_tokens(BLOCKER) < EMULATOR["max_batched_tokens"]


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
