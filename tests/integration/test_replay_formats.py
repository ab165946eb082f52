"""`bench --replay FILE --format F` on the emulator, one sample trace per format.

The samples (`benchmarks/replay_formats.py`) are append-only agent sessions
that start together; two hand-made kvtrace files add a compaction (a reset
that keeps the shared system prompt) and a sub-agent that starts 2 s in.
The goal for each: the replayed prompt tokens are exactly the trace's and
the cache-hit rate is within 2% (and 2 points) of what the hash ids
(TraceLab: `prefix_len`) imply.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.replay_formats import FILES, write

ROOT = Path(__file__).resolve().parents[2]


def _replay(path: Path, fmt: str, out: Path) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "langgraph_batch.cli", "bench", "--replay", str(path),
        "--format", fmt, "--contenders", "langgraph-batch", "--time-scale", "4",
        "--out", str(out),
    ]  # fmt: skip
    env = dict(os.environ, LANGSMITH_TRACING="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads((out / "replay.json").read_text())
    return result


def _assert_goal(result: dict[str, Any]) -> None:
    rec = result["recorded"]
    lgb = result["contenders"]["langgraph-batch"]
    sys.stderr.write(
        f"recorded {rec['cache_hit_rate']:.4f}, replayed {lgb['cache_hit_rate']:.4f}\n"
    )
    assert lgb["failures"] == 0, lgb.get("errors")
    assert lgb["llm_requests"] == rec["llm_requests"]
    assert lgb["prompt_tokens"] == rec["prompt_tokens"]
    assert lgb["cache_hit_rate"] == pytest.approx(rec["cache_hit_rate"], abs=0.02)
    assert lgb["cache_hit_rate"] / rec["cache_hit_rate"] == pytest.approx(1.0, abs=0.02)


@pytest.mark.timeout(170)
@pytest.mark.parametrize("fmt", sorted(FILES))
def test_a_sample_trace_replays_with_exact_prompts_and_its_hit_rate(
    fmt: str, tmp_path: Path
) -> None:
    path = write(tmp_path)[fmt]
    result = _replay(path, fmt, tmp_path / "out")
    assert result["params"]["recording_header"]["imported_from"] == fmt
    assert result["recorded"]["siblings"] == 4
    assert result["recorded"]["llm_requests"] == 12
    assert result["params"]["shared_prefix_tokens"] == 4096
    _assert_goal(result)


@pytest.mark.timeout(170)
def test_a_compacted_session_replays_its_reset(tmp_path: Path) -> None:
    # A main agent and a sub-agent share a 16-block system prompt; the main agent's
    # third request is a compaction that keeps that prompt and summarises the rest.
    # (A reset replays at a message boundary: here the shared prompt's end. One that
    # keeps part of a message is replayed at the nearest boundary and listed among the
    # deviations; see docs/measure-your-own-job.md.)
    trace = {
        "block_size": 64,
        "requests": [
            {"in": 2048, "out": 80, "hash_ids": list(range(32)), "think_time": 0.3},
            {"in": 3072, "out": 80, "hash_ids": list(range(48)), "think_time": 0.3},
            {"in": 1536, "out": 60, "hash_ids": [*range(16), *range(100, 108)]},
        ],
        "subagents": [
            {"start": 0.0, "requests": [{"in": 2048, "out": 60,
                                         "hash_ids": [*range(16), *range(200, 216)]}]},
        ],
    }  # fmt: skip
    path = tmp_path / "reset.json"
    path.write_text(json.dumps(trace))
    result = _replay(path, "kvtrace", tmp_path / "out")
    assert result["params"]["shared_prefix_tokens"] == 1024
    _assert_goal(result)


@pytest.mark.timeout(170)
def test_a_sub_agent_starts_at_its_offset(tmp_path: Path) -> None:
    def requests(first: int) -> list[dict[str, Any]]:
        return [{"in": 1024, "out": 60, "hash_ids": [*range(8), *range(first, first + 8)]}]

    trace = {"block_size": 64, "requests": requests(100),
             "subagents": [{"start": 2.0, "requests": requests(200)}]}  # fmt: skip
    path = tmp_path / "offset.json"
    path.write_text(json.dumps(trace))
    result = _replay(path, "kvtrace", tmp_path / "out")
    assert result["recorded"]["siblings"] == 2
    timeline = result["contenders"]["langgraph-batch"]["timeline"]
    first = {
        s: next(t for t, what in events if what == "llm_start") for s, events in timeline.items()
    }
    assert first["1"] - first["0"] == pytest.approx(2.0, abs=0.3)  # emulated seconds
