"""vLLM 0.32's native CPU offload tier (`--kv-offloading-size`), one rule per test.

Each expected value is derived by hand from vLLM's code, named in the test's
docstring (paths under `vllm/distributed/kv_transfer/kv_connector/v1/offloading/`
(`scheduler.py`), `vllm/v1/kv_offload/` and `vllm/v1/core/sched/scheduler.py`).
The engines are tiny: 16-token blocks, 3 usable GPU blocks (and the null block),
so a finished request's prefix leaves the GPU cache as soon as another one
needs the room. `a0`, `a1` are A's first and second full blocks.

The real CPU engine refuses the tier (`CPUOffloadingSpec.get_worker`: "CPU
Offloading is currently only supported on CUDA-alike and XPU GPUs"), so these
rules are held to vLLM's source only, not to a running engine.
"""

from __future__ import annotations

import pytest

from langgraph_batch.backends import parse_prometheus
from langgraph_batch.emulator import EmulatorConfig
from langgraph_batch.emulator._server_metrics import render_metrics
from langgraph_batch.emulator._serving import Serving
from langgraph_batch.emulator.costs import get_profile
from langgraph_batch.emulator.engine import Engine, Request, simulate

ZERO = get_profile("zero")
BS = 16


def _engine(gpu_blocks: int = 3, tier_blocks: int | None = 4, **kw: object) -> Engine:
    """`gpu_blocks` usable GPU blocks (the null block besides) and a tier of `tier_blocks`."""
    offload = None if tier_blocks is None else BS * tier_blocks
    profile = kw.pop("profile", ZERO)
    return Engine(
        profile=profile,  # type: ignore[arg-type]
        kv_tokens=BS * (gpu_blocks + 1),
        max_batched_tokens=kw.pop("budget", 256),  # type: ignore[arg-type]
        offload_tokens=offload,
    )


def _req(rid: str, prompt: list[int], out: int = 1) -> Request:
    return Request(request_id=rid, prompt_ids=prompt, output_ids=list(range(90_000, 90_000 + out)))


def _ids(n: int, start: int) -> list[int]:
    return list(range(start, start + n))


def _run(engine: Engine, *reqs: Request) -> None:
    """Each request alone, one after the other."""
    for r in reqs:
        simulate(engine, [(0.0, r)])


def _hashes(engine: Engine, req: Request) -> list[int]:
    full = req.prompt_len // BS
    return engine.kv.block_hashes(req, full)[:full]


def test_prompt_blocks_are_stored_as_they_are_computed_prompt_only() -> None:
    """Full prompt blocks go to the tier at the step that computes them; output never.

    `_build_store_jobs` offers, per scheduled request, the full blocks up to
    `num_computed_tokens + num_scheduled_tokens`, capped at the prompt by
    `_calc_num_offloadable_tokens` (`offload_prompt_only`, True by default in
    `OffloadingSpec.__init__`). A: 64 prompt tokens, 20 output, budget 32, so
    chunks of 32: after step 1, 2 blocks; after step 2, 4; the 20 output
    tokens (84 tokens: 5 full blocks) add none.
    """
    engine = _engine(gpu_blocks=8, tier_blocks=8, budget=32)
    tier = engine.offload
    assert tier is not None
    a = _req("A", _ids(64, 1), out=20)
    engine.add_request(a)
    stored = []
    while (step := engine.schedule(0.0)) is not None:
        stored.append(tier.num_stored)  # at scheduling, before the step ran
        engine.commit(step, 0.0)
    assert stored[:2] == [2, 4]
    assert set(stored[2:]) == {4}
    # Finished: every block it offered was used, head last (`on_request_finished`).
    assert tier.lru_order() == _hashes(engine, a)[::-1]
    assert tier.counters.store_bytes == 4 * BS * ZERO.kv_bytes_per_token


def test_capacity_from_kv_offloading_size_in_whole_blocks() -> None:
    """`--kv-offloading-size` GiB becomes whole blocks of the profile's KV bytes.

    `VllmConfig._post_init_kv_transfer_config`: `cpu_bytes_to_use = GiB * 2**30`;
    `CPUOffloadingSpec.__init__`: `num_chunks = cpu_bytes // bytes_per_chunk`
    (one block per chunk). h100-llama3-8b: 131,072 B/token x 16 = 2 MiB a block,
    1 GiB = 512 blocks = 8,192 tokens. cpu-tiny: 512 B x 32 = 16 KiB a block;
    0.001 GiB = 1,073,741 B -> 65 blocks = 2,080 tokens.
    """
    assert EmulatorConfig(kv_offloading_size=1.0).offload_tokens == 8192
    cfg = EmulatorConfig(profile="cpu-tiny", block_size=32, kv_offloading_size=0.001)
    assert cfg.offload_tokens == 2080
    assert EmulatorConfig(kv_offload_tokens=4096).offload_tokens == 4096
    assert EmulatorConfig().offload_tokens is None
    engine = Serving(cfg).engine
    assert engine.offload is not None
    assert engine.offload.num_blocks == 65
    with pytest.raises(ValueError, match="not both"):
        EmulatorConfig(kv_offloading_size=1.0, kv_offload_tokens=16)
    with pytest.raises(ValueError, match="must hold a block"):
        EmulatorConfig(kv_offloading_size=1e-9)


