"""Malformed tool calls are never a silent success (issue 10, item 4).

Default `invalid_tool_calls="raise"`: a response whose tool call the bound
tools cannot take is retried within `max_retries` and then raises
`MalformedToolCallError`; `"return"` keeps ChatOpenAI's `invalid_tool_calls`.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

import pytest
from langchain_core.tools import tool

from langgraph_batch.backends.base import ChatRequest, ToolCall
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.chat_model._convert import first_malformed_tool_call
from langgraph_batch.errors import MalformedToolCallError
from langgraph_batch.scheduler import BatchPolicy, RetryPolicy
from tests.fakes.backends import Reply, ScriptedBackend

FAST = BatchPolicy(retry=RetryPolicy(initial_interval=0.001, max_interval=0.001))


@tool
def lookup(key: str, limit: int = 3, mode: Literal["fast", "exact"] = "fast") -> str:
    """Look a key up."""
    return key


def make(script: Any, **kw: Any) -> tuple[BatchedChatModel, ScriptedBackend]:
    backend = ScriptedBackend(script, base_url=f"fake://{uuid.uuid4().hex}")
    llm = BatchedChatModel(model="m", backend=backend, policy=FAST, **kw)
    return llm, backend


def replies(*args: str, finish_reason: str = "tool_calls") -> Any:
    it = iter(args)

    def script(request: ChatRequest) -> Reply:
        return Reply(tool_calls=[("lookup", next(it))], finish_reason=finish_reason)

    return script


async def test_a_malformed_call_is_retried_and_the_good_answer_returned() -> None:
    llm, backend = make(replies("{not json", '{"key": "k1"}'), max_retries=2)
    msg = await llm.bind_tools([lookup]).ainvoke("q")
    assert msg.tool_calls[0]["args"] == {"key": "k1"}
    assert msg.invalid_tool_calls == []
    assert len(backend.requests) == 2
    stats = llm.get_scheduler().stats()
    assert (stats.malformed_tool_calls, stats.retries, stats.failed) == (1, 1, 0)
    await llm.get_scheduler().aclose()


async def test_every_attempt_malformed_raises_with_the_fields_a_user_needs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    llm, backend = make(replies('{"key": "k', '{"key": "k', '{"key": "k'), max_retries=2)
    with pytest.raises(MalformedToolCallError) as info:
        await llm.bind_tools([lookup]).ainvoke("q")
    err = info.value
    assert (err.tool_name, err.arguments, err.attempts) == ("lookup", '{"key": "k', 3)
    assert "not valid JSON" in err.reason
    assert err.tool_call_id == "call_0"
    assert err.request_id
    assert err.request_id.startswith("lgb-")
    assert err.is_retryable
    assert "max_retries" in str(err)
    assert "tool_choice" in str(err)
    assert len(backend.requests) == 3
    stats = llm.get_scheduler().stats()
    assert (stats.malformed_tool_calls, stats.retries, stats.failed) == (3, 2, 1)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert any(getattr(r, "error_type", None) == "MalformedToolCallError" for r in warnings)
    await llm.get_scheduler().aclose()


async def test_a_call_cut_by_max_tokens_says_so() -> None:
    llm, _ = make(replies('{"key": "k', finish_reason="length"), max_retries=0)
    with pytest.raises(MalformedToolCallError, match="cut off") as info:
        await llm.bind_tools([lookup]).ainvoke("q")
    assert info.value.finish_reason == "length"
    await llm.get_scheduler().aclose()


async def test_return_mode_keeps_chat_openai_behaviour() -> None:
    llm, backend = make(replies("{not json"), invalid_tool_calls="return")
    msg = await llm.bind_tools([lookup]).ainvoke("q")
    assert msg.tool_calls == []
    assert msg.invalid_tool_calls[0]["args"] == "{not json"
    assert len(backend.requests) == 1
    await llm.get_scheduler().aclose()


async def test_a_streamed_malformed_call_is_never_repaired() -> None:
    # LangChain's chunk aggregation parses partial JSON: '{"key": "k' would become
    # {"key": "k"}, a different, valid-looking call. The stream must fail instead.
    llm, _ = make(replies('{"key": "k', '{"key": "k'), max_retries=1, streaming=True)
    bound = llm.bind_tools([lookup])
    with pytest.raises(MalformedToolCallError):
        async for _ in bound.astream("q"):
            pass
    with pytest.raises(MalformedToolCallError):
        await bound.ainvoke("q")
    await llm.get_scheduler().aclose()


def _call(args: str, name: str = "lookup") -> ToolCall:
    return ToolCall(id="c1", name=name, arguments=args)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {
                    "key": {"type": "string"},
                    "limit": {"type": "integer"},
                    "ratio": {"anyOf": [{"type": "number"}, {"type": "null"}]},
                    "mode": {"enum": ["fast", "exact"]},
                    "tags": {"type": "array"},
                },
                "required": ["key"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "strict",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "boolean"}},
                "additionalProperties": False,
            },
        },
    },
]


@pytest.mark.parametrize(
    ("name", "args", "problem"),
    [
        ("lookup", '{"key": "k"}', None),
        ("lookup", '{"key": "k", "limit": 2, "ratio": null, "mode": "exact", "tags": []}', None),
        ("lookup", '{"key": "k", "limit": 2.0, "ratio": 0.5}', None),
        ("lookup", "", "miss the required property ['key']"),
        ("lookup", "{oops", "are not valid JSON"),
        ("lookup", "[1, 2]", "are a JSON list, not an object"),
        ("lookup", '"k"', "are a JSON str, not an object"),
        ("lookup", '{"limit": 2}', "miss the required property ['key']"),
        ("lookup", '{"key": 3}', "give 'key' a int where the tool wants string"),
        ("lookup", '{"key": "k", "limit": "2"}', "give 'limit' a str"),
        ("lookup", '{"key": "k", "limit": true}', "give 'limit' a bool"),
        ("lookup", '{"key": "k", "ratio": "x"}', "give 'ratio' a str"),
        ("lookup", '{"key": "k", "mode": "slow"}', "give 'mode' a str"),
        ("strict", '{"a": true}', None),
        ("strict", '{"a": true, "b": 1}', "have a property 'b' the tool does not take"),
        ("unbound", "{}", None),  # left to the tool node
        ("unbound", "{oops", "are not valid JSON"),
    ],
)
def test_schema_checks(name: str, args: str, problem: str | None) -> None:
    found = first_malformed_tool_call([_call(args, name)], TOOLS)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert found[1].startswith(problem)


# ------------------------------------------------------------------ forced tool_choice, no call


def text_replies(*contents: str, finish_reason: str = "length") -> Any:
    it = iter(contents)

    def script(request: ChatRequest) -> Reply:
        return Reply(content=next(it), finish_reason=finish_reason)

    return script


@pytest.mark.parametrize(("choice", "tool_name"), [("lookup", "lookup"), ("any", ""), (True, "")])
async def test_a_forced_choice_answered_without_a_call_is_malformed(
    choice: Any, tool_name: str
) -> None:
    # vLLM 0.32 returns the raw `<tool_call>...` text as content, with no tool
    # call, when its parser cannot read what the model wrote (here: cut off).
    cut = '<tool_call>{"name": "lookup", "arguments": 12345'
    llm, backend = make(text_replies(cut, cut), max_retries=1)
    with pytest.raises(MalformedToolCallError, match="no tool call") as info:
        await llm.bind_tools([lookup], tool_choice=choice).ainvoke("q")
    err = info.value
    assert (err.tool_name, err.attempts, err.finish_reason) == (tool_name, 2, "length")
    assert err.reason == "no tool call although tool_choice forced one"
    assert err.arguments == cut
    assert "cut off" in str(err)
    assert len(backend.requests) == 2
    await llm.get_scheduler().aclose()


async def test_a_forced_choice_retried_into_a_call_succeeds() -> None:
    answers = iter([Reply(content="<tool_call>{", finish_reason="length"), None])

    def script(request: ChatRequest) -> Reply:
        reply = next(answers)
        return reply or Reply(tool_calls=[("lookup", '{"key": "k"}')], finish_reason="stop")

    llm, _ = make(script, max_retries=1)
    msg = await llm.bind_tools([lookup], tool_choice="lookup").ainvoke("q")
    assert msg.tool_calls[0]["args"] == {"key": "k"}
    await llm.get_scheduler().aclose()


@pytest.mark.parametrize("choice", [None, "auto", "none"])
async def test_text_without_a_call_is_fine_when_no_call_was_forced(choice: Any) -> None:
    llm, _ = make(text_replies("just text", finish_reason="stop"))
    msg = await llm.bind_tools([lookup], tool_choice=choice).ainvoke("q")
    assert (msg.content, msg.tool_calls) == ("just text", [])
    await llm.get_scheduler().aclose()


async def test_a_forced_choice_without_a_call_is_returned_as_is_when_asked() -> None:
    llm, _ = make(text_replies("<tool_call>{"), invalid_tool_calls="return")
    msg = await llm.bind_tools([lookup], tool_choice="lookup").ainvoke("q")
    assert (msg.content, msg.tool_calls) == ("<tool_call>{", [])
    await llm.get_scheduler().aclose()
