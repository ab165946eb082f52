"""`Recorder`: the JSON Lines it writes (format version 1) and how it links calls."""

from __future__ import annotations

import asyncio
import io
import json
import operator
import os
import threading
import time
from typing import Annotated, Any, TypedDict
from uuid import uuid4

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult, LLMResult
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Send

from langgraph_batch.record import FORMAT, FORMAT_VERSION, Recorder, read_recording
from langgraph_batch.record._format import parse_lines, shared_prefix


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        self.t += 0.5
        return self.t


def reply(text: str, *, calls: list[dict[str, Any]] | None = None, usage: Any = None) -> LLMResult:
    msg = AIMessage(text, tool_calls=calls or [], usage_metadata=usage)
    return LLMResult(generations=[[ChatGeneration(message=msg)]])


def usage(prompt: int, out: int, cached: int | None = None) -> dict[str, Any]:
    u: dict[str, Any] = {"input_tokens": prompt, "output_tokens": out, "total_tokens": prompt + out}
    if cached is not None:
        u["input_token_details"] = {"cache_read": cached}
    return u


SYSTEM = SystemMessage("You are an agent. " * 20)


def lines(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(x) for x in buf.getvalue().splitlines()]


def test_header_llm_tool_and_summary_lines_without_content() -> None:
    buf = io.StringIO()
    rec = Recorder(buf, key="k", clock=Clock())
    first = [SYSTEM, HumanMessage("Task 0: secret text")]
    run = uuid4()
    call = {"name": "search", "args": {"q": "a"}, "id": "call-1"}
    rec.on_chat_model_start({}, [first], run_id=run, invocation_params={"model": "m"})
    rec.on_llm_end(reply("thinking", calls=[call], usage=usage(120, 9, 0)), run_id=run)
    tool_run = uuid4()
    rec.on_tool_start({"name": "search"}, "{'q': 'a'}", run_id=tool_run, inputs={"q": "a"},
                      tool_call_id="call-1", name="search")  # fmt: skip
    rec.on_tool_end("result text", run_id=tool_run)
    rec.close()
    header, llm, tool_line, summary = lines(buf)
    assert header["type"] == "header"
    assert (header["format"], header["version"]) == (FORMAT, FORMAT_VERSION) == (FORMAT, 1)
    assert header["content"] is False
    assert llm["type"] == "llm"
    assert (llm["sibling"], llm["turn"]) == (0, 0)
    assert (llm["prompt_tokens"], llm["cached_tokens"], llm["output_tokens"]) == (120, 0, 9)
    assert (llm["start_s"], llm["end_s"]) == (0.0, 0.5)
    assert llm["model"] == "m"
    assert [r[0] for r in llm["new"]] == ["system", "user"]
    assert llm["new"][1][2] == len("Task 0: secret text")
    assert llm["tool_calls"] == [["search", tool_line["args_hash"]]]
    assert (tool_line["sibling"], tool_line["turn"], tool_line["name"]) == (0, 0, "search")
    assert tool_line["latency_s"] == 0.5
    assert tool_line["result_chars"] == len("result text")
    assert summary["type"] == "summary"
    assert (summary["llm_calls"], summary["tool_calls"], summary["prompt_tokens"]) == (1, 1, 120)
    text = buf.getvalue()
    assert "secret" not in text  # digests and lengths only
    assert "thinking" not in text


def test_digests_are_keyed() -> None:
    digests = []
    for key in ("a", "b", "a"):
        buf = io.StringIO()
        rec = Recorder(buf, key=key)
        run = uuid4()
        rec.on_chat_model_start({}, [[HumanMessage("hello")]], run_id=run)
        rec.on_llm_end(reply("x", usage=usage(3, 1)), run_id=run)
        rec.close()
        digests.append(lines(buf)[1]["new"][0][1])
    assert digests[0] == digests[2] != digests[1]


