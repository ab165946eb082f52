"""VLLMBackend: vLLM extras on the wire, metrics, batching and the batch-endpoint fallback."""

from __future__ import annotations

import json

import httpx
import pytest

from langgraph_batch.backends import ChatRequest, VLLMBackend
from langgraph_batch.backends.base import Usage
from langgraph_batch.backends.vllm import parse_vllm_metrics
from langgraph_batch.errors import (
    BackendServerError,
    ContextLengthExceededError,
    ModelNotFoundError,
)
from tests.fakes.http import Recorder, completion, error_body
from tests.unit.backends.test_prometheus import VLLM_METRICS

MESSAGES = [{"role": "user", "content": "hi"}]


def make(recorder: Recorder, **kw: object) -> VLLMBackend:
    return VLLMBackend("http://srv:8000", transport=recorder.transport, **kw)  # type: ignore[arg-type]


def req(**kw: object) -> ChatRequest:
    kw.setdefault("model", "m")
    kw.setdefault("messages", MESSAGES)
    return ChatRequest(**kw)  # type: ignore[arg-type]


async def test_request_id_on_the_wire_priority_off_by_default(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    async with make(recorder) as b:
        assert b.capabilities.flavor == "vllm"
        assert b.capabilities.priority is False
        await b.chat(req(request_id="lgb-s3-t1-ab", priority=5))
    sent = recorder.requests[0]
    assert sent.headers["x-request-id"] == "lgb-s3-t1-ab"
    assert recorder.last_body["request_id"] == "lgb-s3-t1-ab"
    assert "priority" not in recorder.last_body  # ignored under fcfs: not sent


async def test_priority_sent_when_configured(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    async with make(recorder, priority_scheduling=True) as b:
        assert b.capabilities.priority is True
        await b.chat(req(priority=-3))
        await b.chat(req(priority=7, stream=False))
    assert [r["priority"] for r in (recorder.last_body,)] == [7]
    import json

    assert json.loads(recorder.requests[0].content)["priority"] == -3  # lower = sooner, as is


async def test_no_request_id_no_header(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    async with make(recorder) as b:
        await b.chat(req())
    assert "x-request-id" not in recorder.requests[0].headers
    assert "request_id" not in recorder.last_body


async def test_response_format_passes_through_and_guided_json_is_translated(
    recorder: Recorder,
) -> None:
    recorder.handler = lambda r: httpx.Response(200, json=completion('{"a": 1}'))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    rf = {"type": "json_schema", "json_schema": {"name": "A", "schema": schema}}
    async with make(recorder) as b:
        await b.chat(req(params={"response_format": rf}))
        assert recorder.last_body["response_format"] == rf
        await b.chat(req(params={"guided_json": schema, "guided_regex": "a+"}))
    body = recorder.last_body
    assert "guided_json" not in body
    assert "guided_regex" not in body
    assert body["response_format"]["json_schema"]["schema"] == schema
    assert body["structured_outputs"] == {"regex": "a+"}


async def test_metrics(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(200, text=VLLM_METRICS)
    async with make(recorder) as b:
        m = await b.metrics()
    assert str(recorder.requests[0].url) == "http://srv:8000/metrics"
    assert m is not None
    assert m.kv_capacity_tokens == 880000
    assert m.num_requests_running == 20.0


async def test_metrics_unavailable(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(500, text="boom")
    async with make(recorder) as b:
        with pytest.raises(BackendServerError):
            await b.metrics()


def _batch_handler(
    recorder: Recorder, *, batch_status: int | None = None, max_model_len: int = 4096
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        import json

        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": max_model_len}]})
        body = json.loads(request.content)
        texts = [c[-1]["content"] for c in body.get("messages", []) if isinstance(c, list)]
        if "huge" in texts or "huge" in str(body.get("messages", "")):
            msg = "Input length (40000) exceeds model's maximum context length (32768)."
            return httpx.Response(400, json=error_body(msg))
        if path == "/v1/chat/completions/batch":
            if batch_status is not None:
                return httpx.Response(batch_status, json={"detail": "Not Found"})
            choices = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": f"answer to {conv[-1]['content']}"},
                    "finish_reason": "stop",
                }
                for i, conv in reversed(list(enumerate(body["messages"])))
            ]
            return httpx.Response(
                200,
                json={
                    "id": f"chatcmpl-{body.get('request_id', 'x')}",
                    "model": "m",
                    "choices": choices,
                    "usage": {"prompt_tokens": 9, "completion_tokens": 9},
                },
            )
        if path == "/v1/completions":
            prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
            return httpx.Response(
                200,
                json={
                    "id": "cmpl-1",
                    "model": "m",
                    "choices": [
                        {"index": i, "text": p.upper(), "finish_reason": "length"}
                        for i, p in enumerate(prompts)
                    ],
                    "usage": {"prompt_tokens": 2, "completion_tokens": 2},
                },
            )
        if path == "/v1/chat/completions":
            return httpx.Response(200, json=completion(f"single {body['messages'][-1]['content']}"))
        return httpx.Response(404, json={"detail": "Not Found"})

    recorder.handler = handler


def conv(text: str, **kw: object) -> ChatRequest:
    return req(messages=[{"role": "user", "content": text}], batchable=True, **kw)


async def test_complete_batch_chat_endpoint(recorder: Recorder) -> None:
    _batch_handler(recorder)
    params = {"max_tokens": 8, "temperature": 0.0}
    requests = [conv(t, params=params, request_id=f"r{i}") for i, t in enumerate("abc")]
    async with make(recorder) as b:
        assert b.capabilities.batch_completions
        out = await b.complete_batch(requests)
    assert [r.content for r in out] == ["answer to a", "answer to b", "answer to c"]
    assert [r.request_id for r in out] == ["r0", "r1", "r2"]
    assert [r.id for r in out] == ["chatcmpl-r0_0", "chatcmpl-r0_1", "chatcmpl-r0_2"]
    # The server reports one total per call: each member gets its share, summing to it.
    usages = [r.usage for r in out]
    assert all(u is not None and u.estimated and u.cached_tokens is None for u in usages)
    assert sum(u.prompt_tokens for u in usages if u) == 9
    assert sum(u.completion_tokens for u in usages if u) == 9
    posts = [r for r in recorder.requests if r.method == "POST"]
    assert len(posts) == 1
    body = json.loads(posts[0].content)
    assert body["messages"] == [[{"role": "user", "content": t}] for t in "abc"]
    assert body["max_tokens"] == 8
    assert "stream" not in body


async def test_complete_batch_groups_by_params_and_routes_the_rest(recorder: Recorder) -> None:
    _batch_handler(recorder)
    requests = [
        conv("a", params={"max_tokens": 8}),
        req(messages=(), params={"prompt": "p1", "max_tokens": 4}),
        conv("b", params={"max_tokens": 8}),
        conv("tool", params={"max_tokens": 8, "tools": [{"type": "function"}]}),
        req(messages=(), params={"prompt": "p2", "max_tokens": 4}),
        conv("c", params={"max_tokens": 99}),
    ]
    async with make(recorder) as b:
        out = await b.complete_batch(requests)
    assert [r.content for r in out] == [
        "answer to a",
        "P1",
        "answer to b",
        "single tool",
        "P2",
        "single c",
    ]
    paths = sorted(r.url.path for r in recorder.requests if r.method == "POST")
    assert paths == [
        "/v1/chat/completions",
        "/v1/chat/completions",
        "/v1/chat/completions/batch",
        "/v1/completions",
    ]
    prompt_call = next(r for r in recorder.requests if r.url.path == "/v1/completions")
    import json

    assert json.loads(prompt_call.content)["prompt"] == ["p1", "p2"]
    # Both stopped on max_tokens, but their caps (4 + 4) exceed the server's total (2):
    # the total is split by answer length instead.
    assert [out[1].usage, out[4].usage] == [
        Usage(prompt_tokens=1, completion_tokens=1, estimated=True),
        Usage(prompt_tokens=1, completion_tokens=1, estimated=True),
    ]


async def test_complete_batch_falls_back_on_404_and_remembers(recorder: Recorder) -> None:
    _batch_handler(recorder, batch_status=404)
    async with make(recorder) as b:
        out = await b.complete_batch([conv("a"), conv("b")])
        assert [r.content for r in out] == ["single a", "single b"]
        assert [r.url.path for r in recorder.requests].count("/v1/chat/completions/batch") == 1
        out = await b.complete_batch([conv("c"), conv("d")])
        assert [r.content for r in out] == ["single c", "single d"]
    # second round went straight to one-by-one
    assert [r.url.path for r in recorder.requests].count("/v1/chat/completions/batch") == 1
    assert len([r for r in recorder.requests if r.method == "POST"]) == 5


async def test_complete_batch_model_404_is_not_a_fallback(recorder: Recorder) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m2"}]})
        return httpx.Response(404, json=error_body("The model `m` does not exist.", code=404))

    recorder.handler = handler
    async with make(recorder) as b:
        with pytest.raises(ModelNotFoundError, match="m2"):
            await b.complete_batch([conv("a"), conv("b")])
        assert b._chat_batch_supported is None


async def test_one_bad_member_fails_only_its_caller(recorder: Recorder) -> None:
    _batch_handler(recorder)
    requests = [conv(t, params={"max_tokens": 8}) for t in ("a", "huge", "b", "c")]
    async with make(recorder) as b:
        out = await b.complete_batch_settled(requests)
        assert [getattr(o, "content", None) for o in out] == [
            "single a",
            None,
            "single b",
            "single c",
        ]
        assert isinstance(out[1], ContextLengthExceededError)
        assert out[1].max_model_len == 32768
        # complete_batch keeps its contract: the first error is raised.
        with pytest.raises(ContextLengthExceededError):
            await b.complete_batch(requests)
    paths = [r.url.path for r in recorder.requests if r.method == "POST"]
    # The batch failed with a 400, then every member went alone.
    assert paths[:5] == ["/v1/chat/completions/batch"] + ["/v1/chat/completions"] * 4


async def test_a_prompt_that_cannot_fit_goes_alone_before_any_batch(recorder: Recorder) -> None:
    _batch_handler(recorder, max_model_len=100)
    long_text = "word " * 200  # ~333 tokens by the generous estimate > 100
    requests = [conv(t, params={"max_tokens": 8}) for t in ("a", long_text, "b")]
    async with make(recorder) as b:
        out = await b.complete_batch_settled(requests)
    assert [getattr(o, "content", None) for o in out] == [
        "answer to a",
        f"single {long_text}",
        "answer to b",
    ]
    gets = [r for r in recorder.requests if r.method == "GET"]
    assert [r.url.path for r in gets] == ["/v1/models"]  # learned once


async def test_complete_batch_single_and_empty(recorder: Recorder) -> None:
    _batch_handler(recorder)
    async with make(recorder) as b:
        assert await b.complete_batch([]) == []
        out = await b.complete_batch([conv("solo")])
    assert [r.content for r in out] == ["single solo"]
    assert recorder.requests[0].url.path == "/v1/chat/completions"


# ------------------------------------------------------------------ forced tool calls are strict


def _tool(name: str, **extra: object) -> dict[str, object]:
    params = {"type": "object", "properties": {"x": {"type": "string"}}, "required": []}
    return {"type": "function", "function": {"name": name, "parameters": params, **extra}}


@pytest.mark.parametrize(
    ("choice", "strict"),
    [
        ({"type": "function", "function": {"name": "a"}}, {"a": True, "b": None, "c": False}),
        ("required", {"a": True, "b": True, "c": False}),
        ("auto", {"a": None, "b": None, "c": False}),
        (None, {"a": None, "b": None, "c": False}),
    ],
)
async def test_tools_a_forced_choice_may_call_go_out_strict(
    recorder: Recorder, choice: object, strict: dict[str, object]
) -> None:
    # vLLM 0.32 pins a forced call's arguments to the schema only for strict tools;
    # a tool that states strict (here c: False) is left as the caller said.
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    tools = [_tool("a"), _tool("b"), _tool("c", strict=False)]
    params: dict[str, object] = {"tools": tools}
    if choice is not None:
        params["tool_choice"] = choice
    async with make(recorder) as b:
        await b.chat(req(params=params))
    sent = recorder.last_body["tools"]
    assert {t["function"]["name"]: t["function"].get("strict") for t in sent} == strict
    assert [t["function"]["parameters"] for t in sent] == [
        t["function"]["parameters"] for t in tools
    ]
    assert "strict" not in tools[0]["function"]  # the caller's dicts are not mutated


def test_metrics_capacity_prefers_the_stated_kv_cache_size_tokens() -> None:
    # vLLM 0.32 states the capacity; it wins over block_size x num_gpu_blocks.
    text = (
        'vllm:cache_config_info{block_size="32",engine="0",kv_cache_size_tokens="4064",'
        'num_gpu_blocks="128"} 1.0\n'
    )
    assert parse_vllm_metrics(text).kv_capacity_tokens == 4064
    older = 'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0\n'
    assert parse_vllm_metrics(older).kv_capacity_tokens == 1600


@pytest.mark.parametrize("adds_up", [True, False])
async def test_text_prompts_in_one_call_get_exact_usage_from_their_token_ids(
    recorder: Recorder, adds_up: bool
) -> None:
    # vLLM answers return_token_ids with each choice's prompt and answer ids: the
    # exact per-prompt usage (found on the real engine: the split was an estimate).
    ids = {"short": ([1], [7, 7]), "a longer prompt": ([1, 2, 3, 4, 5], [8, 8, 8])}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/completions":  # /v1/models: no length pre-filter
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(request.content)
        choices = [
            {
                "index": i,
                "text": "x",
                "finish_reason": "length",
                "prompt_token_ids": ids[p][0],
                "token_ids": ids[p][1],
            }
            for i, p in enumerate(body["prompt"])
        ]
        usage = {"prompt_tokens": 6 if adds_up else 9, "completion_tokens": 5}
        return httpx.Response(
            200, json={"id": "cmpl-1", "model": "m", "choices": choices, "usage": usage}
        )

    recorder.handler = handler
    requests = [
        req(messages=(), params={"prompt": p, "max_tokens": 3}, batchable=True) for p in ids
    ]
    async with make(recorder) as b:
        out = await b.complete_batch(requests)
    assert recorder.last_body["return_token_ids"] is True
    usages = [r.usage for r in out]
    if adds_up:
        assert usages == [
            Usage(prompt_tokens=1, completion_tokens=2),
            Usage(prompt_tokens=5, completion_tokens=3),
        ]
    else:  # the ids do not match the call's totals: the totals are split instead
        assert all(u is not None and u.estimated for u in usages)
        assert sum(u.prompt_tokens for u in usages if u) == 9
