"""W10, W11 and W8o, the long-horizon shapes beside W8: sizes, turns, tails, tiers, goals."""

from __future__ import annotations

import statistics
from functools import cache

import pytest

from benchmarks import goals as research_goals
from benchmarks.contenders.kv_bound import Turn, agent_turns, agents_bound
from benchmarks.extension import Research
from langgraph_batch.bench import cli, harness, report
from langgraph_batch.bench._long_horizon import (
    LONG_HORIZON_BOUNDED,
    W8O_OFFLOAD_GIB,
    W10_KV_TOKENS,
)
from langgraph_batch.bench.workloads import (
    FULL_SIZE,
    WORKLOADS,
    Workload,
    emulator_settings,
    make_job,
    offload_tokens,
    system_prompt,
)
from langgraph_batch.emulator.costs import get_profile


@cache
def _agents(workload: str) -> tuple[int, tuple[tuple[Turn, ...], ...]]:
    """The shared prefix and every agent's turns, replayed through the emulated model."""
    wl = WORKLOADS[workload]
    system = system_prompt(wl, 0)
    runs = [agent_turns(wl, i, 0, system) for i in range(wl.n)]
    return runs[0][0], tuple(tuple(turns) for _, turns in runs)


def _turns(workload: str) -> tuple[tuple[Turn, ...], ...]:
    """Every agent's turns (seed 0)."""
    return _agents(workload)[1]


def _lockstep_peak(workload: str) -> int:
    """The live tokens when every agent is at the same turn: the most over turns (the
    shared prefix counted once)."""
    shared, runs = _agents(workload)
    return shared + max(
        sum(t[k].prompt - shared for t in runs if len(t) > k)
        for k in range(max(len(t) for t in runs))
    )


def test_the_public_shapes_run_in_bench_all_with_the_sweep() -> None:
    assert FULL_SIZE[-5:] == ("W8", "W9", "W10", "W11", "W8o")
    for wid in ("W10", "W11"):
        wl = WORKLOADS[wid]
        assert wl.contenders == ("naive", *LONG_HORIZON_BOUNDED, "langgraph-batch", "ideal")
        assert wl.time_scale == WORKLOADS["W8"].time_scale == 4.0
        assert wl.distinct_keys is None  # every call's arguments are its own
        assert not wl.structured
        assert wl.profile == "h100-llama3-8b"


def test_w10_is_96_agents_of_8_to_20_turns_with_one_tool_in_ten_past_10_s() -> None:
    wl = WORKLOADS["W10"]
    assert (wl.n, wl.turns_range, wl.kv_tokens) == (96, (8, 20), W10_KV_TOKENS)
    counts = [wl.turns_for(i, 0) for i in range(wl.n)]
    assert min(counts) >= 8
    assert max(counts) <= 20
    assert 12 <= statistics.median(counts) <= 16
    waits = [t.wait for run in _turns("W10") for t in run[:-1]]
    assert len(waits) == sum(counts) - wl.n  # one tool call a turn but the last
    tail = sum(w >= 10.0 for w in waits) / len(waits)
    assert 0.07 <= tail <= 0.13  # the mix's 10%, drawn per call
    assert max(waits) <= 30.0
    # The contexts together outgrow the 440k cache several times over.
    finals = [run[-1].prompt for run in _turns("W10")]
    assert sum(finals) > 4 * W10_KV_TOKENS
    assert _lockstep_peak("W10") > W10_KV_TOKENS


def test_w11_is_48_long_agents_with_fast_small_tools_that_fit_the_cache() -> None:
    wl = WORKLOADS["W11"]
    assert (wl.n, wl.turns_range) == (48, (10, 30))
    counts = [wl.turns_for(i, 0) for i in range(wl.n)]
    assert min(counts) >= 10
    assert max(counts) <= 30
    assert 16 <= statistics.median(counts) <= 24
    waits = [t.wait for run in _turns("W11") for t in run[:-1]]
    assert all(0.1 <= w <= 0.5 for w in waits)
    kv = get_profile(wl.profile).kv_tokens
    assert _lockstep_peak("W11") < 0.7 * kv  # the cache does not bind
    assert max(run[-1].prompt for run in _turns("W11")) < 20_000


def test_every_turn_asks_a_different_tool_call() -> None:
    for wid in ("W10", "W11"):
        wl: Workload = WORKLOADS[wid]
        job = make_job(wl, n=wl.n, seed=0, llm_url="http://e", tool_url="http://t",
                       model="m", contender="naive")  # fmt: skip
        calls = sum(wl.turns_for(i, 0) - 1 for i in range(wl.n))
        assert len(job["tool_keys"]) == calls  # no two calls share arguments


