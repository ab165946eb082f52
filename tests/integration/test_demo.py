"""`langgraph-batch demo --n 10` runs end to end against the emulator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_demo_prints_summary_stats_and_side_by_side() -> None:
    cmd = [sys.executable, "-m", "langgraph_batch.cli", "demo", "--n", "10", "--time-scale", "20"]
    env = dict(os.environ, LANGSMITH_TRACING="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=110, cwd=ROOT, env=env)
    out = proc.stdout
    assert proc.returncode == 0, (out[-3000:], proc.stderr[-3000:])
    assert "EMULATED vLLM (h100-llama3-8b profile" in out
    assert "not a real GPU" in out
    assert "Results: 10/10 siblings answered, 0 failed." in out
    assert "Scheduler stats:" in out
    assert "LLM requests: 20" in out
    # 10 siblings asking 2 distinct queries: 10 tool calls requested, 2 executed.
    assert "tool calls: 10 requested, 2 executed" in out
    assert "prefix cache:" in out
    assert "Side by side" in out
    assert "tool calls requested/executed" in out
    assert "speed-up:" in out
