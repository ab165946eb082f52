"""The emulator's block size, null block and pause, without a server.

The same rules run against vLLM 0.32 in `tests/engine/test_rules_*.py`; here
they are checked on the engine alone, in virtual time, so that `make test`
catches a regression without the real engine.
"""

from __future__ import annotations

import pytest

from langgraph_batch.emulator._serving import Serving
from langgraph_batch.emulator.cli import build_parser, config_from_args
from langgraph_batch.emulator.config import EmulatorConfig
from langgraph_batch.emulator.costs import get_profile
from langgraph_batch.emulator.engine import Engine, Request, simulate

ZERO = get_profile("zero")


def _ids(n: int, start: int) -> list[int]:
    return list(range(start, start + n))


def _req(rid: str, prompt: list[int], out: int = 1) -> Request:
    return Request(request_id=rid, prompt_ids=prompt, output_ids=_ids(out, 90_000))


def test_block_size_sets_blocks_and_the_null_block_is_set_aside() -> None:
    """8192 KV tokens in blocks of 32: vLLM's num_gpu_blocks 256, of which 255 usable."""
    engine = Engine(profile=ZERO, kv_tokens=8192, block_size=32)
    assert (engine.kv.num_blocks, engine.kv.num_usable_blocks, engine.kv.num_free) == (
        256,
        255,
        255,
    )
    assert (engine.kv_capacity_tokens, engine.usable_kv_tokens) == (8192, 8160)
    sglang = Engine(profile=ZERO, kv_tokens=8192, block_size=32, flavor="sglang")
    assert sglang.kv.num_usable_blocks == 256
    default = Engine(profile=ZERO, kv_tokens=1600)
    assert (default.block_size, default.kv.num_blocks) == (16, 100)


def test_prefix_hits_count_whole_blocks_of_the_configured_size() -> None:
    """116 tokens in blocks of 32: a repeat hits 3 blocks (96), a 96-token prefix 2 (64)."""
    engine = Engine(profile=ZERO, kv_tokens=8192, block_size=32)
    a = _ids(116, 100)
    reqs = [_req("A", a), _req("A2", a), _req("C", a[:96])]
    simulate(engine, [(float(i), r) for i, r in enumerate(reqs)])
    assert [r.cached_tokens for r in reqs] == [0, 96, 64]


def test_lru_eviction_with_the_null_block_matches_vllm() -> None:
    """`tests/engine/test_rules_cache.py`'s eviction stream: A keeps 55 blocks (1760 tokens)."""
    engine = Engine(profile=ZERO, kv_tokens=8192, block_size=32)
    a, b, c = (_ids(80 * 32 + 16, 10_000 * (i + 1)) for i in range(3))
    d = _ids(39 * 32 + 16, 50_000)
    order = [("A", a), ("B", b), ("C", c), ("D", d), ("C2", c), ("B2", b), ("D2", d), ("A2", a)]
    reqs = {name: _req(name, p) for name, p in order}
    simulate(engine, [(float(i), reqs[name]) for i, (name, _) in enumerate(order)])
    cached = {name: r.cached_tokens for name, r in reqs.items() if name.endswith("2")}
    assert cached == {"C2": 2560, "B2": 2560, "D2": 1248, "A2": 1760}


def test_a_paused_engine_schedules_nothing_and_then_sees_every_queued_request() -> None:
    engine = Engine(profile=ZERO, kv_tokens=8192, block_size=32, max_batched_tokens=512)
    engine.paused = True
    for i in range(3):
        engine.add_request(_req(f"R{i}", _ids(20, 100 * (i + 1))))
    assert engine.schedule(0.0) is None
    assert engine.num_waiting == 3
    engine.paused = False
    step = engine.schedule(0.0)
    assert step is not None
    assert [r.request_id for r, _ in step.items] == ["R0", "R1", "R2"]


def test_block_size_round_trips_through_the_command_line() -> None:
    cfg = EmulatorConfig(port=0, block_size=32, kv_tokens=8192)
    assert config_from_args(build_parser().parse_args(cfg.to_argv())).block_size == 32
    assert EmulatorConfig().block_size == 16


def test_kv_tokens_must_leave_a_usable_block() -> None:
    with pytest.raises(ValueError, match="kv_tokens must be >= 64"):
        EmulatorConfig(block_size=32, kv_tokens=32)
    with pytest.raises(ValueError, match="block_size"):
        EmulatorConfig(block_size=0)
    assert EmulatorConfig(block_size=32, kv_tokens=32, flavor="sglang").kv_tokens == 32


def test_max_model_len_is_at_most_the_usable_blocks() -> None:
    """vLLM refuses `max_model_len` 8192 on 8192 KV tokens of 32 ("estimated ... 8160")."""
    serving = Serving(EmulatorConfig(kv_tokens=8192, block_size=32, max_model_len=8192))
    assert serving.max_model_len == 8160