def test_public_shape_goals_use_the_best_bounded_and_the_kv_valid_bound() -> None:
    base = dict.fromkeys(report.METRIC_KEYS, 1.0) | {"preemptions": 0.0}
    contenders = {
        "naive": base | {"makespan_s": 600.0, "latency_p95_s": 560.0},
        "naive-bounded-32": base | {"makespan_s": 300.0, "latency_p95_s": 250.0},
        "naive-bounded-48": base | {"makespan_s": 400.0, "latency_p95_s": 200.0},
        "langgraph-batch": base
        | {"makespan_s": 280.0, "latency_p95_s": 240.0, "prefill_tokens_computed": 2.0e6},
        "ideal": {"makespan_s": 250.0, "min_prefill_tokens": 1.0e6},
    }
    for wid in ("W10", "W11"):
        goals = {g["goal"]: g for g in research_goals.goals(wid, contenders, 96)}
        best = goals["makespan <= 0.85x the best naive-bounded (naive-bounded-32)"]
        assert best["measured"] == pytest.approx(280 / 300)
        assert best["met"] is False
        assert best["ideal_ratio"] == pytest.approx(250 / 300)  # the bound meets it
        bound = goals["makespan <= 1.25x the KV-valid bound"]
        assert bound["measured"] == pytest.approx(280 / 250)
        assert bound["met"] is True
        prefill = goals["prefill computed <= 1.2x the minimum (every context token once)"]
        assert prefill["met"] is False
        assert goals["0 preemptions"]["met"] is True
        p95 = goals["p95 sibling latency <= the best naive-bounded's (naive-bounded-32)"]
        assert p95["measured"] == pytest.approx(240 / 250)
        assert p95["met"] is True


def test_the_router_contenders_run_on_the_public_shapes(with_research: Research) -> None:
    for wid in ("W10", "W11"):
        for name in ("naive-router-ps", "langgraph-batch-router-ps", "naive-bounded-32-router-ps"):
            assert cli.is_known(wid, name), (wid, name)
        assert (
            harness.module_for(wid, "langgraph-batch-router-ps")
            == harness.MODULES["langgraph-batch"]
        )
        # The bound of a long-horizon shape is the KV-valid one.
        assert with_research.bound(WORKLOADS[wid], n=4, seed=0)["kind"] == "kv-valid"


def test_w8o_is_w8_on_a_server_with_a_64_gib_cpu_tier() -> None:
    w8, w8o = WORKLOADS["W8"], WORKLOADS["W8o"]
    assert w8o.kv_offloading_size == W8O_OFFLOAD_GIB == 64.0
    assert w8.kv_offloading_size is None
    # Everything else is W8's: the same agents, tools and sweep.
    same = ("n", "turns_range", "kv_tokens", "tool_latency_mix", "contenders", "time_scale")
    assert all(getattr(w8o, f) == getattr(w8, f) for f in same)
    # 64 GiB over 128 KiB of KV a token (H100 profile), in whole 16-token blocks.
    assert offload_tokens(w8o) == 64 * 2**30 // (16 * 131_072) * 16 == 524_288
    assert offload_tokens(w8) is None
    # The emulator runs the tier for every contender alike; W8's server has none.
    assert emulator_settings(w8o)["kv_offloading_size"] == 64.0
    assert "kv_offloading_size" not in emulator_settings(w8)


def test_the_w8o_bound_counts_the_tier(with_research: Research) -> None:
    wl = WORKLOADS["W8o"]
    with_tier = with_research.bound(wl, n=wl.n, seed=0)
    without = agents_bound(WORKLOADS["W8"], n=wl.n, seed=0)
    assert with_tier["offload_tokens"] == 524_288
    assert without["offload_tokens"] is None
    # A tier can only lower the bound: parked contexts come back without a recompute.
    assert with_tier["kv_bound_s"] <= without["kv_bound_s"]
    assert with_tier["min_prefill_tokens"] == without["min_prefill_tokens"]
    # On W8's agents the engine's work binds either way, which is why the docs say the
    # tier cannot move W8's bound (182.2 s with and without it).
    for bound in (with_tier, without):
        assert bound["makespan_s"] == pytest.approx(bound["work_bound_s"])
    assert with_tier["makespan_s"] == pytest.approx(without["makespan_s"])


def test_w8o_goals_are_the_tier_bound_the_sweep_and_no_preemption() -> None:
    base = dict.fromkeys(report.METRIC_KEYS, 1.0) | {"preemptions": 0.0}
    contenders = {
        "naive-bounded-24": base | {"makespan_s": 270.0},
        "langgraph-batch": base | {"makespan_s": 200.0},
        "ideal": {"makespan_s": 180.0},
    }
    goals = {g["goal"]: g for g in research_goals.goals("W8o", contenders, 64)}
    tier = goals["makespan <= 1.15x the KV-valid bound with the tier"]
    assert tier["measured"] == pytest.approx(200 / 180)
    assert tier["met"] is True
    best = goals["makespan <= 0.85x the best naive-bounded (naive-bounded-24)"]
    assert best["measured"] == pytest.approx(200 / 270)
    assert best["met"] is True
    assert goals["0 preemptions"]["met"] is True
    contenders["langgraph-batch"] = base | {"makespan_s": 240.0, "preemptions": 3.0}
    goals = {g["goal"]: g for g in research_goals.goals("W8o", contenders, 64)}
    assert goals["makespan <= 1.15x the KV-valid bound with the tier"]["met"] is False
    assert goals["0 preemptions"]["met"] is False
