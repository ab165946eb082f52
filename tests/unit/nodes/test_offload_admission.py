"""A server with a second KV tier: detected from its metrics, and the gate pauses into it.

vLLM's native CPU offload (`--kv-offloading-size`) keeps prompt blocks in host
memory as they are computed, so a paused sibling whose context the tier still
holds comes back by a transfer, not a recompute (the rules:
`langgraph_batch/emulator/offload.py`, `tests/unit/emulator/test_offload_rules.py`).
"""

from __future__ import annotations

import asyncio

import pytest

from langgraph_batch._context import SiblingInfo
from langgraph_batch.backends.base import EngineMetrics
from langgraph_batch.backends.vllm import parse_vllm_metrics
from langgraph_batch.emulator import EmulatorConfig
from langgraph_batch.emulator._server_metrics import render_metrics
from langgraph_batch.emulator._serving import Serving
from langgraph_batch.nodes._admission import SiblingAdmission
from langgraph_batch.scheduler import BatchPolicy, Scheduler
from langgraph_batch.scheduler._capacity import KVLedger
from tests.fakes.backends import MetricsBackend


def _detected(**config: object) -> int | None:
    text = render_metrics(Serving(EmulatorConfig(kv_tokens=8192, **config)))  # type: ignore[arg-type]
    return parse_vllm_metrics(text).kv_offload_tokens


def test_the_tier_is_read_from_cache_config_info() -> None:
    # h100-llama3-8b: 2 MiB a 16-token block; 1 GiB = 512 blocks = 8,192 tokens.
    assert _detected(kv_offloading_size=1.0) == 8192
    assert _detected(kv_offload_tokens=32_768) == 32_768
    assert _detected() is None


def test_a_tier_in_gib_without_the_bytes_of_a_token_is_unknown() -> None:
    # vLLM labels kv_cache_memory_bytes "None" unless started with --kv-cache-memory-bytes.
    line = (
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="100",'
        'kv_cache_size_tokens="1600",kv_cache_memory_bytes="None",'
        'kv_offloading_size="4.0",engine="0",model_name="m"} 1.0\n'
    )
    metrics = parse_vllm_metrics(line)
    assert metrics.kv_capacity_tokens == 1600
    assert metrics.kv_offload_tokens is None


async def test_the_ledger_takes_the_servers_tier_else_the_policys() -> None:
    said = MetricsBackend(
        EngineMetrics(kv_capacity_tokens=40_000, kv_offload_tokens=100_000), open_gate=True
    )
    ledger = await Scheduler(said, policy=BatchPolicy(kv_offload_tokens=5)).kv_ledger()
    assert ledger is not None
    assert ledger.offload_capacity == 100_000  # the server's word wins
    silent = MetricsBackend(EngineMetrics(kv_capacity_tokens=40_000), open_gate=True)
    ledger = await Scheduler(silent, policy=BatchPolicy(kv_offload_tokens=60_000)).kv_ledger()
    assert ledger is not None
    assert ledger.offload_capacity == 60_000
    plain = await Scheduler(MetricsBackend(EngineMetrics(kv_capacity_tokens=40_000))).kv_ledger()
    assert plain is not None
    assert plain.offload_capacity is None
    with pytest.raises(ValueError, match="kv_offload_tokens"):
        BatchPolicy(kv_offload_tokens=0)
    with pytest.raises(ValueError, match="offload_capacity"):
        KVLedger(100, offload_capacity=0)


async def _grown(ledger: KVLedger) -> tuple[SiblingAdmission, list[SiblingInfo]]:
    """Four idle siblings whose bookings outgrow a 10,600-token budget.

    Contexts 1,000 each (bookings 2,000), then sibling 0 grows to 2,500 (the
    growth estimate becomes 1,500): bookings 4,000 + 3 x 2,500 = 11,500, 900 over.
    """
    gate = SiblingAdmission(kv_ledger=ledger, kv_headroom=1.0, sibling_tokens=1000)
    sibs = [SiblingInfo(group="g", index=i) for i in range(4)]
    for s in sibs:
        s.admission = gate
        await gate.acquire(s, returning=False)
        s.context_tokens = 1000
    for s in sibs:
        await s.tool_enter("t")
    await sibs[0].tool_exit()
    sibs[0].context_tokens = 2500
    await sibs[0].tool_enter("t")
    return gate, sibs


async def test_with_room_in_the_tier_the_largest_idle_context_is_paused() -> None:
    # Tier 20,000: room = 20,000 - (11,500 booked + 0 paused) = 8,500; every idle
    # context fits, the largest (sibling 0, 2,500) goes first and alone clears the 900.
    gate, sibs = await _grown(KVLedger(10_600, offload_capacity=20_000))
    assert [gate.is_paused(s) for s in sibs] == [True, False, False, False]
    assert gate.paused_tokens() == 2500
    ledger = gate.kv_ledger
    assert ledger is not None
    assert ledger.paused_tokens() == 2500
    # 20,000 - (3 x 2,500 booked + 2,500 paused) = 10,000.
    assert ledger.offload_room(1.0) == 10_000
    # Back from its tool it waits for room: 7,500 + its 4,000 > 10,600, until one finishes.
    back = asyncio.create_task(sibs[0].tool_exit())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not back.done()
    gate.finish(sibs[3])
    await asyncio.wait_for(back, 10)
    assert gate.holds(sibs[0])
    assert gate.paused_tokens() == 0


async def test_without_room_in_the_tier_the_latest_admitted_is_paused() -> None:
    # Tier 12,000: room 500, no context fits; as without a tier, sibling 3 is paused.
    for ledger in (KVLedger(10_600, offload_capacity=12_000), KVLedger(10_600)):
        gate, sibs = await _grown(ledger)
        assert [gate.is_paused(s) for s in sibs] == [False, False, False, True]