def test_a_gpu_miss_that_hits_the_tier_is_loaded_not_computed() -> None:
    """A prefix evicted from the GPU comes back from the tier.

    A and B: 33 prompt tokens + 1 output (3 blocks each: 2 full + 1). The GPU
    holds 3, so B takes A's partial block and then a1 and a0 (`free_blocks`
    put them at the back, tail first): A is gone from the GPU. A again: the GPU
    lookup finds nothing (`get_computed_blocks`); the connector, asked from
    block 0 (`get_num_new_matched_tokens` -> `_lookup_complete_chunks`), finds
    a0 a1: 32 tokens loaded. 33 - 32 = 1 token is computed. `cached_tokens` is
    local + external (`PrefillStats.set`): 32; `vllm:prefix_cache_hits` 0,
    `vllm:external_prefix_cache_{queries,hits}` 33 - 0 = 33 and 32
    (`Scheduler.schedule`: `connector_prefix_cache_queries = num_tokens -
    num_new_local_computed_tokens`). Without the tier A recomputes all 33.
    """
    for tier_blocks, computed, cached in ((4, 1, 32), (None, 33, 0)):
        engine = _engine(tier_blocks=tier_blocks)
        a, b, a2 = _req("A", _ids(33, 1)), _req("B", _ids(33, 500)), _req("A2", _ids(33, 1))
        _run(engine, a, b)
        before = engine.counters.prefill_tokens_computed
        _run(engine, a2)
        assert engine.counters.prefill_tokens_computed - before == computed
        assert a2.cached_tokens == cached
        assert engine.counters.prefix_cache_hits == 0
    engine = _engine()
    _run(engine, _req("A", _ids(33, 1)), _req("B", _ids(33, 500)), _req("A2", _ids(33, 1)))
    assert engine.offload is not None
    t = engine.offload.counters
    assert (t.external_queries, t.external_hits) == (33 + 33 + 33, 32)
    assert t.loaded_tokens == 32


def test_a_hit_of_every_token_recomputes_the_last_one() -> None:
    """A block-aligned prompt found whole in the tier computes its last token again.

    A: 32 tokens (2 full blocks), evicted from the GPU by B. The connector's
    lookup may cover all `num_tokens` (`_lookup_complete_chunks`:
    `max_hit_size_tokens = num_tokens`), 32; after the load
    `_update_waiting_for_remote_kv` sets `num_computed_tokens = num_tokens - 1`:
    1 token computed, `cached_tokens` 32 (local 0 + external 32).
    """
    engine = _engine()
    _run(engine, _req("A", _ids(32, 1)), _req("B", _ids(40, 500)))
    a2 = _req("A2", _ids(32, 1))
    before = engine.counters.prefill_tokens_computed
    _run(engine, a2)
    assert engine.counters.prefill_tokens_computed - before == 1
    assert a2.cached_tokens == 32


def test_the_tier_evicts_least_recently_used_tail_first() -> None:
    """LRU over the tier: stored or used by a finished request is recent; tail first.

    Tier of 4 blocks; A, B of 33 tokens, then A again, then C of 33 tokens,
    then D of 17. `LRUCachePolicy` ranks: `insert` a0 1, a1 2; A finishes
    (`on_request_finished`, tail first) a1 3, a0 4; b0 5, b1 6; B finishes
    b1 7, b0 8. A again loads a0 a1 (its offer of them finds them stored:
    `prepare_store` keeps them, as reused); it finishes: a1 9, a0 10. C needs
    2 chunks in a full tier (`prepare_store`): evicts b1 (7), b0 (8). C: c0 11,
    c1 12, finishes c1 13, c0 14. D needs 1: evicts a1 (9), A's tail; a0 stays.
    """
    engine = _engine()
    tier = engine.offload
    assert tier is not None
    a, b = _req("A", _ids(33, 1)), _req("B", _ids(33, 500))
    c, d = _req("C", _ids(33, 1000)), _req("D", _ids(17, 2000))
    _run(engine, a, b, _req("A2", _ids(33, 1)))
    (a0, a1), (b0, b1) = _hashes(engine, a), _hashes(engine, b)
    assert tier.lru_order() == [b1, b0, a1, a0]
    _run(engine, c)
    c0, c1 = _hashes(engine, c)
    assert tier.lru_order() == [a1, a0, c1, c0]
    _run(engine, d)
    (d0,) = _hashes(engine, d)
    assert tier.lru_order() == [a0, c1, c0, d0]
    assert tier.counters.evicted_blocks == 3


