"""`import_trace`: Mooncake, kvtrace and TraceLab files as recordings (hand-computed values).

Estimated durations (no end in the trace): prompt x 1e-4 s + output x 0.02 s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from langgraph_batch.bench.replay import plan
from langgraph_batch.record import Recording, import_trace

MOONCAKE = [
    {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]},
    {"timestamp": 0, "input_length": 1500, "output_length": 20, "hash_ids": [1, 3, 4]},
    {"timestamp": 2000, "input_length": 2048, "output_length": 30, "hash_ids": [1, 2, 5, 6]},
    {"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [1, 7]},
    {"timestamp": 5000, "input_length": 2100, "output_length": 8, "hash_ids": [1, 3, 4, 8, 9]},
]

KVTRACE = [
    {
        "id": "a",
        "block_size": 64,
        "hash_id_scope": "global",
        "requests": [
            {"t": 0.0, "in": 128, "out": 10, "hash_ids": [1, 2], "api_time": 1.0,
             "think_time": 3.0, "stop": "tool_use"},
            {"t": 4.0, "in": 300, "out": 20, "hash_ids": [1, 2, 3, 4, 5], "api_time": 2.0},
            {"t": 9.0, "in": 150, "out": 5, "hash_ids": [1, 2, 9]},
        ],
        "subagents": [{"start": 2.5, "requests": [{"in": 192, "out": 7, "hash_ids": [1, 2, 6]}]}],
    },
    {
        "id": "b",
        "block_size": 64,
        "hash_id_scope": "global",
        "start": 1.0,
        "requests": [{"in": 100, "out": 4, "hash_ids": [1, 8]}],
    },
]  # fmt: skip

TRACELAB = """session_id,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms
s1,0,1000,1200,50,500
s2,0,1000,1100,40,0
s1,2,1560,1700,70,0
s1,1,1250,1500,60,250
s2,1,400,1300,30,0
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _mooncake(tmp_path: Path, rows: list[dict[str, object]] = MOONCAKE) -> Path:
    return _write(tmp_path, "m.jsonl", "".join(json.dumps(r) + "\n" for r in rows))


def _by_sibling(rec: Recording) -> dict[int, list[tuple[int, int | None, int | None]]]:
    """(prompt, cached, prefix) per call, by sibling."""
    return {
        s: [(c.prompt_tokens or 0, c.cached_tokens, c.prefix_tokens) for c in calls]
        for s, calls in rec.siblings().items()
    }


def test_mooncake_sessions_cache_prefix_and_waits(tmp_path: Path) -> None:
    rec = import_trace(_mooncake(tmp_path), format="mooncake")
    assert rec.header["imported_from"] == "mooncake"
    # A = lines 1, 3 (its hash ids prefix line 3's); B = lines 2, 5; C = line 4 (offset 3 s).
    assert _by_sibling(rec) == {
        0: [(1024, 0, None), (2048, 1024, 1034)],
        1: [(1500, 512, None), (2100, 1536, 1520)],
        2: [(600, 512, None)],
    }
    assert [c.output_tokens for c in rec.calls if c.sibling == 0] == [10, 30]
    a0, a1 = rec.siblings()[0]
    assert a0.start_s == 0.0
    assert a0.end_s == pytest.approx(0.3024)
    assert a1.start_s == pytest.approx(2.0)  # its timestamp: the wait fills the gap
    assert rec.siblings()[2][0].start_s == pytest.approx(3.0)
    waits = {(t.sibling, t.turn): t.latency_s for t in rec.tools}
    assert waits == {(0, 0): pytest.approx(1.6976), (1, 0): pytest.approx(4.45)}
    assert [c.tool_calls != () for c in rec.calls] == [True, False, True, False, False]
    assert rec.summary is not None
    assert rec.summary["shared_prefix"]["tokens"] == 512  # block 1 of every first request
    assert rec.summary["cached_tokens"] == 0 + 1024 + 512 + 1536 + 512
    assert plan(rec).shared_tokens == 512


def test_mooncake_max_gap_caps_the_waits_and_shifts_later_calls(tmp_path: Path) -> None:
    rec = import_trace(_mooncake(tmp_path), format="mooncake", max_gap_s=2.0)
    waits = {(t.sibling, t.turn): t.latency_s for t in rec.tools}
    assert waits == {(0, 0): pytest.approx(1.6976), (1, 0): pytest.approx(2.0)}
    assert rec.siblings()[1][1].start_s == pytest.approx(0.55 + 2.0)
    assert any("1 waits capped" in w for w in rec.warnings)
    dropped = import_trace(_mooncake(tmp_path), format="mooncake", max_gap_s=0)
    assert all(t.latency_s == 0 for t in dropped.tools)


