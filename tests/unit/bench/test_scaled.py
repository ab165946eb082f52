"""The scaled workloads (W1s, W3s, W8s), the `cpu-tiny` profile and the pinned tool calls."""

from __future__ import annotations

import json

import pytest

from benchmarks import goals
from benchmarks.contenders.kv_bound import agent_turns, agents_bound
from langgraph_batch.bench import cli
from langgraph_batch.bench._scaled import SCALED_IDS, SCALED_KV_TOKENS
from langgraph_batch.bench.contenders import _common, _graph
from langgraph_batch.bench.workloads import (
    FULL_SIZE,
    WORKLOADS,
    emulator_settings,
    make_job,
    system_prompt,
)
from langgraph_batch.emulator.costs import get_profile
from langgraph_batch.emulator.scenarios import call_key


def test_scaled_workloads_are_named_but_not_in_bench_all() -> None:
    assert set(SCALED_IDS) == {"W1s", "W3s", "W8s"}
    assert all(w in WORKLOADS for w in SCALED_IDS)
    assert not set(FULL_SIZE) & set(SCALED_IDS)
    assert "W8" in FULL_SIZE
    args = cli.parse_args(["W8s", "--server", "vllm://h:1", "--model", "m", "--engine-name", "x"])
    assert args.workload == "W8s"
    target = cli._server_target(args)
    assert target is not None
    assert target.engine == "x"
    with pytest.raises(ValueError, match="engine-name"):
        cli._server_target(cli.parse_args(["W1s", "--engine-name", "x"]))


def test_cpu_tiny_is_the_cpu_engine_and_sets_the_emulator_limits() -> None:
    p = get_profile("cpu-tiny")
    assert (p.block_size, p.max_batched_tokens, p.kv_tokens) == (32, 2048, SCALED_KV_TOKENS)
    assert p.kv_bytes_per_token == 512
    # Decode steps grow with the batch; a lone step costs milliseconds, not microseconds.
    assert 1e-3 < p.decode_step_time(1, 64) < p.decode_step_time(64, 64)
    settings = emulator_settings(WORKLOADS["W8s"])
    assert settings["max_batched_tokens"] == 2048
    assert "max_batched_tokens" not in emulator_settings(WORKLOADS["W8"])


def test_w8s_contexts_outgrow_its_kv_and_fit_the_engine_window() -> None:
    wl = WORKLOADS["W8s"]
    bound = agents_bound(wl, n=wl.n, seed=0)
    assert bound["profile"] == "cpu-tiny"
    assert bound["kv_capacity_tokens"] == SCALED_KV_TOKENS
    assert bound["min_prefill_tokens"] > 2 * SCALED_KV_TOKENS
    assert wl.think_tokens is None  # a live server's forced tool turn has no text
    system = system_prompt(wl, 0)
    longest = max(agent_turns(wl, i, 0, system)[1][-1].prompt for i in range(wl.n))
    assert longest < 0.8 * 32_768  # the engine's window, with room for its own tokenizer


def test_forced_jobs_pin_each_call_to_the_siblings_key() -> None:
    wl = WORKLOADS["W8s"]
    job = make_job(
        wl,
        n=3,
        seed=0,
        llm_url="http://s",
        tool_url="http://t",
        model="m",
        contender="naive",
        live={"flavor": "vllm", "lgb_url": "vllm://s"},
    )
    assert job["task_keys"] == ["s0", "s1", "s2"]
    assert call_key("s1", 2) in job["tool_keys"]
    opts = _graph.forced_call_options("s1", 2)
    tag = json.loads(opts["extra_body"]["structured_outputs"]["structural_tag"])
    assert tag["format"] == {"type": "const_string", "value": '{"query": "s1.2"}'}
    assert _graph.call_key("s1", 0) == call_key("s1", 0) == "s1"
    assert _common.warmup_job(job)["task_keys"] == [_common.WARMUP_KEY]


def _entry(makespan: float, **kw: float) -> dict[str, float]:
    return {"makespan_s": makespan, **kw}


def test_w8s_goals_are_issue_24s() -> None:
    contenders = {
        "naive": _entry(100.0, preemptions=5),
        "naive-bounded-8": _entry(80.0),
        "naive-bounded-16": _entry(70.0),
        "langgraph-batch": _entry(60.0, preemptions=0, prefill_tokens_computed=110),
        "ideal": _entry(40.0, min_prefill_tokens=100),
    }
    out = {g["goal"]: g for g in goals.goals("W8s", contenders, 24)}
    assert out["0 preemptions"]["met"] is True
    assert out["makespan <= 0.6x naive"]["met"] is True
    best = out["makespan <= 0.9x the best naive-bounded (naive-bounded-16)"]
    assert best["met"] is True
    assert best["measured"] == pytest.approx(60 / 70)
    assert out["prefill computed <= 1.2x the minimum (every context token once)"]["met"]
    w1s = {g["goal"] for g in goals.goals("W1s", contenders, 48)}
    assert "makespan <= 0.75x naive" in w1s


def test_forced_siblings_end_after_their_own_turns() -> None:
    job = {"turns": 10, "turns_per_task": [4, 7], "tasks": ["a", "b"]}
    assert _graph.turns_of(job) == [4, 7]
    assert _graph.turns_of({"turns": 3, "tasks": ["a"]}) == 3
