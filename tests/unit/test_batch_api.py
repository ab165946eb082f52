"""ProviderBatch against fake SDK clients: item mapping, order, errors, deadline, cancel.

Shapes from https://platform.openai.com/docs/guides/batch (output/error file lines,
`batch_expired`, `batch_cancelled`) and
https://docs.claude.com/en/docs/build-with-claude/batch-processing (result types).
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.messages import AIMessage

from langgraph_batch.batch_api import ProviderBatch
from langgraph_batch.batch_api._anthropic import to_message as anthropic_message
from langgraph_batch.batch_api._openai import to_message as openai_message
from langgraph_batch.errors import BatchItemExpiredError, BatchItemFailedError


def _completion(text: str, *, cached: int = 0) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "m",
        "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


class FakeOpenAI:
    """Files and batches in memory; `lines(custom_ids)` decides each item's output line."""

    def __init__(self, lines: Any, *, status: str = "completed", polls: int = 1) -> None:
        self.lines, self.status, self.polls = lines, status, polls
        self.uploaded = ""
        self.cancelled = False
        self.polled = asyncio.Event()
        self.files = SimpleNamespace(create=self._upload, content=self._content)
        self.batches = SimpleNamespace(
            create=self._create, retrieve=self._retrieve, cancel=self._cancel
        )
        self.contents: dict[str, str] = {}

    async def _upload(self, *, file: Any, purpose: str) -> Any:
        assert purpose == "batch"
        self.uploaded = file[1].decode()
        return SimpleNamespace(id="file-in")

    async def _create(self, **kw: Any) -> Any:
        assert kw["endpoint"] == "/v1/chat/completions"
        ids = [json.loads(x)["custom_id"] for x in self.uploaded.splitlines()]
        out, err = self.lines(ids)
        self.contents = {
            "out": "\n".join(map(json.dumps, out)),
            "err": "\n".join(map(json.dumps, err)),
        }
        return SimpleNamespace(id="batch_1")

    async def _retrieve(self, batch_id: str) -> Any:
        self.polled.set()
        self.polls -= 1
        status = self.status if self.polls <= 0 or self.cancelled else "in_progress"
        if self.cancelled:
            status = "cancelled"
        return SimpleNamespace(
            status=status,
            errors=None,
            output_file_id="out" if self.contents.get("out") else None,
            error_file_id="err" if self.contents.get("err") else None,
        )

    async def _cancel(self, batch_id: str) -> Any:
        self.cancelled = True

    async def _content(self, file_id: str) -> Any:
        return SimpleNamespace(text=self.contents[file_id])


async def _events(executor: ProviderBatch, inputs: list[Any]) -> list[Any]:
    pairs = list(enumerate(inputs))
    return [e async for e in executor.run(None, pairs, total=len(inputs), config={})]


def _ok(cid: str) -> dict[str, Any]:
    body = _completion(f"answer {cid}", cached=4)
    return {"custom_id": cid, "response": {"status_code": 200, "body": body}, "error": None}


async def test_openai_items_come_back_in_input_order_with_typed_errors() -> None:
    def lines(ids: list[str]) -> tuple[list[Any], list[Any]]:
        out = [_ok(c) for c in reversed(ids) if c in ("s0", "s3")]  # any order
        err = [
            {"custom_id": "s1", "response": None,
             "error": {"code": "batch_expired", "message": "window"}},
            {"custom_id": "s2", "response": {"status_code": 400, "body": {"error": {
                "message": "bad", "type": "invalid_request_error"}}}, "error": None},
        ]  # fmt: skip
        return out, err

    client = FakeOpenAI(lines, polls=2)
    executor = ProviderBatch(provider="openai", model="m", client=client, poll_interval=0.001)
    events = await _events(executor, ["a", [("user", "b")], {"messages": ["c"]}, "d"])
    assert [e.kind for e in events[:4]] == ["started"] * 4
    done = {e.index: e for e in events[4:]}
    assert [done[i].kind for i in range(4)] == ["finished", "failed", "failed", "finished"]
    assert done[0].value.content == "answer s0"
    assert done[0].value.usage_metadata["input_token_details"] == {"cache_read": 4}
    assert done[1].value["error_type"] == "BatchItemExpiredError"
    assert done[1].value["retryable"] is True
    assert done[2].value["error_type"] == "BatchItemFailedError"
    assert done[2].value["retryable"] is False
    first = json.loads(client.uploaded.splitlines()[0])
    assert first["body"]["messages"] == [{"role": "user", "content": "a"}]


async def test_a_mapping_input_gets_the_answer_appended_to_its_messages() -> None:
    client = FakeOpenAI(lambda ids: ([_ok(c) for c in ids], []))
    executor = ProviderBatch(provider="openai", model="m", client=client, poll_interval=0.001)
    (_, finished) = await _events(executor, [{"messages": [("user", "x")], "k": 1}])
    assert finished.value["k"] == 1
    assert [m.type for m in finished.value["messages"]] == ["human", "ai"]