def test_content_is_opt_in() -> None:
    buf = io.StringIO()
    rec = Recorder(buf, content=True)
    run = uuid4()
    rec.on_chat_model_start({}, [[HumanMessage("hello there")]], run_id=run)
    rec.on_llm_end(reply("general kenobi", usage=usage(3, 2)), run_id=run)
    rec.close()
    row = lines(buf)[1]
    assert row["content"] == ["hello there"]
    assert row["output"] == "general kenobi"


def test_conversations_continue_by_prefix_and_share_the_system_prompt() -> None:
    buf = io.StringIO()
    rec = Recorder(buf, clock=Clock())
    convs = [[SYSTEM, HumanMessage(f"task {i}")] for i in range(3)]
    runs = [uuid4() for _ in convs]
    replies = []
    for conv, run in zip(convs, runs, strict=True):
        rec.on_chat_model_start({}, [conv], run_id=run)
    for i, run in enumerate(runs):
        call = {"name": "search", "args": {"q": str(i)}, "id": f"c{i}"}
        result = reply("", calls=[call], usage=usage(100 + i, 10, 80 if i else 0))
        replies.append(result.generations[0][0].message)  # type: ignore[attr-defined]
        rec.on_llm_end(result, run_id=run)
    # Second turns arrive in another order; each continues its own conversation.
    from langchain_core.messages import ToolMessage

    for i in (2, 0):
        nxt = [*convs[i], replies[i], ToolMessage("r" * (i + 1), tool_call_id=f"c{i}")]
        run = uuid4()
        rec.on_chat_model_start({}, [nxt], run_id=run)
        rec.on_llm_end(reply("done", usage=usage(150 + i, 5, 96)), run_id=run)
    rec.close()
    rows = [r for r in lines(buf) if r["type"] == "llm"]
    second = {r["sibling"]: r for r in rows if r["turn"] == 1}
    assert set(second) == {0, 2}
    assert second[2]["prompt_tokens"] == 152
    assert second[2]["prefix_messages"] == 3  # system, task, the reply
    assert [r[0] for r in second[2]["new"]] == ["tool"]
    assert second[2]["new"][0][2] == 3
    firsts = [r for r in rows if r["turn"] == 0]
    assert sorted(r["first_messages"] for r in firsts) == [1, 1, 2]  # the system prompt is shared
    summary = lines(buf)[-1]
    assert summary["siblings"] == 3
    assert summary["shared_prefix"]["messages"] == 1
    assert summary["cached_tokens"] == 80 * 2 + 96 * 2
    # Tokens: the first calls' prompts in proportion to the shared characters, at least the
    # fewest cached tokens a later sibling's first call saw (80).
    assert 80 <= summary["shared_prefix"]["tokens"] <= 100


def test_read_recording_round_trip_and_errors(tmp_path: Any) -> None:
    path = tmp_path / "job.jsonl"
    with Recorder(path) as rec:
        run = uuid4()
        rec.on_chat_model_start({}, [[SYSTEM, HumanMessage("t")]], run_id=run)
        rec.on_llm_error(RuntimeError("boom"), run_id=run)
    recording = read_recording(path)
    assert recording.header["version"] == 1
    (call,) = recording.calls
    assert call.error == "RuntimeError"
    assert call.prompt_tokens is None
    assert recording.summary is not None
    assert not recording.warnings
    with pytest.raises(ValueError, match="not a langgraph-batch-record"):
        parse_lines(['{"type": "llm"}'])
    with pytest.raises(ValueError, match="upgrade"):
        parse_lines([json.dumps({"type": "header", "format": FORMAT, "version": 99})])
    with pytest.raises(ValueError, match="line 2: malformed"):
        parse_lines([json.dumps({"type": "header", "format": FORMAT, "version": 1}), "{"])
    unclosed = parse_lines([json.dumps({"type": "header", "format": FORMAT, "version": 1})])
    assert unclosed.warnings


