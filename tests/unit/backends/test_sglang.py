"""SGLangBackend: rid, priority sign, /generate batching, metrics."""

from __future__ import annotations

import json

import httpx
import pytest

from langgraph_batch.backends import ChatRequest, SGLangBackend
from langgraph_batch.backends.sglang import sampling_params_for_generate
from langgraph_batch.errors import ContextLengthExceededError
from tests.fakes.http import Recorder, completion
from tests.unit.backends.test_prometheus import SGLANG_METRICS


def make(recorder: Recorder, **kw: object) -> SGLangBackend:
    return SGLangBackend("http://srv:30000/v1", transport=recorder.transport, **kw)  # type: ignore[arg-type]


def req(**kw: object) -> ChatRequest:
    kw.setdefault("model", "m")
    kw.setdefault("messages", [{"role": "user", "content": "hi"}])
    return ChatRequest(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("low_first", "ours", "wire"),
    [(False, 3, -3), (False, -2, 2), (True, 3, 3)],
)
async def test_priority_sign_and_rid(
    recorder: Recorder, low_first: bool, ours: int, wire: int
) -> None:
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    async with make(recorder, priority_scheduling=True, low_priority_values_first=low_first) as b:
        assert b.capabilities.flavor == "sglang"
        await b.chat(req(priority=ours, request_id="rid-1"))
    assert recorder.last_body["priority"] == wire
    assert recorder.last_body["rid"] == "rid-1"
    assert "request_id" not in recorder.last_body


async def test_priority_not_sent_by_default(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    async with make(recorder) as b:
        await b.chat(req(priority=4))
    assert "priority" not in recorder.last_body


def test_sampling_params_translation() -> None:
    schema = {"type": "object"}
    assert sampling_params_for_generate(
        {
            "prompt": "x",
            "max_tokens": 5,
            "temperature": 0.2,
            "stop": ["\n"],
            "seed": 1,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
        }
    ) == {
        "max_new_tokens": 5,
        "temperature": 0.2,
        "stop": ["\n"],
        "sampling_seed": 1,
        "json_schema": json.dumps(schema),
    }
    assert sampling_params_for_generate({"prompt": "x", "logprobs": True}) is None


async def test_complete_batch_generate(recorder: Recorder) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/generate":
            return httpx.Response(
                200,
                json=[
                    {
                        "text": t.upper(),
                        "meta_info": {
                            "id": rid,
                            "prompt_tokens": 3,
                            "completion_tokens": 1,
                            "cached_tokens": 2,
                            "finish_reason": {"type": "length", "length": 1},
                        },
                    }
                    for t, rid in zip(body["text"], body["rid"], strict=True)
                ],
            )
        return httpx.Response(200, json=completion("chat"))

    recorder.handler = handler
    requests = [
        req(messages=(), params={"prompt": "a", "max_tokens": 1}, request_id="r0", batchable=True),
        req(request_id="r1", batchable=True),
        req(messages=(), params={"prompt": "b", "max_tokens": 2}, request_id="r2", batchable=True),
    ]
    async with make(recorder, priority_scheduling=True) as b:
        out = await b.complete_batch(requests)
    assert [r.content for r in out] == ["A", "chat", "B"]
    assert out[0].usage is not None
    assert out[0].usage.cached_tokens == 2
    assert out[2].finish_reason == "length"
    gen = next(r for r in recorder.requests if r.url.path == "/generate")
    body = json.loads(gen.content)
    assert body["text"] == ["a", "b"]
    assert body["sampling_params"] == [{"max_new_tokens": 1}, {"max_new_tokens": 2}]
    assert body["rid"] == ["r0", "r2"]
    assert body["priority"] == 0
    assert len(recorder.requests) == 2


async def test_a_bad_prompt_in_a_generate_batch_fails_only_its_caller(recorder: Recorder) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        texts = body.get("text") or [body.get("prompt")]
        if "huge" in texts:
            msg = (
                "The input (40000 tokens) is longer than the model's context length (32768 tokens)."
            )
            return httpx.Response(400, json={"object": "error", "message": msg, "code": 400})
        if request.url.path == "/generate":
            return httpx.Response(200, json=[{"text": t.upper(), "meta_info": {}} for t in texts])
        return httpx.Response(
            200,
            json={
                "id": "cmpl-1",
                "model": "m",
                "choices": [{"index": 0, "text": body["prompt"].upper(), "finish_reason": "stop"}],
            },
        )

    recorder.handler = handler
    requests = [
        req(messages=(), params={"prompt": p, "max_tokens": 1}, request_id=p, batchable=True)
        for p in ("a", "huge", "b")
    ]
    async with make(recorder) as b:
        out = await b.complete_batch_settled(requests)
    assert [getattr(o, "content", None) for o in out] == ["A", None, "B"]
    assert isinstance(out[1], ContextLengthExceededError)
    paths = [r.url.path for r in recorder.requests]
    assert paths == ["/generate"] + ["/v1/completions"] * 3


async def test_metrics(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(200, text=SGLANG_METRICS)
    async with make(recorder) as b:
        m = await b.metrics()
    assert m is not None
    assert (m.num_requests_running, m.kv_capacity_tokens, m.cache_hit_rate) == (17.0, 412000, 0.83)
