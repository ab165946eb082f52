"""The step loop, KV cache, prefix caching and preemption, in virtual time."""

from __future__ import annotations

import pytest

from langgraph_batch.emulator.costs import get_profile
from langgraph_batch.emulator.engine import Engine, Request, RequestStatus, simulate

H100 = get_profile("h100-llama3-8b")


def _req(rid: str, prompt: list[int], out: int = 4, **kw: object) -> Request:
    return Request(request_id=rid, prompt_ids=prompt, output_ids=[7] * out, **kw)  # type: ignore[arg-type]


SHARED = list(range(1000, 1000 + 2048))


def test_vllm_same_step_prefix_sharing() -> None:
    engine = Engine(profile=H100)
    reqs = [_req(str(i), [*SHARED, *range(10 * i, 10 * i + 40)]) for i in range(8)]
    simulate(engine, [(0.0, r) for r in reqs])
    # Arriving together, all but the first reuse the 2048-token prefix in the same step.
    assert reqs[0].cached_tokens == 0
    assert all(r.cached_tokens == 2048 for r in reqs[1:])
    c = engine.counters
    assert c.prefill_tokens_computed == 2088 + 7 * 40
    assert c.cached_tokens == 7 * 2048
    assert c.generation_tokens == 8 * 4


def test_sglang_inserts_prefix_after_the_batch() -> None:
    engine = Engine(profile=H100, flavor="sglang")
    reqs = [_req(str(i), [*SHARED, *range(10 * i, 10 * i + 40)]) for i in range(4)]
    simulate(engine, [(0.0, r) for r in reqs])
    # Same prefill batch: every request recomputes the shared prefix.
    assert all(r.cached_tokens == 0 for r in reqs)
    late = _req("late", [*SHARED, 1, 2, 3])
    simulate(engine, [(0.0, late)])
    assert late.cached_tokens == 2048


def test_prefix_caching_off() -> None:
    engine = Engine(profile=H100, enable_prefix_caching=False)
    reqs = [_req(str(i), [*SHARED, i]) for i in range(3)]
    simulate(engine, [(0.0, r) for r in reqs])
    assert engine.counters.cached_tokens == 0
    assert engine.counters.prefill_tokens_computed == 3 * 2049


def test_cache_salt_isolates_prefixes() -> None:
    engine = Engine(profile=H100)
    a = _req("a", [*SHARED, 1], cache_salt="tenant-a")
    simulate(engine, [(0.0, a)])
    b = _req("b", [*SHARED, 2], cache_salt="tenant-b")
    c = _req("c", [*SHARED, 3], cache_salt="tenant-a")
    simulate(engine, [(0.0, b), (0.0, c)])
    assert b.cached_tokens == 0
    assert c.cached_tokens == 2048


def test_full_prompt_hit_still_computes_one_token() -> None:
    engine = Engine(profile=H100)
    prompt = list(range(64))
    simulate(engine, [(0.0, _req("a", prompt))])
    again = _req("b", prompt)
    simulate(engine, [(0.0, again)])
    assert again.cached_tokens == 48  # (64 - 1) // 16 full blocks


def test_lru_eviction_of_free_blocks() -> None:
    engine = Engine(profile=H100, kv_tokens=16 * 10)
    first = _req("old", list(range(64)), out=1)
    simulate(engine, [(0.0, first)])
    assert engine.kv.num_cached_blocks == 4
    other = _req("new", list(range(500, 500 + 128)), out=1)
    simulate(engine, [(0.0, other)])
    assert engine.kv.evictions > 0
    assert engine.counters.preemptions == 0


def test_preemption_fcfs_picks_latest_arrival() -> None:
    # 12 blocks: two requests of 80 prompt tokens (5 blocks) + growing decodes.
    engine = Engine(profile=H100, kv_tokens=16 * 12, enable_prefix_caching=False)
    early = _req("early", list(range(80)), out=40)
    late = _req("late", list(range(100, 180)), out=40)
    simulate(engine, [(0.0, early), (0.001, late)])
    assert engine.counters.preemptions >= 1
    assert late.num_preemptions >= 1
    assert early.num_preemptions == 0
    assert early.finish_time < late.finish_time  # type: ignore[operator]
    assert late.status is RequestStatus.FINISHED


def test_preemption_priority_picks_largest_priority() -> None:
    engine = Engine(
        profile=H100, kv_tokens=16 * 12, enable_prefix_caching=False, scheduling_policy="priority"
    )
    low = _req("low", list(range(80)), out=40, priority=5)
    high = _req("high", list(range(100, 180)), out=40, priority=-1)
    simulate(engine, [(0.0, low), (0.001, high)])
    assert high.num_preemptions == 0
    assert low.num_preemptions >= 1


def test_priority_policy_orders_waiting_requests() -> None:
    engine = Engine(profile=H100, max_num_seqs=1, scheduling_policy="priority")
    a = _req("a", [1, 2, 3], priority=3)
    b = _req("b", [4, 5, 6], priority=0)
    blocker = _req("blocker", [9, 9, 9], out=2)
    simulate(engine, [(0.0, blocker), (0.0001, a), (0.0001, b)])
    assert b.first_token_time < a.first_token_time  # type: ignore[operator]


def test_fcfs_ignores_priority() -> None:
    engine = Engine(profile=H100, max_num_seqs=1)
    a = _req("a", [1, 2, 3], priority=3)
    b = _req("b", [4, 5, 6], priority=0)
    simulate(engine, [(0.0, a), (0.0001, b)])
    assert a.first_token_time < b.first_token_time  # type: ignore[operator]


def test_chunked_prefill_respects_budget_and_decodes_first() -> None:
    engine = Engine(profile=H100, max_batched_tokens=512)
    decoding = _req("d", [1, 2, 3], out=50)
    simulate(engine, [(0.0, decoding)], until=0.02)
    long = _req("long", list(range(2000, 4000)), out=1)
    engine.add_request(long)
    step = engine.schedule(1.0)
    assert step is not None
    assert step.items[0] == (decoding, 1)
    assert step.items[1] == (long, 511)
    assert step.shape.num_tokens == 512


def test_abort_frees_blocks() -> None:
    engine = Engine(profile=H100)
    req = _req("x", list(range(100)), out=100)
    engine.add_request(req)
    step = engine.schedule(0.0)
    assert step is not None
    engine.commit(step, step.duration)
    assert engine.kv.num_free < engine.kv.num_usable_blocks
    engine.abort(req)
    assert engine.kv.num_free == engine.kv.num_usable_blocks
    assert not engine.has_work()


def test_zero_profile_is_instant() -> None:
    engine = Engine(profile=get_profile("zero"))
    end = simulate(engine, [(0.0, _req("a", [1, 2, 3], out=10))])
    assert end == 0.0
    assert engine.counters.generation_tokens == 10


def test_bad_limits_raise() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        Engine(profile=H100, max_num_seqs=0)
    with pytest.raises(ValueError, match="scheduling_policy"):
        Engine(profile=H100, scheduling_policy="lifo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown emulator profile"):
        get_profile("tpu")