def test_shared_prefix_of_one_sibling_is_its_system_turn() -> None:
    from langgraph_batch.record import LLMCall

    call = LLMCall(sibling=0, turn=0, start_s=0, end_s=1, prompt_tokens=100, cached_tokens=None,
                   output_tokens=5, messages=2, prefix_messages=0, first_messages=2,
                   new=(("system", "h", 300), ("user", "u", 100)), tool_calls=())  # fmt: skip
    assert shared_prefix([call]) == {"messages": 1, "chars": 300, "tokens": 75}
    assert shared_prefix([]) == {"messages": 0, "chars": 0, "tokens": 0}


def _first(
    sibling: int, *, tools: str | None, prompt: int, cached: int | None, first_messages: int = 1
) -> Any:
    from langgraph_batch.record import LLMCall

    return LLMCall(sibling=sibling, turn=0, start_s=0, end_s=1, prompt_tokens=prompt,
                   cached_tokens=cached, output_tokens=5, messages=2, prefix_messages=0,
                   first_messages=first_messages, new=(("system", "s", 400), ("user", "u", 100)),
                   tool_calls=(), tools=tools, tools_chars=1500)  # fmt: skip


def test_shared_prefix_counts_tools_only_when_every_sibling_offered_the_same() -> None:
    same = [_first(i, tools="t1", prompt=500, cached=None) for i in range(3)]
    # system (400 chars) + tools (1,500) of 2,000 characters: 95% of 500 tokens
    assert shared_prefix(same) == {"messages": 1, "chars": 1900, "tokens": 475}
    differ = [*same[:2], _first(2, tools="t2", prompt=500, cached=None)]
    # The tools differ: only the system message is byte-identical (400 of 2,000 characters).
    assert shared_prefix(differ) == {"messages": 1, "chars": 400, "tokens": 100}
    no_tools = [_first(i, tools=None, prompt=500, cached=None) for i in range(2)]
    assert shared_prefix(no_tools)["chars"] == 400


def test_shared_prefix_is_raised_only_to_what_every_later_sibling_found_cached() -> None:
    # One later sibling found 450 tokens cached (its own conversation from before the
    # recording, say), another none: nothing is proven shared beyond the characters.
    calls = [_first(0, tools="a", prompt=500, cached=0), _first(1, tools="b", prompt=500,
             cached=450), _first(2, tools="c", prompt=500, cached=0)]  # fmt: skip
    assert shared_prefix(calls)["tokens"] == 100
    # Every later sibling found 300 cached: the server proved 300 shared tokens.
    proven = [calls[0], *(_first(i, tools="b", prompt=500, cached=300) for i in (1, 2))]
    assert shared_prefix(proven)["tokens"] == 300