async def test_an_input_that_is_not_messages_fails_alone() -> None:
    client = FakeOpenAI(lambda ids: ([_ok(c) for c in ids], []))
    executor = ProviderBatch(provider="openai", model="m", client=client, poll_interval=0.001)
    events = await _events(executor, [42, "fine"])
    assert events[0].kind == "failed"
    assert events[-1].kind == "finished"


async def test_the_deadline_cancels_and_expires_what_did_not_run() -> None:
    def lines(ids: list[str]) -> tuple[list[Any], list[Any]]:
        cut = {"code": "batch_cancelled", "message": "cancelled"}
        return [_ok("s0")], [{"custom_id": "s1", "response": None, "error": cut}]

    client = FakeOpenAI(lines, polls=10**9)
    executor = ProviderBatch(
        provider="openai", model="m", client=client, poll_interval=0.001, deadline=0.01
    )
    events = await _events(executor, ["a", "b"])
    assert client.cancelled
    assert [e.kind for e in events[2:]] == ["finished", "failed"]
    assert events[-1].value["error_type"] == "BatchItemExpiredError"
    assert "its deadline" in events[-1].value["message"]


async def test_cancelling_the_run_cancels_the_batch() -> None:
    client = FakeOpenAI(lambda ids: ([], []), polls=10**9)
    executor = ProviderBatch(provider="openai", model="m", client=client, poll_interval=0.001)
    task = asyncio.ensure_future(_events(executor, ["a"]))
    await client.polled.wait()  # submitted and waiting on the batch
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.cancelled


def test_openai_and_anthropic_answers_become_ai_messages_with_usage() -> None:
    msg = openai_message(_completion("hi", cached=3), batch_id="b", custom_id="s0")
    assert isinstance(msg, AIMessage)
    assert msg.usage_metadata == {
        "input_tokens": 10,
        "output_tokens": 2,
        "total_tokens": 12,
        "input_token_details": {"cache_read": 3},
    }
    assert msg.response_metadata["batch_id"] == "b"
    answer = {
        "id": "msg_1",
        "model": "claude-x",
        "content": [{"type": "text", "text": "hello"}],
        "stop_reason": "end_turn",
        "usage": {
            "input_tokens": 5,
            "output_tokens": 7,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 20,
            "cache_creation": {"ephemeral_5m_input_tokens": 15, "ephemeral_1h_input_tokens": 5},
        },
    }
    msg = anthropic_message(answer, batch_id="b", custom_id="s1")
    assert msg.content == "hello"
    assert msg.usage_metadata is not None
    assert msg.usage_metadata["input_tokens"] == 125  # LangChain's total: cache included
    assert msg.usage_metadata["input_token_details"] == {
        "cache_read": 100,
        "cache_creation": 20,
        "ephemeral_5m_input_tokens": 15,
        "ephemeral_1h_input_tokens": 5,
    }


async def test_anthropic_results_map_to_typed_errors() -> None:
    results = [
        {"custom_id": "s1", "result": {"type": "expired"}},
        {"custom_id": "s0", "result": {"type": "errored", "error": {"type": "error", "error": {
            "type": "overloaded_error", "message": "busy"}}}},
        {"custom_id": "s2", "result": {"type": "canceled"}},
    ]  # fmt: skip

    class Results:
        def __aiter__(self) -> Any:
            async def gen() -> Any:
                for r in results:
                    yield SimpleNamespace(model_dump=lambda r=r: r)

            return gen()

    async def create(*, requests: list[Any]) -> Any:
        assert requests[0]["params"]["system"] == "sys"
        assert requests[0]["params"]["max_tokens"] == 1024
        return SimpleNamespace(id="msgbatch_1")

    async def retrieve(batch_id: str) -> Any:
        return SimpleNamespace(processing_status="ended")

    async def results_of(batch_id: str) -> Any:
        return Results()

    client = SimpleNamespace(
        messages=SimpleNamespace(
            batches=SimpleNamespace(create=create, retrieve=retrieve, results=results_of)
        )
    )
    executor = ProviderBatch(provider="anthropic", model="c", client=client, poll_interval=0.001)
    events = await _events(executor, [[("system", "sys"), ("user", "a")], "b", "c"])
    failed = {e.index: e.value["error_type"] for e in events if e.kind == "failed"}
    assert failed == {
        0: "BatchItemFailedError",
        1: "BatchItemExpiredError",
        2: "BatchItemCanceledError",
    }
    retryable = {e.index: e.value["retryable"] for e in events if e.kind == "failed"}
    assert retryable == {0: True, 1: True, 2: True}


def test_item_errors_carry_their_batch_and_item() -> None:
    err = BatchItemFailedError("x", batch_id="b", custom_id="s3", status=503)
    assert (err.batch_id, err.custom_id, err.is_retryable) == ("b", "s3", True)
    assert BatchItemExpiredError("x", batch_id="b", custom_id="s1").is_retryable
