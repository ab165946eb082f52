"""Smoke test of `langgraph-batch bench`: a tiny W2 run writes complete results.

Runs the research harness (`python -m benchmarks.bench`: the bounds, goals and
charts) and, for W6, the wheel's own `langgraph-batch bench`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEEL = ("langgraph_batch.cli", "bench")
RESEARCH = ("benchmarks.bench",)

REQUIRED = (
    "makespan_s",
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "first_result_s",
    "llm_requests",
    "tool_calls_requested",
    "tool_calls_executed",
    "prompt_tokens",
    "prefill_tokens_computed",
    "cache_hit_rate",
    "preemptions",
    "client_cpu_s",
    "peak_rss_mb",
    "failures",
)


@pytest.mark.timeout(120)
def test_bench_w2_small_writes_json_table_and_chart(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        *RESEARCH,
        "W2",
        "--n",
        "4",
        "--contenders",
        "naive,langgraph-batch,ideal",
        "--time-scale",
        "20",
        "--out",
        str(tmp_path),
    ]
    env = dict(os.environ, LANGSMITH_TRACING="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=110, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]

    data = json.loads((tmp_path / "W2.json").read_text())
    assert data["workload"] == "W2"
    assert data["params"]["n"] == 4
    assert data["params"]["seed"] == 0
    assert data["versions"]["langgraph"]
    contenders = data["contenders"]
    assert set(contenders) == {"naive", "langgraph-batch", "ideal"}
    for name in ("naive", "langgraph-batch"):
        entry = contenders[name]
        assert "error" not in entry, entry
        missing = [k for k in REQUIRED if k not in entry]
        assert not missing, (name, missing)
        assert entry["failures"] == 0, entry["errors"]
        assert entry["makespan_s"] > 0
        # 2 turns per sibling: one tool call, then the final answer.
        assert entry["llm_requests"] == 8
        assert entry["tool_calls_requested"] == 4
        assert entry["prefill_tokens_computed"] <= entry["prompt_tokens"]
    # 4 siblings with keys k0..k3: coalescing executes each distinct call once.
    assert contenders["langgraph-batch"]["tool_calls_executed"] == 4
    assert contenders["naive"]["tool_calls_executed"] == 4
    assert contenders["ideal"]["makespan_s"] > 0
    assert (tmp_path / "W2.md").read_text().startswith("### W2")
    assert (tmp_path / "W2.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _bench(
    tmp_path: Path, *args: str, timeout: float, command: tuple[str, ...] = RESEARCH
) -> dict[str, object]:
    cmd = [sys.executable, "-m", *command, *args, "--out", str(tmp_path)]
    env = dict(os.environ, LANGSMITH_TRACING="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data: dict[str, object] = json.loads((tmp_path / f"{args[0]}.json").read_text())
    return data


@pytest.mark.timeout(60)
def test_bench_w6_small_runs_on_the_sglang_emulator(tmp_path: Path) -> None:
    data = _bench(
        tmp_path,
        "W6",
        "--n",
        "4",
        "--contenders",
        "naive,langgraph-batch",
        "--time-scale",
        "20",
        timeout=50,
        command=WHEEL,
    )
    params = data["params"]
    assert isinstance(params, dict)
    assert params["flavor"] == "sglang"
    contenders = data["contenders"]
    assert isinstance(contenders, dict)
    for name in ("naive", "langgraph-batch"):
        entry = contenders[name]
        assert "error" not in entry, entry
        assert entry["failures"] == 0, entry["errors"]
        assert entry["llm_requests"] == 8
        assert 0 < entry["prefill_tokens_computed"] <= entry["prompt_tokens"]
    ratios = data["ratios"]
    assert isinstance(ratios, dict)
    assert ratios["naive/langgraph-batch"]["prefill_tokens_computed"] > 0
    # The wheel's harness alone: no goals, no chart (the research harness adds them).
    assert data["goals"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["W6.json", "W6.md"]


@pytest.mark.timeout(60)
def test_bench_w4_small_sums_counters_over_replicas(tmp_path: Path) -> None:
    data = _bench(
        tmp_path,
        "W4",
        "--n",
        "8",
        "--replicas",
        "2",
        "--contenders",
        "naive,langgraph-batch,langgraph-batch-rr,ideal",
        "--time-scale",
        "20",
        timeout=55,
    )
    params = data["params"]
    assert isinstance(params, dict)
    assert params["replicas"] == 2
    contenders = data["contenders"]
    assert isinstance(contenders, dict)
    for name in ("naive", "langgraph-batch", "langgraph-batch-rr"):
        entry = contenders[name]
        assert "error" not in entry, entry
        assert entry["failures"] == 0, entry["errors"]
        # 3 turns per sibling, counted over both replicas.
        assert entry["llm_requests"] == 24
        per_replica = entry["requests_per_replica"]
        assert len(per_replica) == 2
        assert sum(per_replica) >= 24  # plus the one-sibling warm-up
        assert 0 < entry["prefill_tokens_computed"] <= entry["prompt_tokens"]
    # Round robin scatters each sibling's turns: it recomputes more prefix than affinity.
    assert (
        contenders["langgraph-batch-rr"]["prefill_tokens_computed"]
        > contenders["langgraph-batch"]["prefill_tokens_computed"]
    )
    assert contenders["ideal"]["replicas"] == 2


@pytest.mark.timeout(150)
def test_bench_w7_small_runs_the_single_turn_contenders(tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", *RESEARCH, "W7", "--n", "6",
        "--contenders", "abatch-bounded,langgraph-batch,langgraph-batch-fan-out,"
        "langgraph-batch-nobatch,ideal",
        "--time-scale", "10", "--out", str(tmp_path),
    ]  # fmt: skip
    env = dict(os.environ, LANGSMITH_TRACING="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=140, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "W7.json").read_text())
    contenders = data["contenders"]
    for name in ("abatch-bounded", "langgraph-batch", "langgraph-batch-fan-out"):
        entry = contenders[name]
        assert entry["failures"] == 0, entry["errors"]
        assert entry["llm_requests"] == 6
        # Every answer is exactly the workload's 150 tokens (max_tokens + ignore_eos).
        assert entry["generation_tokens"] == 6 * 150
        assert entry["shape"]["held"] is True, entry["shape"]
        assert len(entry["timeline"]) == 6
    assert contenders["langgraph-batch-nobatch"]["generation_tokens"] == 6 * 150
    ideal = contenders["ideal"]
    assert ideal["decode_tokens"] == 6 * 150
    assert ideal["makespan_s"] > 0
    goals = {g["goal"]: g for g in data["goals"]}
    assert set(goals) == {
        "langgraph-batch: throughput >= 90% of the ideal bound",
        "langgraph-batch-fan-out: throughput >= 90% of the ideal bound",
    }
    assert "HTTP batching (diagnostic)" in (tmp_path / "W7.md").read_text()