class _Fake(BaseChatModel):
    """Calls `lookup` once per conversation, then answers; reports usage."""

    @property
    def _llm_type(self) -> str:
        return "fake"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, **kw: Any) -> ChatResult:
        prompt = sum(len(str(m.content)) for m in messages) // 4
        task = str(messages[1].content)
        if len(messages) == 2:
            calls = [{"name": "lookup", "args": {"q": task[-1]}, "id": f"id-{task}"}]
            msg = AIMessage("", tool_calls=calls, usage_metadata=usage(prompt, 7))
        else:
            msg = AIMessage("answer", usage_metadata=usage(prompt, 3, prompt // 2))
        return ChatResult(generations=[ChatGeneration(message=msg)])


@tool
def lookup(q: str) -> str:
    """Look q up."""
    return "found " + q * 10


class _Agent(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]


class _Parent(TypedDict, total=False):
    tasks: list[str]
    done: Annotated[list[str], operator.add]


def test_a_send_map_reduce_graph_is_recorded_per_conversation() -> None:
    llm = _Fake()
    g = StateGraph(_Agent)
    g.add_node("model", lambda s: {"messages": [llm.invoke(s["messages"])]})
    g.add_node("tools", ToolNode([lookup]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition, ["tools", END])
    g.add_edge("tools", "model")
    agent = g.compile()

    def run_agent(state: dict[str, Any]) -> dict[str, Any]:
        out = agent.invoke({"messages": [SYSTEM, HumanMessage(state["task"])]})
        return {"done": [out["messages"][-1].content]}

    p = StateGraph(_Parent)
    p.add_node("agent", run_agent)  # type: ignore[type-var]
    p.add_conditional_edges(START, lambda s: [Send("agent", {"task": t}) for t in s["tasks"]])
    p.add_edge("agent", END)
    buf = io.StringIO()
    with Recorder(buf) as rec:
        p.compile().invoke({"tasks": ["task a", "task b", "task c"]}, {"callbacks": [rec]})
    recording = parse_lines(buf.getvalue().splitlines())
    siblings = recording.siblings()
    assert len(siblings) == 3
    for calls in siblings.values():
        assert [c.turn for c in calls] == [0, 1]
        assert calls[1].prefix_messages == 3
        assert [r for r, _, _ in calls[1].new] == ["tool"]
        assert len(calls[0].tool_calls) == 1
    assert len(recording.tools) == 3
    for run in recording.tools:
        (call,) = [c for c in siblings[run.sibling] if c.turn == run.turn]
        assert call.tool_calls[0][1] == run.args_hash
    assert recording.summary is not None
    assert recording.summary["shared_prefix"]["messages"] == 1


async def test_async_use_never_blocks_the_event_loop(tmp_path: Any) -> None:
    # blockbuster (autouse) fails this test on a file open or write inside the loop.
    path = tmp_path / "job.jsonl"
    async with Recorder(path) as rec:
        run = uuid4()
        rec.on_chat_model_start({}, [[HumanMessage("hi")]], run_id=run)
        rec.on_llm_end(reply("x", usage=usage(3, 1)), run_id=run)
    recording = await asyncio.to_thread(read_recording, path)
    assert len(recording.calls) == 1


def test_an_unwritable_path_fails_at_close(tmp_path: Any) -> None:
    rec = Recorder(tmp_path / "missing" / "job.jsonl")
    rec.on_chat_model_start({}, [[HumanMessage("hi")]], run_id=uuid4())
    with pytest.raises(FileNotFoundError):
        rec.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_failed_write_closes_the_file() -> None:
    before = _open_fds()
    rec = Recorder("/dev/full")  # opens, then every flush fails with ENOSPC
    run = uuid4()
    rec.on_chat_model_start({}, [[HumanMessage("hi")]], run_id=run)
    rec.on_llm_end(reply("x", usage=usage(3, 1)), run_id=run)
    with pytest.raises(OSError, match="No space"):
        rec.close()
    assert _open_fds() == before


class FailsAtTheEnd(io.StringIO):
    """Its first write waits for `go`; every flush fails once `go` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def write(self, text: str) -> int:
        self.go.wait(10)
        return super().write(text)

    def flush(self) -> None:
        if self.go.is_set():
            raise OSError(28, "No space left on device")


def test_a_write_error_at_the_last_flush_does_not_hang_close() -> None:
    fh = FailsAtTheEnd()
    rec = Recorder(fh)
    raised: list[BaseException] = []

    def close() -> None:
        try:
            rec.close()
        except OSError as exc:
            raised.append(exc)

    closer = threading.Thread(target=close, daemon=True)
    closer.start()
    deadline = time.monotonic() + 5
    while rec._queue.qsize() < 2 and time.monotonic() < deadline:  # the summary and the end
        time.sleep(0.01)
    fh.go.set()  # the writer writes the header, the summary, then flushes once: it fails
    closer.join(5)
    assert not closer.is_alive(), "close() hung"
    assert [type(e) for e in raised] == [OSError]


def test_nothing_is_kept_after_close() -> None:
    # A recorder left in a model's callbacks after close must not pile up lines or calls.
    buf = io.StringIO()
    rec = Recorder(buf)
    rec.close()
    written = buf.getvalue()
    for _ in range(3):
        run, tool_run = uuid4(), uuid4()
        rec.on_chat_model_start({}, [[HumanMessage("hi")]], run_id=run)
        rec.on_llm_end(reply("x", usage=usage(3, 1)), run_id=run)
        rec.on_tool_start({"name": "t"}, "a", run_id=tool_run, name="t")
        rec.on_tool_end("r", run_id=tool_run)
    rec.close()
    assert buf.getvalue() == written
    assert rec._queue.empty()
    assert not rec._open
    assert not rec._tools_open
    assert lines(buf)[-1]["type"] == "summary"


def test_a_wrong_file_is_refused_without_quoting_it() -> None:
    # `bench --replay` on a JSON file by mistake (a config, a data set of prompts).
    for first in ('{"api_key": "sk-live-0123456789"}', '{"prompt": "my private text"}'):
        with pytest.raises(ValueError, match="not a langgraph-batch-record") as info:
            parse_lines([first])
        assert "sk-live" not in str(info.value)
        assert "private" not in str(info.value)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("start_s", float("nan"), "seconds"),
        ("end_s", float("inf"), "seconds"),
        ("start_s", -1.0, "seconds"),
        ("prompt_tokens", 10**12, "context window"),
        ("prompt_tokens", -5, "negative"),
        ("output_tokens", "many", "whole number"),
        ("turn", 1.5, "whole number"),
    ],
)
def test_a_number_no_run_could_record_is_refused_with_its_line(
    field: str, value: object, says: str
) -> None:
    # JSON lets NaN and Infinity through: a replay would wait forever or build huge prompts.
    call = {"type": "llm", "sibling": 0, "turn": 1, "start_s": 0.0, "end_s": 1.0}
    call[field] = value
    header = json.dumps({"type": "header", "format": FORMAT, "version": 1})
    with pytest.raises(ValueError, match=f"line 2: malformed .*{says}"):
        parse_lines([header, json.dumps(call)])
    call[field] = {"turn": 2, "prompt_tokens": 100, "output_tokens": 7}.get(field, 0.5)
    assert len(parse_lines([header, json.dumps(call)]).calls) == 1


def test_a_fan_out_siblings_reset_keeps_its_common_prefix() -> None:
    # Inside a fan_out the recorder knows the sibling: a call that continues none of its
    # conversation's ends (its context was trimmed) shares its leading messages with the
    # sibling's previous call, and says how many (the replay reads a reset from that).
    from langgraph_batch._context import SiblingInfo, sibling_scope

    buf = io.StringIO()
    rec = Recorder(buf, clock=Clock())
    task = HumanMessage("task")
    with sibling_scope(SiblingInfo(group="g", index=0)):
        run = uuid4()
        rec.on_chat_model_start({}, [[SYSTEM, task]], run_id=run)
        first = reply("thinking", usage=usage(100, 10))
        rec.on_llm_end(first, run_id=run)
        run = uuid4()
        grown = [SYSTEM, task, first.generations[0][0].message, HumanMessage("more")]  # type: ignore[attr-defined]
        rec.on_chat_model_start({}, [grown], run_id=run)
        rec.on_llm_end(reply("ok", usage=usage(130, 10)), run_id=run)
        run = uuid4()
        rec.on_chat_model_start({}, [[SYSTEM, task, HumanMessage("summary")]], run_id=run)
        rec.on_llm_end(reply("done", usage=usage(110, 5)), run_id=run)
    rec.close()
    rows = [r for r in lines(buf) if r["type"] == "llm"]
    assert [(r["turn"], r["messages"], r["prefix_messages"]) for r in rows] == [
        (0, 2, 0),
        (1, 4, 3),
        (2, 3, 2),  # system and task kept of the previous 4: a reset
    ]
    assert rows[2]["new"][0][0] == "user"