def test_mooncake_a_repeated_request_continues_its_session(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1]},
        {"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [1]},
        {"timestamp": 2, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
    ]
    rec = import_trace(_mooncake(tmp_path, rows), format="mooncake")
    # Line 2 repeats line 1's ids: it continues that session (a prefix of its own);
    # line 3 then continues it again.
    assert [len(c) for c in rec.siblings().values()] == [3]
    rows[1]["hash_ids"], rows[1]["input_length"] = [5], 100
    rows.append({"timestamp": 3, "input_length": 1024, "output_length": 1, "hash_ids": [5, 6]})
    rec = import_trace(_mooncake(tmp_path, rows), format="mooncake")
    assert [len(c) for c in rec.siblings().values()] == [2, 2]


def test_kvtrace_sessions_subagents_resets_and_think_times(tmp_path: Path) -> None:
    path = _write(tmp_path, "k.json", json.dumps(KVTRACE))
    rec = import_trace(path)  # detected: a JSON array
    assert rec.header["imported_from"] == "kvtrace"
    # Siblings by start: trace a (0 s), trace b (1 s), a's sub-agent (2.5 s).
    assert _by_sibling(rec) == {
        0: [(128, 0, None), (300, 128, 138), (150, 128, 128)],
        1: [(100, 64, None)],
        2: [(192, 128, None)],
    }
    a = rec.siblings()[0]
    assert [(c.start_s, c.end_s) for c in a[:2]] == [(0.0, 1.0), (4.0, 6.0)]
    assert a[2].start_s == pytest.approx(9.0)  # no think_time: the `t` gap less api_time
    assert a[0].finish_reason == "tool_use"
    assert rec.siblings()[1][0].start_s == 1.0
    assert rec.siblings()[2][0].start_s == 2.5
    assert [(t.turn, t.start_s, t.latency_s) for t in rec.tools] == [(0, 1.0, 3.0), (1, 6.0, 3.0)]
    assert any("1 calls keep less" in w for w in rec.warnings)  # the third call: a compaction
    assert rec.summary is not None
    assert rec.summary["shared_prefix"]["tokens"] == 64


def test_kvtrace_local_scope_shares_nothing_across_traces(tmp_path: Path) -> None:
    traces = [{k: v for k, v in t.items() if k != "hash_id_scope"} for t in KVTRACE]
    path = _write(tmp_path, "k.jsonl", "".join(json.dumps(t) + "\n" for t in traces))
    rec = import_trace(path, format="kvtrace")
    assert rec.siblings()[1][0].cached_tokens == 0  # trace b's id 1 is not trace a's
    assert rec.siblings()[2][0].cached_tokens == 128  # the sub-agent shares a's scope
    assert rec.summary is not None
    assert rec.summary["shared_prefix"]["tokens"] == 0


def test_tracelab_rounds_prefix_and_waits(tmp_path: Path) -> None:
    rec = import_trace(_write(tmp_path, "t.csv", TRACELAB))
    assert rec.header["imported_from"] == "tracelab"
    assert _by_sibling(rec) == {
        0: [(1200, 0, None), (1500, 1250, 1250), (1700, 1560, 1560)],  # first request: cold
        1: [(1100, 1000, None), (1300, 400, 400)],  # round 1 keeps 400: a reset
    }
    s1 = rec.siblings()[0]
    assert [c.start_s for c in s1] == pytest.approx([0.0, 1.62, 3.22])
    assert [(t.sibling, t.turn, t.latency_s) for t in rec.tools] == [
        (0, 0, 0.5),
        (0, 1, 0.25),
        (1, 0, 0.0),
    ]
    assert rec.summary is not None
    assert rec.summary["shared_prefix"]["tokens"] == 1000
    assert any("1 calls keep less" in w for w in rec.warnings)


def test_errors_name_the_place_and_never_quote_the_content(tmp_path: Path) -> None:
    secret = "sk-SECRET-prompt"
    bad = [MOONCAKE[0], {**MOONCAKE[1], "input_length": secret}]
    with pytest.raises(ValueError, match="line 2: field 'input_length'") as info:
        import_trace(_mooncake(tmp_path, bad), format="mooncake")
    assert secret not in str(info.value)
    path = _write(tmp_path, "x.jsonl", json.dumps(MOONCAKE[0]) + "\n{" + secret + "\n")
    with pytest.raises(ValueError, match="line 2: not JSON") as info:
        import_trace(path, format="mooncake")
    assert secret not in str(info.value)
    short = [{**MOONCAKE[0], "hash_ids": [1]}]
    with pytest.raises(ValueError, match="line 1: 1 hash ids of 512 tokens"):
        import_trace(_mooncake(tmp_path, short), format="mooncake")
    sub = json.loads(json.dumps(KVTRACE))
    del sub[0]["subagents"][0]["requests"][0]["out"]
    with pytest.raises(ValueError, match="trace 0 subagent 0 request 0: field 'out' is missing"):
        import_trace(_write(tmp_path, "k.json", json.dumps(sub)), format="kvtrace")
    rows = TRACELAB.replace("s2,1,400,1300", f"s2,1,{secret},1300")
    with pytest.raises(ValueError, match="line 6: field 'prefix_len'") as info:
        import_trace(_write(tmp_path, "t.csv", rows), format="tracelab")
    assert secret not in str(info.value)
    over = TRACELAB.replace("s2,1,400,1300", "s2,1,1400,1300")
    with pytest.raises(ValueError, match="line 6: prefix_len is more than input_len"):
        import_trace(_write(tmp_path, "t.csv", over), format="tracelab")
    with pytest.raises(ValueError, match="lacks column"):
        import_trace(_write(tmp_path, "t.csv", "session_id,round_idx\na,0\n"), format="tracelab")
    with pytest.raises(ValueError, match="needs --format") as info:
        import_trace(_write(tmp_path, "u.txt", secret + "\n"))
    assert secret not in str(info.value)
    with pytest.raises(ValueError, match="max_gap_s"):
        import_trace(_mooncake(tmp_path), format="mooncake", max_gap_s=-1)


def test_own_format_is_detected_and_read_as_before(tmp_path: Path) -> None:
    header = {"type": "header", "format": "langgraph-batch-record", "version": 1}
    call = {
        "type": "llm", "sibling": 0, "turn": 0, "start_s": 0.0, "end_s": 1.0,
        "prompt_tokens": 10, "cached_tokens": 0, "output_tokens": 2,
    }  # fmt: skip
    path = _write(tmp_path, "r.jsonl", json.dumps(header) + "\n" + json.dumps(call) + "\n")
    rec = import_trace(path)
    assert "imported_from" not in rec.header
    assert [c.prompt_tokens for c in rec.calls] == [10]
    assert not any("max_gap_s" in w for w in rec.warnings)
    rec = import_trace(path, format="record", max_gap_s=1)
    assert any("max_gap_s (--max-gap) not applied" in w for w in rec.warnings)


# Public sample lines: the first lines of Mooncake's FAST'25 trace as quoted in NVIDIA Dynamo's
# benchmarks/data_generator/README.md, and AIPerf's trace-replay example (docs/benchmark_modes).
MOONCAKE_PUBLIC = [
    {"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": list(range(14))},
    {"timestamp": 0, "input_length": 7319, "output_length": 490,
     "hash_ids": [0, *range(14, 28)]},
    {"timestamp": 3052, "input_length": 7234, "output_length": 794,
     "hash_ids": [0, *range(28, 42)]},
    {"timestamp": 3052, "input_length": 2287, "output_length": 316,
     "hash_ids": [0, *range(42, 46)]},
]  # fmt: skip
AIPERF_EXAMPLE = [
    {"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]},
    {"timestamp": 10535, "input_length": 672, "output_length": 26, "hash_ids": [46, 47]},
    {"timestamp": 27482, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]},
]


def test_public_mooncake_lines(tmp_path: Path) -> None:
    rec = import_trace(_mooncake(tmp_path, MOONCAKE_PUBLIC))  # detected
    # Four first requests sharing block 0 (a 512-token system prompt): four siblings.
    assert _by_sibling(rec) == {
        0: [(6755, 0, None)],
        1: [(7319, 512, None)],
        2: [(7234, 512, None)],
        3: [(2287, 512, None)],
    }
    assert [calls[0].start_s for calls in rec.siblings().values()] == [0.0, 0.0, 3.052, 3.052]
    assert rec.summary is not None
    assert rec.summary["shared_prefix"]["tokens"] == 512
    assert rec.tools == ()

    rec = import_trace(_mooncake(tmp_path, AIPERF_EXAMPLE), format="mooncake")
    # The same two blocks three times: one session of three turns, each fully cached
    # (at most its prompt), each keeping the previous prompt and reply.
    assert _by_sibling(rec) == {0: [(655, 0, None), (672, 672, 672), (655, 655, 655)]}
    waits = [t.latency_s for t in rec.tools]
    assert waits == pytest.approx([10.535 - 1.1055, 27.482 - 10.535 - 0.5872])
    capped = import_trace(_mooncake(tmp_path, AIPERF_EXAMPLE), format="mooncake", max_gap_s=5)
    assert [t.latency_s for t in capped.tools] == [5.0, 5.0]
