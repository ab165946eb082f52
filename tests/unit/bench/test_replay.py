"""Replay synthesis (`bench/replay.py`): a recording becomes a job that reproduces its shape.

Resets, compactions and start offsets (`bench/replay_plan.py`) from hand-made recordings.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks.contenders.ideal import resident_bound
from langgraph_batch.bench import replay
from langgraph_batch.bench.replay_run import compare, gap_figures
from langgraph_batch.bench.timeline import breakdown, split_gaps
from langgraph_batch.bench.toolservice import canonical_key
from langgraph_batch.emulator.tokenizer import count_tokens, render_chat
from langgraph_batch.record import FORMAT
from langgraph_batch.record._format import parse_lines

HEADER = {"type": "header", "format": FORMAT, "version": 1}


def llm(sib: int, turn: int, prompt: int, out: int, *, calls: tuple[str, ...] = (),
        start: float = 0.0, end: float = 1.0, cached: int | None = None,
        new: list[list[Any]] | None = None, first: int = 1) -> dict[str, Any]:  # fmt: skip
    return {
        "type": "llm", "sibling": sib, "turn": turn, "start_s": start, "end_s": end,
        "prompt_tokens": prompt, "cached_tokens": cached, "output_tokens": out,
        "messages": 2 + 2 * turn, "prefix_messages": 0 if turn == 0 else 1 + 2 * turn,
        "first_messages": first,
        "new": new or ([["system", "s", 2000], ["user", f"u{sib}", 400]] if turn == 0
                       else [["tool", "t", 800]]),
        "tools": "x", "tools_chars": 200,
        "tool_calls": [["search", h] for h in calls], "finish_reason": None, "error": None,
    }  # fmt: skip


def tool(sib: int, turn: int, h: str, latency: float, start: float = 1.0) -> dict[str, Any]:
    return {"type": "tool", "sibling": sib, "turn": turn, "name": "search", "args_hash": h,
            "start_s": start, "end_s": start + latency, "latency_s": latency,
            "result_chars": 100, "error": None}  # fmt: skip


def recording(rows: list[dict[str, Any]], shared: int = 600) -> Any:
    summary = {"type": "summary", "shared_prefix": {"messages": 1, "chars": 2200, "tokens": shared}}
    return parse_lines(json.dumps(r) for r in [HEADER, *rows, summary])


def three_siblings() -> Any:
    # Siblings 0 and 1 ask the same first question (coalescible); 0 asks a second one;
    # 2 asks its own. Sibling 1 never ran its tool (it shared 0's run).
    return recording([
        llm(0, 0, 800, 60, calls=("hA",), end=1.0),
        llm(1, 0, 820, 40, calls=("hA",), end=1.0, cached=592, first=1),
        llm(2, 0, 840, 50, calls=("hC",), end=1.2, cached=592),
        tool(0, 0, "hA", 0.5), tool(2, 0, "hC", 0.25, start=1.2),
        llm(0, 1, 1300, 70, calls=("hB",), start=1.5, end=2.0, cached=848),
        tool(0, 1, "hB", 1.0, start=2.0),
        llm(1, 1, 1300, 200, start=1.5, end=3.0, cached=848),
        llm(2, 1, 1200, 210, start=1.45, end=3.0, cached=880),
        llm(0, 2, 1900, 200, start=3.0, end=4.0, cached=1360),
    ])  # fmt: skip


def test_plan_reads_turns_waits_and_shares_keys() -> None:
    rp = replay.plan(three_siblings())
    assert [len(s.turns) for s in rp.siblings] == [3, 2, 2]
    assert [s.key for s in rp.siblings] == ["g0", "g0", "g1"]  # 0 and 1 agree on their calls
    assert [t.wait_s for t in rp.siblings[0].turns] == [0.5, 1.0, 0.0]
    assert rp.siblings[1].turns[0].wait_s == 0.5  # its call's digest ran for 0.5 s
    assert rp.siblings[2].turns[0].wait_s == 0.25
    assert rp.shared_tokens == 600
    rec = rp.recorded
    assert (rec["llm_requests"], rec["prompt_tokens"], rec["generation_tokens"]) == (7, 8160, 830)
    assert rec["cached_tokens"] == 592 * 2 + 848 * 2 + 880 + 1360
    assert (rec["tool_calls_requested"], rec["tool_calls_executed"]) == (4, 3)
    assert rec["makespan_s"] == 4.0
    assert rec["tool_wait_mean_s"] == pytest.approx((0.5 + 1.0 + 0.5 + 0.25) / 4)


def test_synthesized_prompts_have_the_recorded_lengths_on_the_emulator() -> None:
    rp = replay.plan(three_siblings())
    syn = replay.synthesize(rp)
    tools = [replay.openai_tool(syn.tool)]
    shared = render_chat([{"role": "system", "content": syn.system}], tools=tools,
                         add_generation_prompt=False)  # fmt: skip
    assert count_tokens(shared) == 600
    for sib, prompts in zip(rp.siblings, syn.prompts, strict=True):
        recorded = [t.prompt_tokens for t in sib.turns]
        assert prompts[0] == recorded[0]
        # Siblings sharing a call share its result (sized to their mean): within a few tokens.
        assert all(abs(a - b) <= 15 for a, b in zip(prompts, recorded, strict=True)), (
            prompts,
            recorded,
        )
    assert sum(map(sum, syn.prompts)) == pytest.approx(8160, abs=3)
    # Every call is bound to its recorded output length; the last one answers.
    assert [c["max_tokens"] for c in syn.calls[0]] == [60, 70, 200]
    assert [c["answer"] for c in syn.calls[0]] == [False, False, True]
    # Tasks carry the key, the turns and the visible text before each call.
    assert "key=g0 turns=3 think=" in syn.tasks[0]
    assert "key=g1 turns=2" in syn.tasks[2]
    key = canonical_key("search", {"query": "g0"})
    assert syn.latency[key] == 0.5
    assert syn.latency[canonical_key("search", {"query": "g0.1"})] == 1.0
    assert syn.latency[canonical_key("search", {"query": "g1"})] == 0.25
    assert set(syn.result_tokens) == set(syn.latency)
    assert syn.keys == ["g0", "g0.1", "g1"]
    assert not syn.deviations
    cfg = replay.tool_config(syn, time_scale=2.0, seed=0)
    assert cfg.latency_for(key) == 0.25  # shrunk with the emulator's clock
    assert count_tokens(cfg.result_for(key)) == syn.result_tokens[key]


def test_replay_job_and_bound() -> None:
    rp = replay.plan(three_siblings())
    syn = replay.synthesize(rp)
    job = replay.make_replay_job(rp, syn, llm_url="http://e", tool_url="http://t", model="m",
                                 contender="naive-bounded")  # fmt: skip
    assert job["replay_calls"] == syn.calls
    assert job["turns_per_task"] == [3, 2, 2]
    assert job["max_concurrency"] == 32
    assert job["forced_shapes"] is False
    assert job["tools"] == [syn.tool]
    bound = resident_bound(rp, syn, profile_name="h100-llama3-8b")
    assert bound["makespan_s"] >= bound["critical_path_s"] > 1.5  # 0.5 + 1.0 s of tools
    assert bound["decode_tokens"] == 830
    assert bound["shared_prefix_tokens"] == 600


def test_unshareable_and_short_recordings() -> None:
    # Sibling 1's calls differ from 0's at its second turn: a key of its own.
    rows = [
        llm(0, 0, 800, 60, calls=("hA",)), llm(0, 1, 1200, 60, calls=("hB",), start=2),
        llm(0, 2, 1500, 9, start=3), llm(1, 0, 800, 60, calls=("hA",)),
        llm(1, 1, 1200, 60, calls=("hX",), start=2), llm(1, 2, 1500, 9, start=3),
        llm(2, 0, 700, 5),
    ]  # fmt: skip
    rp = replay.plan(recording(rows))
    assert [s.key for s in rp.siblings] == ["g0", "g1", "s2"]
    assert rp.siblings[0].turns[0].wait_s == 1.0  # no tool run recorded: the sibling's wait
    with pytest.raises(ValueError, match="no model call"):
        replay.plan(recording([]))


def test_fidelity_ratios_and_waits_from_a_timeline() -> None:
    events = [[0.0, "start"], [0.0, "llm_start"], [1.0, "llm_end"], [1.0, "tool_start"],
              [1.4, "tool_end"], [1.5, "llm_start"], [2.0, "llm_end"], [2.0, "done"]]  # fmt: skip
    timeline = {"0": events}
    assert gap_figures(timeline)["tool_wait_mean_s"] == pytest.approx(0.4)
    assert gap_figures(timeline)["hold_mean_s"] == pytest.approx(0.1)
    fid = compare({"prompt_tokens": 100, "cached_tokens": 0, "makespan_s": 2.0},
                  {"prompt_tokens": 99, "cached_tokens": 5, "makespan_s": 2.2})  # fmt: skip
    assert fid["prompt_tokens"] == 0.99
    assert fid["cached_tokens"] is None
    assert fid["makespan_s"] == 1.1


def test_cli_replay_misuse(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from langgraph_batch.bench.cli import main

    assert main([]) == 2
    assert main(["W1", "--replay", "x.jsonl"]) == 2
    assert main(["--replay", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)]) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\n')
    assert main(["--replay", str(bad), "--out", str(tmp_path)]) == 1
    assert main(["--replay", str(bad), "--contenders", "batchagent"]) == 2
    assert main(["--replay", str(bad), "--n", "3"]) == 2
    err = capsys.readouterr().err
    assert "not a langgraph-batch-record file" in err
    assert "unknown contender(s) ['batchagent']" in err
    assert main(["W1", "--start", "together"]) == 2
    assert "--start applies to --replay only" in capsys.readouterr().err


@pytest.mark.parametrize("shared", [None, [600], "600", {"tokens": None}, {"tokens": "x"}])
def test_a_malformed_summary_prefix_is_recomputed(shared: Any) -> None:
    # A recording from elsewhere: a bad summary is not a crash (the CLI catches ValueError only).
    rows = [llm(0, 0, 800, 60), llm(1, 0, 820, 40, first=1)]
    lines = [HEADER, *rows, {"type": "summary", "shared_prefix": shared}]
    rp = replay.plan(parse_lines(json.dumps(r) for r in lines))
    assert rp.shared_tokens > 0


def test_cli_replay_format_options(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from langgraph_batch.bench.cli import main, parse_args

    args = parse_args(["--replay", "t.csv", "--format", "tracelab", "--max-gap", "5"])
    assert (args.trace_format, args.max_gap) == ("tracelab", 5.0)
    assert parse_args(["--replay", "t.jsonl"]).trace_format is None  # detected
    with pytest.raises(SystemExit):
        parse_args(["--replay", "t.csv", "--format", "otel"])
    assert main(["--replay", "t.csv", "--max-gap", "-1"]) == 2
    bad = tmp_path / "t.csv"
    bad.write_text("session_id,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms\n")
    assert main(["--replay", str(bad), "--format", "tracelab", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "--max-gap takes a number of seconds >= 0" in err
    assert "replay: no row in the file" in err


def reset_recording(*, prefix_tokens: int | None = None) -> Any:
    # Sibling 0: append, then a reset to its first two messages (system + task) plus a
    # summary; sibling 1 appends only and starts 2.5 s later; sibling 2 at 10 s.
    turn2 = llm(0, 2, 900, 80, start=3.0, end=3.5, cached=592)
    turn2 |= {"messages": 3, "prefix_messages": 2, "new": [["user", "sum", 400]]}
    if prefix_tokens is not None:
        turn2["prefix_tokens"] = prefix_tokens
    return recording([
        llm(0, 0, 800, 60, calls=("hA",), start=0.0, end=1.0),
        tool(0, 0, "hA", 0.5),
        llm(0, 1, 1300, 70, calls=("hB",), start=1.5, end=2.0, cached=848),
        tool(0, 1, "hB", 1.0, start=2.0),
        turn2,
        llm(1, 0, 820, 40, calls=("hC",), start=2.5, end=3.0, cached=592),
        tool(1, 0, "hC", 0.25, start=3.0),
        llm(1, 1, 1300, 200, start=3.3, end=4.0, cached=848),
        llm(2, 0, 700, 30, start=10.0, end=10.5, cached=592),
    ])  # fmt: skip


def test_a_reset_is_read_from_prefix_messages_as_an_estimate() -> None:
    rp = replay.plan(reset_recording())
    turns = rp.siblings[0].turns
    assert [t.kept_tokens for t in turns] == [None, None, 780]
    # Kept: system 2000 + task 400 + tools 200 chars of 2600 + 400 new: 900 * 2600 / 3000.
    assert turns[2].kept_estimated
    assert all(t.kept_tokens is None for s in rp.siblings[1:] for t in s.turns)


@pytest.mark.parametrize(("prefix", "kept"), [(650, 650), (1370, None), (1000, 900)])
def test_prefix_tokens_decides_a_reset_exactly(prefix: int, kept: int | None) -> None:
    # Below the previous prompt + output (1300 + 70) is a reset; at it, an append;
    # never more kept than the prompt itself (900).
    rp = replay.plan(reset_recording(prefix_tokens=prefix))
    turn = rp.siblings[0].turns[2]
    assert turn.kept_tokens == kept
    assert not turn.kept_estimated


def test_start_offsets_are_each_siblings_first_call_after_the_earliest() -> None:
    rp = replay.plan(reset_recording())
    assert [s.start_s for s in rp.siblings] == [0.0, 2.5, 10.0]


def test_a_reset_replays_as_kept_messages_then_a_new_message_of_the_recorded_size() -> None:
    rp = replay.plan(reset_recording(prefix_tokens=790))
    syn = replay.synthesize(rp)
    recorded = [[t.prompt_tokens for t in s.turns] for s in rp.siblings]
    assert syn.prompts == recorded
    step = syn.calls[0][2]
    assert step["keep"] == 2  # system + task: the whole-message boundary nearest 790
    assert "key=g0.r2 turns=1" in step["text"]  # the answer turn: no tool call left
    assert all("keep" not in c for c in syn.calls[0][:2] + syn.calls[1] + syn.calls[2])
    tools = [replay.openai_tool(syn.tool)]
    conv = [{"role": "system", "content": syn.system}, {"role": "user", "content": syn.tasks[0]}]
    kept = count_tokens(render_chat(conv, tools=tools, add_generation_prompt=False))
    prompt = [*conv, {"role": "user", "content": step["text"]}]
    assert count_tokens(render_chat(prompt, tools=tools)) == 900
    kept_line = [d for d in syn.deviations if "reset keeps" in d]
    assert kept_line == [
        f"sibling 0 turn 2: the reset keeps {kept} tokens, 790 recorded "
        f"({kept - 790:+d}: the replay keeps whole messages)"
    ]


def test_small_growth_is_listed_never_silent() -> None:
    # The second prompt grows by 5 tokens: less than a replayed tool call and its result.
    rows = [
        llm(0, 0, 800, 60, calls=("hA",)), tool(0, 0, "hA", 0.5),
        llm(0, 1, 805, 50, start=2.0, end=3.0),
    ]  # fmt: skip
    syn = replay.synthesize(replay.plan(recording(rows)))
    got = syn.prompts[0][1]
    assert got > 805
    assert syn.deviations[0].startswith("prompt sizes: 1 of 2 replayed prompts differ")
    assert (
        f"sibling 0 turn 1: prompt {got} tokens, 805 recorded (+{got - 805}: "
        in (syn.deviations[1])
    )


def test_a_shared_prefix_smaller_than_the_system_turn_says_what_it_means() -> None:
    rows = [llm(0, 0, 800, 60), llm(1, 0, 820, 40, first=0)]
    syn = replay.synthesize(replay.plan(recording(rows, shared=0)))
    line = next(d for d in syn.deviations if d.startswith("shared prefix"))
    assert "share 0 tokens" in line
    assert "more cached than recorded" in line


def test_one_split_of_the_wait_between_calls_feeds_every_table() -> None:
    # Two parallel tool calls (0.3 s of tool time, their union), then a 0.5 s hold: the
    # replay's tool wait and the breakdown's tool both read 0.3 s, the hold 0.5 s apart.
    events = [[0.0, "start"], [0.0, "llm_start"], [1.0, "llm_end"], [1.1, "tool_start"],
              [1.2, "tool_start"], [1.3, "tool_end"], [1.4, "tool_end"], [1.9, "llm_start"],
              [2.0, "llm_end"], [2.0, "done"]]  # fmt: skip
    [gap] = split_gaps(events)
    assert gap == pytest.approx({"tool": 0.3, "hold": 0.5, "other": 0.1, "gap": 0.9})
    figures = gap_figures({"0": events})
    b = breakdown({"0": events}, None)
    assert b is not None
    assert b["tool"] == pytest.approx(figures["tool_wait_mean_s"]) == pytest.approx(0.3)
    assert b["hold"] == pytest.approx(figures["hold_mean_s"]) == pytest.approx(0.5)
    assert b["other"] == pytest.approx(0.1)
    assert split_gaps([[0.0, "llm_end"], [0.2, "llm_start"]]) == [
        {"tool": 0.0, "hold": 0.0, "other": 0.2, "gap": 0.2}
    ]


def test_the_job_carries_scaled_start_offsets_unless_together() -> None:
    rp = replay.plan(reset_recording())
    syn = replay.synthesize(rp)
    kw: dict[str, Any] = {"llm_url": "e", "tool_url": "t", "model": "m", "contender": "naive"}
    job = replay.make_replay_job(rp, syn, time_scale=2.0, **kw)
    assert job["start_offsets"] == [0.0, 1.25, 5.0]
    assert replay.make_replay_job(rp, syn, start="together", **kw)["start_offsets"] is None
    from langgraph_batch.bench.contenders._graph import start_order

    assert start_order({"tasks": ["a", "b", "c"], "start_offsets": [3.0, 0.0, 1.0]}) == [1, 2, 0]


def test_the_bound_starts_siblings_at_their_offsets_and_prefills_after_a_reset() -> None:
    rp = replay.plan(reset_recording(prefix_tokens=790))
    syn = replay.synthesize(rp)
    staggered = resident_bound(rp, syn, profile_name="h100-llama3-8b")
    together = resident_bound(rp, syn, profile_name="h100-llama3-8b", start="together")
    assert staggered["critical_path_s"] > 10.0 > together["critical_path_s"]  # sibling 2 at 10 s
    # Sibling 0's reset prompt (900) reuses only its 790 kept tokens: 110 to prefill again.
    appended = replay.plan(reset_recording())
    for turn in appended.siblings[0].turns:
        turn.kept_tokens = None
    assert (
        staggered["prefill_tokens"]
        == resident_bound(appended, syn, profile_name="h100-llama3-8b")["prefill_tokens"] + 110
    )


def test_a_compaction_mid_conversation_keeps_a_tool_result_and_goes_on_calling() -> None:
    # Five turns; turn 3 keeps the conversation up to turn 1's tool result (1300 tokens of
    # its 1800), then grows again: one more tool call (its argument counts the kept
    # result, as the emulated model does), then the answer.
    rows = [
        llm(0, 0, 800, 60, calls=("h0",)), tool(0, 0, "h0", 0.5),
        llm(0, 1, 1300, 60, calls=("h1",), start=2), tool(0, 1, "h1", 0.5, start=3),
        llm(0, 2, 1800, 60, calls=("h2",), start=4), tool(0, 2, "h2", 0.5, start=5),
        llm(0, 3, 1500, 60, calls=("h3",), start=6) | {"prefix_tokens": 1290},
        tool(0, 3, "h3", 0.5, start=7), llm(0, 4, 1900, 60, start=8),
    ]  # fmt: skip
    rp = replay.plan(recording(rows))
    assert [t.kept_tokens for t in rp.siblings[0].turns] == [None, None, None, 1290, None]
    syn = replay.synthesize(rp)
    assert syn.prompts == [[800, 1300, 1800, 1500, 1900]]
    step = syn.calls[0][3]
    assert step["keep"] == 4  # system, task, turn 0's call and its result
    assert "key=g0.r3 turns=3" in step["text"]  # 1 result kept + 2 turns left
    assert syn.keys == ["g0", "g0.1", "g0.2", "g0.r3.1"]


def test_the_replay_markdown_shows_tool_and_hold_apart_in_both_tables() -> None:
    from langgraph_batch.bench.replay_run import markdown

    events = [[0.0, "start"], [0.0, "llm_start"], [1.0, "llm_end"], [1.0, "tool_start"],
              [1.4, "tool_end"], [1.9, "llm_start"], [2.0, "llm_end"], [2.0, "done"]]  # fmt: skip
    entry: dict[str, Any] = {"prompt_tokens": 10, "breakdown": breakdown({"0": events}, None)}
    entry |= gap_figures({"0": events})
    result = {
        "recorded": {"llm_requests": 2, "tool_calls_requested": 1, "tool_wait_mean_s": 0.4},
        "params": {"recording": "x", "n": 1, "server": {"url": "u"}, "times": "s"},
        "contenders": {"langgraph-batch": entry | {"fidelity": compare({}, {})}},
        "warnings": [],
    }
    md = markdown(result)
    assert "| mean tool wait s | mean hold s |" in md
    assert "| 0.400 | 0.500 |" in md  # tool wait, then hold
    assert "| decode | tool | hold | other |" in md
    assert "| 0.40 | 0.50 | 0.00 |" in md  # the breakdown's tool, hold, other
