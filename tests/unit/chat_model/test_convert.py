from __future__ import annotations

import json

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)

from langgraph_batch.backends.base import (
    ChatChunk,
    ChatResponse,
    ToolCall,
    ToolCallChunk,
    Usage,
)
from langgraph_batch.chat_model._convert import (
    chunk_to_message_chunk,
    final_chunk,
    message_to_openai,
    messages_to_openai,
    parse_tool_calls,
    response_to_message,
    usage_to_metadata,
)


def test_roles_and_plain_content() -> None:
    out = messages_to_openai(
        [
            SystemMessage("be brief"),
            SystemMessage("dev", additional_kwargs={"__openai_role__": "developer"}),
            HumanMessage("hi", name="alice"),
            AIMessage("hello"),
            ChatMessage(role="critic", content="meh"),
        ]
    )
    assert out == [
        {"role": "system", "content": "be brief"},
        {"role": "developer", "content": "dev"},
        {"role": "user", "content": "hi", "name": "alice"},
        {"role": "assistant", "content": "hello"},
        {"role": "critic", "content": "meh"},
    ]


def test_ai_tool_calls_replayed_with_null_content() -> None:
    msg = AIMessage(
        "",
        tool_calls=[{"name": "search", "args": {"q": "café"}, "id": "call_1"}],
        invalid_tool_calls=[
            {
                "name": "calc",
                "args": "{oops",
                "id": "call_2",
                "error": "bad",
                "type": "invalid_tool_call",
            }
        ],
    )
    out = message_to_openai(msg)
    assert out["role"] == "assistant"
    assert out["content"] is None
    assert out["tool_calls"] == [
        {
            "type": "function",
            "id": "call_1",
            "function": {"name": "search", "arguments": '{"q": "café"}'},
        },
        {"type": "function", "id": "call_2", "function": {"name": "calc", "arguments": "{oops"}},
    ]


def test_tool_message_keeps_only_wire_fields() -> None:
    out = message_to_openai(ToolMessage("42", tool_call_id="call_1", name="calc", status="error"))
    assert out == {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    listed = message_to_openai(
        ToolMessage([{"type": "text", "text": "42", "id": "x"}], tool_call_id="c")
    )
    assert listed["content"] == [{"type": "text", "text": "42"}]


def test_list_content_blocks() -> None:
    msg = HumanMessage(
        content=[
            {"type": "text", "text": "what is this?"},
            {"type": "image", "base64": "AAAA", "mime_type": "image/png"},
            {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}},
            {"type": "thinking", "thinking": "hidden"},
        ]
    )
    out = message_to_openai(msg)
    assert out["content"][0] == {"type": "text", "text": "what is this?"}
    assert out["content"][1]["type"] == "image_url"
    assert out["content"][1]["image_url"]["url"].startswith("data:image/png;base64,AAAA")
    assert out["content"][2] == {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    assert len(out["content"]) == 3


def test_unknown_message_type_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="RemoveMessage"):
        message_to_openai(RemoveMessage(id="1"))


def test_parse_tool_calls_splits_valid_and_invalid() -> None:
    valid, invalid = parse_tool_calls(
        [
            ToolCall(id="a", name="f", arguments='{"x": 1}'),
            ToolCall(id="b", name="g", arguments=""),
            ToolCall(id="c", name="h", arguments="{not json"),
            ToolCall(id="d", name="k", arguments="[1, 2]"),
        ]
    )
    assert [(c["id"], c["args"]) for c in valid] == [("a", {"x": 1}), ("b", {})]
    assert [c["id"] for c in invalid] == ["c", "d"]
    assert invalid[0]["args"] == "{not json"
    assert "not valid JSON" in (invalid[0]["error"] or "")
    assert "JSON object" in (invalid[1]["error"] or "")


def test_response_to_message_metadata_and_usage() -> None:
    resp = ChatResponse(
        id="chatcmpl-1",
        model="m",
        content="hello",
        tool_calls=(ToolCall(id="c1", name="f", arguments="nope"),),
        finish_reason="stop",
        usage=Usage(prompt_tokens=10, completion_tokens=3, cached_tokens=8),
        request_id="lgb-x",
    )
    msg = response_to_message(resp)
    assert msg.content == "hello"
    assert msg.tool_calls == []
    assert msg.invalid_tool_calls[0]["name"] == "f"
    assert msg.usage_metadata == {
        "input_tokens": 10,
        "output_tokens": 3,
        "total_tokens": 13,
        "input_token_details": {"cache_read": 8},
    }
    assert msg.response_metadata == {
        "model_name": "m",
        "finish_reason": "stop",
        "request_id": "lgb-x",
        "id": "chatcmpl-1",
    }


def test_usage_without_cache_report_has_no_details() -> None:
    assert "input_token_details" not in usage_to_metadata(Usage(prompt_tokens=1))


def test_stream_chunks_aggregate_into_tool_calls() -> None:
    parts = [
        ChatChunk(content="Let me look. "),
        ChatChunk(
            tool_call_chunks=(ToolCallChunk(index=0, id="c1", name="search", arguments='{"q":'),)
        ),
        ChatChunk(tool_call_chunks=(ToolCallChunk(index=0, arguments=' "x"}'),)),
        # LangChain parses streamed arguments leniently (partial JSON); text that is
        # not JSON at all still becomes an invalid tool call.
        ChatChunk(
            tool_call_chunks=(ToolCallChunk(index=1, id="c2", name="bad", arguments="not json"),)
        ),
    ]
    chunks = [chunk_to_message_chunk(p) for p in parts]
    resp = ChatResponse(
        id="r",
        model="m",
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=5, completion_tokens=7),
    )
    last = final_chunk(resp)
    assert last.chunk_position == "last"
    full = chunks[0]
    for c in [*chunks[1:], last]:
        full = full + c
    assert isinstance(full, AIMessageChunk)
    assert full.content == "Let me look. "
    assert full.tool_calls == [
        {"name": "search", "args": {"q": "x"}, "id": "c1", "type": "tool_call"}
    ]
    assert [c["name"] for c in full.invalid_tool_calls] == ["bad"]
    assert full.usage_metadata is not None
    assert full.usage_metadata["total_tokens"] == 12
    assert full.response_metadata["finish_reason"] == "tool_calls"
    assert json.loads(message_to_openai(full)["tool_calls"][0]["function"]["arguments"]) == {
        "q": "x"
    }
