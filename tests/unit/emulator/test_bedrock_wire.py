"""The Bedrock Converse flavour's wire rules: checkpoints as breakpoints, event-stream framing.

Cited: https://docs.aws.amazon.com/bedrock/latest/userguide/prompt-caching.html
(a `cachePoint` caches everything before it) and the Converse API reference.
"""

from __future__ import annotations

import json

import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer

from langgraph_batch.emulator._anthropic_api import parse
from langgraph_batch.emulator._bedrock_api import encode_event, to_messages_body
from langgraph_batch.emulator._http import RequestError

POINT = {"cachePoint": {"type": "default"}}
MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"


def test_a_checkpoint_marks_the_block_before_it_in_each_section() -> None:
    body = {
        "system": [{"text": "policy"}, POINT],
        "toolConfig": {
            "tools": [
                {"toolSpec": {"name": "t", "inputSchema": {"json": {"type": "object"}}}},
                POINT,
            ],
            "toolChoice": {"any": {}},
        },
        "messages": [
            {"role": "user", "content": [{"text": "q"}]},
            {
                "role": "assistant",
                "content": [{"toolUse": {"toolUseId": "u1", "name": "t", "input": {"a": 1}}}],
            },
            {
                "role": "user",
                "content": [
                    {"toolResult": {"toolUseId": "u1", "content": [{"json": {"v": 2}}]}},
                    {"cachePoint": {"type": "default", "ttl": "1h"}},
                ],
            },
        ],
        "inferenceConfig": {"maxTokens": 77},
    }
    out = to_messages_body(MODEL, body)
    assert out["max_tokens"] == 77
    assert out["system"] == [
        {"type": "text", "text": "policy", "cache_control": {"type": "ephemeral"}}
    ]
    assert out["tools"][0]["cache_control"] == {"type": "ephemeral"}
    assert out["tools"][0]["input_schema"] == {"type": "object"}
    assert out["tool_choice"] == {"type": "any"}
    result = out["messages"][2]["content"][0]
    assert result == {
        "type": "tool_result",
        "tool_use_id": "u1",
        "content": '{"v": 2}',
        "cache_control": {"type": "ephemeral", "ttl": "1h"},
    }
    parsed = parse(out)
    # Three breakpoints, in the cache's order: tools, system, the last message.
    ttls = [b.ttl for b in parsed.blocks if b.ttl is not None]
    assert ttls == ["5m", "5m", "1h"]
    assert parsed.openai_messages[-1]["role"] == "tool"


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"messages": []}, "non-empty"),
        ({"system": [POINT], "messages": [{"role": "user", "content": [{"text": "q"}]}]}, "follow"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"text": "q"}, {"cachePoint": {"type": "x"}}]}
                ]
            },
            "default",
        ),
        ({"messages": [{"role": "user", "content": [{"image": {}}]}]}, "not emulated"),
    ],
)
def test_malformed_requests_are_validation_errors(body: dict[str, object], match: str) -> None:
    with pytest.raises(RequestError, match=match):
        to_messages_body(MODEL, body)


def test_events_decode_with_botocores_parser_and_crcs() -> None:
    buffer = EventStreamBuffer()
    buffer.add_data(encode_event("messageStart", {"role": "assistant"}))
    buffer.add_data(encode_event("messageStop", {"stopReason": "end_turn"}))
    messages = list(buffer)
    assert [m.headers[":event-type"] for m in messages] == ["messageStart", "messageStop"]
    assert all(m.headers[":message-type"] == "event" for m in messages)
    assert json.loads(messages[1].payload) == {"stopReason": "end_turn"}
    corrupt = bytearray(encode_event("messageStart", {"role": "assistant"}))
    corrupt[-6] ^= 0xFF  # a payload byte: the message CRC no longer matches
    bad = EventStreamBuffer()
    bad.add_data(bytes(corrupt))
    with pytest.raises(ChecksumMismatch):
        list(bad)
