"""`bench --server`: the live-server path, its pure parts and a run against the emulator.

The emulator is started as an ordinary server (as a real vLLM would be) and
the harness treats it like any live server: it names it, sizes prompts with
its `/tokenize`, forces the shapes and reads `/metrics`.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from langgraph_batch.bench import live, timeline
from langgraph_batch.bench.contenders._common import parse_metrics
from langgraph_batch.bench.harness import shape_check
from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess

ROOT = Path(__file__).resolve().parents[2]
MODEL = "emulated-llama-3-8b"


@pytest.mark.parametrize(
    ("url", "base", "flavor", "lgb"),
    [
        ("vllm://gpu:8000", "http://gpu:8000", "vllm", "vllm://gpu:8000"),
        ("sglang://h:30000/", "http://h:30000", "sglang", "sglang://h:30000"),
        ("https://api.example/", "https://api.example", "openai", "https://api.example"),
        ("http://h:1", "http://h:1", "openai", "http://h:1"),
    ],
)
def test_server_urls(url: str, base: str, flavor: str, lgb: str) -> None:
    target = live.ServerTarget.parse(url, "m")
    assert (target.base_url, target.flavor, target.lgb_url) == (base, flavor, lgb)


@pytest.mark.parametrize("bad", ["gpu:8000", "ftp://h", "vllm://", "vllm://a,b"])
def test_bad_server_urls(bad: str) -> None:
    with pytest.raises(ValueError, match="--server"):
        live.ServerTarget.parse(bad, "m")
    with pytest.raises(ValueError, match="--model"):
        live.ServerTarget.parse("vllm://h:1", "")


def test_emulator_evidence_from_headers_or_version() -> None:
    assert live._emulator_evidence({"content-type": "json"}, {"version": "0.33.0"}) is None
    assert live._emulator_evidence({"X-Emulator": "langgraph-batch"}, None)
    assert live._emulator_evidence({"server": "langgraph-batch-emulator/0.1"}, None)
    assert live._emulator_evidence({}, {"version": "0.33.0", "emulator": True})
    assert live._emulator_evidence({}, {"version": "0.33.0", "emulator": False}) is None
    assert live._emulator_evidence({}, {"version": "0.33.0", "server": "the emulator"})


def test_parse_metrics_and_server_figures() -> None:
    before = parse_metrics(
        'vllm:prompt_tokens_total{a="1"} 100\nvllm:prefix_cache_hits_total 40\n'
        "vllm:generation_tokens_total 10\nvllm:num_preemptions_total 0\n"
        'vllm:request_success_total{finished_reason="stop"} 1\n'
        "vllm:request_decode_time_seconds_sum 1.0\nvllm:request_decode_time_seconds_count 1\n"
    )
    after = parse_metrics(
        '# HELP x y\nvllm:prompt_tokens_total{a="1"} 600\nvllm:prefix_cache_hits_total 240\n'
        "vllm:generation_tokens_total 410\nvllm:num_preemptions_total 1\n"
        'vllm:request_success_total{finished_reason="stop"} 1\n'
        'vllm:request_success_total{finished_reason="length"} 2\n'
        "vllm:request_decode_time_seconds_sum 3.5\nvllm:request_decode_time_seconds_count 3\n"
        'vllm:request_decode_time_seconds_bucket{le="+Inf"} 3\n'
    )
    delta = live.metrics_delta(after, before)
    assert delta["decode_time_s"] == 2.5
    assert delta["decode_time_s_count"] == 2
    figures = live.server_figures(delta)
    assert figures == {
        "llm_requests": 2,
        "prompt_tokens": 500,
        "cached_tokens": 200,
        "prefill_tokens_computed": 300,
        "cache_hit_rate": 0.4,
        "generation_tokens": 400,
        "preemptions": 1,
    }
    assert live.to_wall_seconds(delta, 10.0)["decode_time_s"] == 0.25
    assert live.to_wall_seconds(delta, 10.0)["generation_tokens"] == 400


async def test_sizer_fits_texts_to_the_servers_counts() -> None:
    # A server whose tokenizer counts two tokens per word: the sizer converges.
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append(body)
        return httpx.Response(200, json={"count": 2 * len(body["prompt"].split())})

    sizer = live.Sizer(live.ServerTarget.parse("vllm://h:1", "m"))
    transport = httpx.MockTransport(handler)
    async with httpx.AsyncClient(base_url="http://h:1", transport=transport) as client:
        text = await sizer._fit(client, "Task 1:", 300, random.Random(0))
    assert 2 * len(text.split()) == pytest.approx(300, abs=2)
    assert text.startswith("Task 1: ")
    assert calls[0]["add_special_tokens"] is False
    assert sizer.method == "tokenize"

    def missing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404)

    async with httpx.AsyncClient(transport=httpx.MockTransport(missing), base_url="http://h") as c:
        await sizer._fit(c, "x", 10, random.Random(0))
    assert sizer.method == "estimate"


def test_breakdown_splits_the_mean_sibling() -> None:
    sib = timeline.per_sibling(
        [
            (1.0, 0, "start"),
            (1.0, 0, "llm_start"),
            (3.0, 0, "llm_end"),
            (3.0, 0, "tool_start"),
            (4.0, 0, "tool_end"),
            (4.0, 0, "llm_start"),
            (6.0, 0, "llm_end"),
        ],
        [6.5],
        scale=2.0,
    )
    assert sib["0"][-1] == [13.0, "done"]
    b = timeline.breakdown(sib, {"queue_time_s": 1.0, "prefill_time_s": 1.0, "decode_time_s": 5.0})
    assert b is not None
    assert b["latency"] == 13.0
    assert b["not_started"] == 2.0
    assert b["tool"] == 2.0
    assert b["client_queue"] == 8.0 - 7.0
    assert b["other"] == pytest.approx(1.0)
    assert timeline.breakdown(sib, None)["client_queue"] == 8.0  # type: ignore[index]


def test_shape_check() -> None:
    job = {"forced_shapes": True, "answer_tokens": 200, "tool_keys": ["k0", "k1"]}
    ok = {"output_tokens": {"answer": [200, 200], "tool": [38]}, "tool_args": ["k0", "k1"]}
    assert shape_check(job, ok)["held"] is True
    assert shape_check(job, ok | {"tool_args": ["k9"]})["held"] is False
    bad = ok | {"output_tokens": {"answer": [200, 64]}}
    assert shape_check(job, bad)["held"] is False
    assert shape_check(job | {"forced_shapes": False}, ok)["held"] is False


@pytest.mark.timeout(180)
def test_bench_server_against_the_emulator_as_an_ordinary_server(tmp_path: Path) -> None:
    cfg = EmulatorConfig(port=0, time_scale=10.0)
    with EmulatorProcess(cfg) as emu:
        port = emu.url.rsplit(":", 1)[1]
        server = f"vllm://127.0.0.1:{port}"
        cmd = [
            sys.executable, "-m", "benchmarks.bench", "W1", "--server", server,
            "--model", MODEL, "--n", "4", "--contenders", "naive,langgraph-batch,ideal",
            "--out", str(tmp_path),
        ]  # fmt: skip
        env = dict(os.environ, LANGSMITH_TRACING="false")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=170, cwd=ROOT, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "W1.json").read_text())
    named = data["params"]["server"]
    assert named["url"] == server
    assert named["host"] == f"127.0.0.1:{port}"
    assert named["model"] == MODEL
    assert named["version"] == "0.33.0"
    assert named["emulator"] is True  # it says so (`/version`, x-langgraph-batch-emulator)
    assert named["prompt_sizing"] == "tokenize"
    assert named["engine_time_scale"] == 10.0
    assert data["params"]["times"] == "wall seconds"
    assert server in (tmp_path / "W1.md").read_text()
    assert not data["warnings"], data["warnings"]
    firsts = []
    for name in ("naive", "langgraph-batch"):
        entry = data["contenders"][name]
        assert "error" not in entry, entry
        assert entry["failures"] == 0, entry["errors"]
        shape = entry["shape"]
        # The forced shapes held, per the server's usage: every answer exactly
        # 200 tokens, every tool call one of the workload's keys.
        assert shape["held"] is True, shape
        assert shape["answers"] == shape["answers_with_usage"] == 4
        assert shape["answer_tokens_min"] == shape["answer_tokens_max"] == 200
        assert set(shape["tool_args_seen"]) == {"k0", "k1", "k2", "k3"}
        # Server-side figures from /metrics deltas: 2 requests per sibling.
        assert entry["llm_requests"] == 8
        assert entry["generation_tokens"] >= 4 * 200
        assert entry["prefill_tokens_computed"] < entry["prompt_tokens"]
        assert entry["breakdown"]["server_phases"] == "metrics"
        assert entry["breakdown"]["decode"] > 0
        # The per-sibling timeline and the emulator's per-request phases.
        assert set(entry["timeline"]) == {"0", "1", "2", "3"}
        kinds = [what for _, what in entry["timeline"]["0"]]
        assert kinds[0] == "start"
        assert kinds.count("llm_start") == 2
        assert kinds.count("tool_start") == 1
        assert kinds[-1] == "done"
        rows = entry["server_requests"]
        assert len(rows) == 8
        firsts.append(min(rows, key=lambda r: r[1]))
    # A fresh prompt prefix per contender: the second reused nothing of the first.
    assert all(row[7] == 0 for row in firsts), firsts
