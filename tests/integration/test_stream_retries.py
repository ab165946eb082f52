"""Streaming retries what it safely can (issue 10, item 5), against the emulator.

A fault-injecting proxy (`tests/faultproxy.py`) in front of the emulator
produces what the emulator cannot: a reset before any response byte, a
stream cut after its role-only first event, a stream that sends only
keep-alive comments, an HTML 502 page. Before, a stream that failed after
its first (empty) event was never retried.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.errors import (
    BackendServerError,
    BackendStreamError,
    StreamChunkTimeoutError,
)
from langgraph_batch.scheduler import BatchPolicy, RetryPolicy
from tests.faultproxy import FaultProxy, Seen

MODEL = "emulated-llama-3-8b"
FAST = BatchPolicy(retry=RetryPolicy(initial_interval=0.001, max_interval=0.001))


class Script:
    """Faults per prompt, one per attempt: `{"hello": ["reset", None]}`."""

    def __init__(self, plan: dict[str, list[str | None]]) -> None:
        self.plan = plan
        self.attempts: dict[str, int] = defaultdict(int)

    def __call__(self, seen: Seen) -> str | None:
        if not seen.path.startswith("/v1/chat/completions"):
            return None
        prompt = json.loads(seen.body)["messages"][-1]["content"]
        n = self.attempts[prompt]
        self.attempts[prompt] += 1
        faults = self.plan.get(prompt, [])
        return faults[n] if n < len(faults) else None


@pytest.fixture
def proxied(emulator_url: str) -> Iterator[Any]:
    async def start(plan: dict[str, list[str | None]], **kw: Any) -> Any:
        proxy = FaultProxy(emulator_url, decide=Script(plan))
        await proxy.__aenter__()
        started.append(proxy)
        llm = BatchedChatModel(
            model=MODEL,
            base_url=proxy.url,
            extra_body={"emulator": {"output_tokens": 12}},
            policy=FAST,
            **kw,
        )
        return proxy, llm

    started: list[FaultProxy] = []
    yield start
    for proxy in started:  # closed with the test's loop; nothing to await here
        assert proxy.seen


async def _stream(llm: BatchedChatModel, prompt: str) -> tuple[str, Any]:
    text = ""
    last: Any = None
    async for chunk in llm.astream(prompt):
        text += chunk.text
        last = chunk
    return text, last


async def test_a_stream_cut_before_its_first_content_is_retried(
    proxied: Any, emulator_url: str
) -> None:
    proxy, llm = await proxied({"cut me": ["cut_before_content", "reset", None]}, max_retries=2)
    clean = await BatchedChatModel(
        model=MODEL, base_url=emulator_url, extra_body={"emulator": {"output_tokens": 12}}
    ).ainvoke("cut me")
    text, last = await _stream(llm, "cut me")
    assert text == clean.text  # no duplicate, no lost content
    assert last.chunk_position == "last"
    assert proxy.faults == {"cut_before_content": 1, "reset": 1}
    assert llm.get_scheduler().stats().retries == 2


async def test_a_reset_before_any_response_byte_is_retried(proxied: Any) -> None:
    proxy, llm = await proxied({"plain": ["reset", "reset", None]}, max_retries=2)
    msg = await llm.ainvoke("plain")
    assert msg.text
    assert proxy.faults == {"reset": 2}


async def test_after_content_a_broken_stream_fails_typed_and_is_not_replayed(
    emulator_url: str,
) -> None:
    llm = BatchedChatModel(
        model=MODEL,
        base_url=emulator_url,
        extra_body={"emulator": {"output_tokens": 40, "fault": "drop"}},
        policy=FAST,
        max_retries=3,
    )
    seen: list[str] = []

    async def consume() -> None:
        async for chunk in llm.astream("long"):
            seen.append(chunk.text)

    with pytest.raises(BackendStreamError) as info:
        await consume()
    assert "".join(seen)  # content had reached the caller ...
    assert info.value.chunks_received > 0
    assert info.value.is_retryable  # ... so the caller may retry; the scheduler did not
    stats = llm.get_scheduler().stats()
    assert (stats.retries, stats.failed) == (0, 1)


async def test_stream_chunk_timeout_fires_between_events_and_is_retried(proxied: Any) -> None:
    proxy, llm = await proxied(
        {"stall": ["stall_after_headers", "stall_after_headers", None]},
        max_retries=2,
        stream_chunk_timeout=0.3,  # keep-alive comments every 50 ms do not reset it
    )
    text, last = await _stream(llm, "stall")
    assert text
    assert last.chunk_position == "last"
    assert proxy.faults == {"stall_after_headers": 2}
    _, llm0 = await proxied(
        {"stall": ["stall_after_headers"] * 3}, max_retries=0, stream_chunk_timeout=0.3
    )
    with pytest.raises(StreamChunkTimeoutError) as info:
        await _stream(llm0, "stall")
    err = info.value
    assert (err.timeout_s, err.model_name, err.chunks_received) == (0.3, MODEL, 0)
    assert err.is_retryable


async def test_an_html_error_page_is_one_line(proxied: Any) -> None:
    _, llm = await proxied({"html": ["html502"]}, max_retries=0)
    with pytest.raises(BackendServerError) as info:
        await llm.ainvoke("html")
    message = str(info.value)
    assert "HTML page: 502 Bad Gateway" in message
    assert "<" not in message
    assert len(message) < 400
