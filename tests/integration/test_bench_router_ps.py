"""W8's router contenders end to end, through the real `vllm-router` binary.

`langgraph-batch bench W8 --n 4` with `naive-router` (vllm-router, no program
scheduling), `naive-router-ps` (plain LangGraph, one `X-Session-ID` per agent)
and `langgraph-batch-router-ps` (its default session key), both behind
`vllm-router --enable-program-scheduling` in front of one emulator: every
sibling finishes, and the router's own diagnostics and metrics show it
scheduled each agent as a program (4 agents + the warm-up sibling), admitted
with the emulator's KV capacity. Skipped, saying why, where `vllm-router`
(the `test` extra) is not installed or does not run here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.extension import research
from benchmarks.routers import process as routers
from langgraph_batch.bench.harness import run_workload
from langgraph_batch.bench.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parents[2]
N = 4


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_router_contenders_complete_and_carry_program_identity(tmp_path: Path) -> None:
    reason = routers.router_unavailable("vllm-router")
    if reason is not None:
        pytest.skip(reason)
    contenders = "naive-router,naive-router-ps,langgraph-batch-router-ps"
    cmd = [sys.executable, "-m", "benchmarks.bench", "W8", "--n", str(N),
           "--contenders", contenders, "--time-scale", "20", "--out", str(tmp_path)]  # fmt: skip
    env = dict(os.environ, LANGSMITH_TRACING="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "W8.json").read_text())["contenders"]
    turns = sum(WORKLOADS["W8"].turns_for(i, 0) for i in range(N))
    for name in contenders.split(","):
        entry = results[name]
        assert "error" not in entry, entry
        assert entry["failures"] == 0, entry["errors"]
        assert entry["llm_requests"] == turns, name
        assert entry["router"]["router"] == "vllm-router"
        assert entry["router"]["version"]
    assert results["naive-router"]["router"]["transitions"] == {}  # no program scheduling
    for name in ("naive-router-ps", "langgraph-batch-router-ps"):
        info = results[name]["router"]
        # Each agent is one program (the warm-up sibling is the fifth), known by its header.
        assert info["programs"] == N + 1, info
        assert info["transitions"]["program_admit"] >= N + 1, info
        # Its log says the same (a forced resume is logged as an admission too).
        admitted = sum(v for k, v in info["transitions"].items() if k.endswith(("admit", "resume")))
        assert info["log_events"]["program_admit"] == admitted, info
        # Every request of the run went through the router's program pool.
        assert info["pool_waits"] >= turns, info
        config = info["program_scheduling"]
        assert config["program_scheduling_enable_key"] == "auto"
        assert config["token_capacity_per_dp_rank"] == 463_312  # the emulator's KV cache
    assert "Through vllm-router" in (tmp_path / "W8.md").read_text()


@pytest.mark.timeout(120)
def test_a_router_contender_without_the_router_is_skipped_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(routers, "router_unavailable", lambda kind: "vllm-router is not installed")
    with research():
        result = run_workload(
            WORKLOADS["W8"],
            n=2,
            contenders=["naive-router-ps"],
            time_scale=20.0,
            seed=0,
            timeout=60.0,
        )
    error = result["contenders"]["naive-router-ps"]["error"]
    assert error == "skipped: vllm-router is not installed"