def test_a_preempted_request_loads_its_prompt_back() -> None:
    """Preemption by recompute becomes a load for the prompt the tier holds.

    4 usable GPU blocks, tier of 8. R1, R2: 32 prompt tokens, 20 output, admitted
    together (2 blocks each, both prompts stored). R1's first decode needs a
    third block: the last running request, R2, is preempted
    (`Scheduler._preempt_request`) and R1 takes R2's freed blocks as it grows
    (49 tokens: 4 blocks). When R1 finishes, R2 is looked up again
    (`num_computed_tokens == 0`): its GPU blocks are gone, the tier holds its
    2 prompt blocks: 32 tokens loaded, and of its 33 known tokens only the
    generated one is computed. Prefill computed: 32 + 32 with the tier, 32 +
    32 + 32 without. The load is not an external hit in the counters: vLLM
    records a re-admitted request's hits as `preempted_*` (`PrefixCacheStats.record`).
    """
    for tier_blocks, prefill in ((8, 64), (None, 96)):
        engine = _engine(gpu_blocks=4, tier_blocks=tier_blocks)
        r1, r2 = _req("R1", _ids(32, 1), out=20), _req("R2", _ids(32, 500), out=20)
        simulate(engine, [(0.0, r1), (0.0, r2)])
        assert engine.counters.preemptions == 1
        assert r2.num_preemptions == 1
        assert engine.counters.prefill_tokens_computed == prefill
        assert r2.finished
        if engine.offload is not None:
            # Loaded, but a re-admission's hits count as `preempted_*` (PrefixCacheStats.record).
            assert engine.offload.counters.loaded_tokens == 32
            assert engine.offload.counters.external_hits == 0


def test_an_offer_larger_than_the_evictable_tier_stores_nothing() -> None:
    """`prepare_store` fails the whole offer when too few chunks are evictable.

    Tier of 2 blocks, A of 49 tokens (3 full blocks): the admitting step offers
    3 new blocks with 2 free and none evictable: `prepare_store` returns None,
    `vllm:kv_offload_allocation_failure` +1, nothing stored, and
    `next_stored_chunk_idx` does not move, so the finished request's last
    offer (`_build_store_jobs` over `finished_req_ids`) fails again: 2.
    """
    engine = _engine(gpu_blocks=8, tier_blocks=2)
    tier = engine.offload
    assert tier is not None
    _run(engine, _req("A", _ids(49, 1)))
    assert tier.num_stored == 0
    assert tier.counters.allocation_failures == 2


def test_a_load_costs_the_transfer_time_of_its_bytes() -> None:
    """The step that admits a loaded request waits for the transfer.

    h100-llama3-8b: 131,072 KV bytes a token over a 51.2 GB/s host link (PCIe
    Gen5 x16's 64 GB/s at 80%): A's 32 loaded tokens are 4,194,304 bytes,
    81.92 us, added to the step's modelled compute time.
    """
    engine = _engine(profile=get_profile("h100-llama3-8b"))
    _run(engine, _req("A", _ids(33, 1)), _req("B", _ids(33, 500)))
    engine.add_request(_req("A2", _ids(33, 1)))
    step = engine.schedule(0.0)
    assert step is not None
    assert step.duration - engine.profile.step_time(step.shape) == pytest.approx(81.92e-6)
    assert engine.offload is not None
    assert engine.offload.counters.load_time_s == pytest.approx(81.92e-6)


def test_metrics_report_the_tier_as_vllm_does() -> None:
    """`/metrics` carries the connector's counters, and the tier in `cache_config_info`.

    `PrometheusStatLogger` (`v1/metrics/loggers.py`): `vllm:external_prefix_cache_
    {queries,hits}`, `vllm:prompt_tokens_cached_by_source{source=device|host}`;
    the connector's `vllm:kv_offload_{store,load}_bytes`
    (`offloading/metrics.py`); `vllm:cache_config_info` labels every
    `CacheConfig` field (`metrics_info`), `kv_offloading_size` among them.
    The stream of the load test: 2 + 2 blocks stored (A, B), 2 loaded.
    """
    serving = Serving(EmulatorConfig(kv_tokens=BS * 4, kv_offload_tokens=BS * 4))
    engine = serving.engine
    _run(engine, _req("A", _ids(33, 1)), _req("B", _ids(33, 500)), _req("A2", _ids(33, 1)))
    s = parse_prometheus(render_metrics(serving))
    block_bytes = BS * engine.profile.kv_bytes_per_token
    assert s.sum("vllm:external_prefix_cache_hits_total") == 32
    assert s.sum("vllm:external_prefix_cache_queries_total") == 99
    assert s.sum("vllm:kv_offload_store_bytes_total") == 4 * block_bytes
    assert s.sum("vllm:kv_offload_load_bytes_total") == 2 * block_bytes
    by_source = {
        labels["source"]: v for labels, v in s.get("vllm:prompt_tokens_cached_by_source_total")
    }
    assert by_source == {"device": 0, "host": 32}
    ((labels, _),) = s.get("vllm:cache_config_info")
    assert float(labels["kv_offloading_size"]) == BS * 4 * engine.profile.kv_bytes_per_token / (
        1 << 30
    )
    plain = parse_prometheus(render_metrics(Serving(EmulatorConfig())))
    ((labels, _),) = plain.get("vllm:cache_config_info")
    assert labels["kv_offloading_size"] == "None"
    assert plain.get("vllm:kv_offload_store_bytes_total") == []
