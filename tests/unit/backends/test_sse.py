"""SSE decoding and chunk aggregation (langgraph_batch.backends._sse)."""

from __future__ import annotations

from langgraph_batch.backends._sse import ChatStreamAccumulator, SSEDecoder, tool_calls_from_wire
from tests.fakes.http import chunk


def test_decoder_splits_events_across_reads() -> None:
    d = SSEDecoder()
    assert d.feed(b'data: {"a"') == []
    assert d.feed(b":1}\n") == []
    assert d.feed(b"\n") == [b'{"a":1}']
    assert d.feed(b"data: [DONE]\n\n") == [b"[DONE]"]


def test_decoder_crlf_split_between_reads() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: x\r") == []
    # the \n completing \r\n must not be read as an empty line (event end) twice
    assert d.feed(b"\n\r\n") == [b"x"]


def test_decoder_ignores_comments_and_other_fields() -> None:
    d = SSEDecoder()
    events = d.feed(b': keep-alive\n\nevent: message\nid: 3\nretry: 10\ndata:{"x":1}\n\n')
    assert events == [b'{"x":1}']


def test_decoder_multiline_data_and_flush() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: a\ndata: b\n\n") == [b"a\nb"]
    assert d.feed(b"data: tail") == []
    assert d.flush() == [b"tail"]
    assert d.flush() == []


def test_tool_call_deltas_aggregate_by_index() -> None:
    acc = ChatStreamAccumulator()
    acc.add(chunk(content=""))
    acc.add(
        chunk(
            tool_calls=[
                {"index": 0, "id": "call_a", "function": {"name": "search", "arguments": ""}},
            ]
        )
    )
    acc.add(
        chunk(
            tool_calls=[
                {"index": 1, "id": "call_b", "function": {"name": "fetch", "arguments": '{"u'}},
                {"index": 0, "function": {"arguments": '{"q": '}},
            ]
        )
    )
    acc.add(chunk(tool_calls=[{"index": 0, "function": {"arguments": '"cats"}'}}]))
    last = acc.add(
        chunk(
            tool_calls=[{"index": 1, "function": {"arguments": '":1}'}}], finish_reason="tool_calls"
        )
    )
    assert last.finish_reason == "tool_calls"
    assert last.tool_call_chunks[0].index == 1
    resp = acc.response(request_id="r", fallback_model="m")
    assert [(t.id, t.name, t.arguments) for t in resp.tool_calls] == [
        ("call_a", "search", '{"q": "cats"}'),
        ("call_b", "fetch", '{"u":1}'),
    ]
    assert resp.content is None
    assert resp.finish_reason == "tool_calls"
    assert acc.chunks == 5


def test_malformed_tool_arguments_are_kept_raw() -> None:
    calls = tool_calls_from_wire(
        [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]
    )
    assert calls[0].arguments == "{not json"


def test_object_arguments_become_json_text() -> None:
    calls = tool_calls_from_wire([{"function": {"name": "f", "arguments": {"a": 1}}}])
    assert (calls[0].id, calls[0].arguments) == ("call_0", '{"a": 1}')


def test_usage_with_cached_tokens() -> None:
    acc = ChatStreamAccumulator()
    acc.add(chunk(content="hi", finish_reason="stop"))
    last = acc.add(
        chunk(
            usage={
                "prompt_tokens": 100,
                "completion_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 96},
            }
        )
    )
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.cached_tokens, last.usage.total_tokens) == (
        100,
        96,
        105,
    )
    resp = acc.response(request_id="r", fallback_model="m")
    assert resp.content == "hi"
    assert resp.usage == last.usage
