"""Session keys for routers: the key, its headers, per-session batching, engine hints."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from unittest import mock

import httpx
import pytest

from langgraph_batch._context import SiblingInfo, sibling_scope
from langgraph_batch.backends import (
    ChatRequest,
    OpenAICompatibleBackend,
    SessionConfig,
    SGLangBackend,
    VLLMBackend,
    _session,
    backend_from_url,
    backend_key,
)
from langgraph_batch.backends._http import credentials_hash
from langgraph_batch.backends._session import session_key
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.chat_model._request import build_request
from langgraph_batch.errors import BackendServerError
from tests.fakes.http import Recorder, completion, error_body
from tests.unit.backends.test_vllm import _batch_handler, conv

SYSTEM = {"role": "system", "content": "You are a careful agent."}


def sibling_req(index: int, **kw: object) -> ChatRequest:
    kw.setdefault("model", "m")
    kw.setdefault("messages", [{"role": "user", "content": "hi"}])
    return ChatRequest(route_key=f"sibling:run-7/{index}", **kw)  # type: ignore[arg-type]


def vllm(recorder: Recorder, **kw: object) -> VLLMBackend:
    return VLLMBackend("http://srv:8000", transport=recorder.transport, **kw)  # type: ignore[arg-type]


def posts(recorder: Recorder) -> list[httpx.Request]:
    return [r for r in recorder.requests if r.method == "POST"]


# ---------------------------------------------------------------------------- the key


def test_the_key_is_stable_per_sibling_and_opaque() -> None:
    a1 = sibling_req(3, request_id="lgb-a-t0")
    a2 = sibling_req(3, request_id="lgb-a-t1", messages=[SYSTEM, {"role": "user", "content": "x"}])
    key = session_key(a1)
    assert key == session_key(a2)  # every turn of one sibling
    assert key != session_key(sibling_req(4))
    assert len(key) == 32
    assert int(key, 16) >= 0
    assert "run-7" not in key
    assert "sibling" not in key


def test_outside_fan_out_the_key_names_the_conversation() -> None:
    first = ChatRequest(model="m", messages=[SYSTEM, {"role": "user", "content": "task A"}])
    later = replace(
        first,
        messages=[
            *first.messages,
            {"role": "assistant", "content": "calling a tool"},
            {"role": "tool", "content": "result", "tool_call_id": "c1"},
        ],
    )
    other = ChatRequest(model="m", messages=[SYSTEM, {"role": "user", "content": "task B"}])
    assert session_key(first) == session_key(later)
    assert session_key(first) != session_key(other)


def test_the_key_changes_with_the_process_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    request = sibling_req(1)
    before = session_key(request)
    monkeypatch.setattr(_session, "_SECRET", b"another process" * 2)
    assert session_key(request) != before  # not guessable nor linkable across runs


def test_build_request_records_the_turn() -> None:
    model = BatchedChatModel(model="m", base_url="vllm://127.0.0.1:1")
    sibling = SiblingInfo(group="g", index=2, turn=4)
    with sibling_scope(sibling):
        request, _ = build_request(model, [], None, {}, stream=False)
    assert request.turn == 4
    assert request.route_key == "sibling:g/2"


# ---------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kwargs",
    [
        {"headers": "X-Session-ID"},
        {"headers": ("X Session",)},
        {"headers": ("",)},
        {"batching": "sometimes"},
        {"engine_hints": "dynamo"},
    ],
)
def test_config_refuses_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"header|batching|engine_hints"):
        SessionConfig(**kwargs)  # type: ignore[arg-type]


def test_backend_refuses_a_config_of_the_wrong_type() -> None:
    with pytest.raises(ValueError, match="session_affinity must be a SessionConfig"):
        VLLMBackend("http://srv:8000", session_affinity="X-Session-ID")  # type: ignore[arg-type]


@pytest.mark.parametrize("setting", [SessionConfig(), None, SessionConfig(headers=("X-User-ID",))])
@pytest.mark.parametrize("url", ["vllm://h:1", "sglang://h:2", "http://h:3/v1", "vllm://a:1,b:2"])
def test_backend_key_matches_the_backend(url: str, setting: SessionConfig | None) -> None:
    backend = backend_from_url(url, session_affinity=setting)
    assert backend.key == backend_key(url, session_affinity=setting)


def test_models_with_other_session_settings_do_not_share_a_backend() -> None:
    url = "vllm://127.0.0.1:1"
    plain = BatchedChatModel(model="m", base_url=url)
    off = BatchedChatModel(model="m", base_url=url, session_affinity=None)
    same = BatchedChatModel(model="m", base_url=url, session_affinity=SessionConfig())
    assert plain.backend_key == same.backend_key == "VLLMBackend:http://127.0.0.1:1"
    assert off.backend_key != plain.backend_key
    assert off._make_backend().key == off.backend_key


# ---------------------------------------------------------------------------- headers


@pytest.mark.parametrize("cls", [VLLMBackend, SGLangBackend, OpenAICompatibleBackend])
async def test_every_request_carries_the_key_in_both_router_headers(
    recorder: Recorder, cls: type[OpenAICompatibleBackend]
) -> None:
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    request = sibling_req(5, request_id="lgb-x")
    async with cls("http://srv:8000", transport=recorder.transport) as b:
        await b.chat(request)
        await b.chat(replace(request, stream=False, request_id="lgb-y"))
    key = session_key(request)
    for sent in recorder.requests:
        assert sent.headers["x-session-id"] == key
        assert sent.headers["x-smg-routing-key"] == key
    if cls is VLLMBackend:
        assert recorder.requests[1].headers["x-request-id"] == "lgb-y"


async def test_off_with_one_setting(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    async with vllm(recorder, session_affinity=None) as b:
        await b.chat(sibling_req(5, request_id="lgb-x"))
    sent = recorder.requests[0]
    assert "x-session-id" not in sent.headers
    assert "x-smg-routing-key" not in sent.headers
    assert sent.headers["x-request-id"] == "lgb-x"


async def test_custom_header_and_a_users_own_header_wins(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    config = SessionConfig(headers=("X-User-ID", "X-Session-ID"))
    async with vllm(recorder, session_affinity=config, headers={"x-session-id": "mine"}) as b:
        await b.chat(sibling_req(5))
    sent = recorder.requests[0]
    assert sent.headers["x-session-id"] == "mine"
    # The backend's headers are part of who calls: they scope the key.
    scope = credentials_hash(headers={"x-session-id": "mine"})
    assert sent.headers["x-user-id"] == session_key(sibling_req(5), scope)
    assert "x-smg-routing-key" not in sent.headers


async def test_the_key_stays_out_of_reprs_errors_and_logs(
    recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    recorder.handler = lambda r: httpx.Response(500, json=error_body("boom"))
    request = sibling_req(9, request_id="lgb-r")
    key = session_key(request)
    caplog.set_level(logging.DEBUG)
    async with vllm(recorder) as b:
        with pytest.raises(BackendServerError) as info:
            await b.chat(request)
        assert key not in repr(b)
        assert key not in b.key
    assert key not in str(info.value)
    assert key not in repr(info.value)
    assert key not in caplog.text


# ---------------------------------------------------------------------------- batching


def keyed(text: str, sibling: int) -> ChatRequest:
    return replace(conv(text, params={"max_tokens": 8}), route_key=f"sibling:g/{sibling}")


async def test_auto_mixes_sessions_on_a_server_and_asks_once(recorder: Recorder) -> None:
    _batch_handler(recorder)
    async with vllm(recorder) as b:
        await b.complete_batch([keyed("a", 1), keyed("b", 2), keyed("c", 3)])
        await b.complete_batch([keyed("d", 1), keyed("e", 2)])
    assert recorder.probes == 1
    calls = posts(recorder)
    assert [len(json.loads(c.content)["messages"]) for c in calls] == [3, 2]
    # One call reaches one replica: it carries its first member's key.
    assert calls[0].headers["x-session-id"] == session_key(keyed("a", 1))


async def test_auto_keeps_sessions_apart_behind_a_router(recorder: Recorder) -> None:
    _batch_handler(recorder)
    recorder.workers = [{"url": "http://gpu1:8000"}, {"url": "http://gpu2:8000"}]
    batch = [keyed("a", 1), keyed("b", 2), keyed("a2", 1), keyed("c", 3)]
    async with vllm(recorder) as b:
        out = await b.complete_batch(batch)
    assert [r.content for r in out] == ["answer to a", "single b", "answer to a2", "single c"]
    calls = posts(recorder)
    by_key = {c.headers["x-session-id"]: c for c in calls}
    assert len(calls) == 3
    assert len(by_key) == 3
    together = json.loads(by_key[session_key(batch[0])].content)
    assert [m[-1]["content"] for m in together["messages"]] == ["a", "a2"]


@pytest.mark.parametrize(("batching", "calls"), [("per_session", 2), ("mixed", 1)])
async def test_explicit_batching_needs_no_probe(
    recorder: Recorder, batching: str, calls: int
) -> None:
    _batch_handler(recorder)
    recorder.workers = [{"url": "http://gpu1:8000"}]
    config = SessionConfig(batching=batching)  # type: ignore[arg-type]
    async with vllm(recorder, session_affinity=config) as b:
        await b.complete_batch([keyed("a", 1), keyed("b", 2)])
    assert recorder.probes == 0
    assert len(posts(recorder)) == calls


async def test_engine_hints_keep_batches_per_session(recorder: Recorder) -> None:
    _batch_handler(recorder)
    config = SessionConfig(engine_hints="agentic_context")
    async with vllm(recorder, session_affinity=config) as b:
        await b.complete_batch([keyed("a", 1), keyed("b", 2), keyed("c", 1)])
    assert recorder.probes == 0
    bodies = [json.loads(c.content) for c in posts(recorder)]
    contexts = [body["vllm_xargs"]["agentic_context"] for body in bodies]
    sizes = sorted(len(b["messages"]) if b["messages"] and isinstance(b["messages"][0], list)
                   else 1 for b in bodies)  # fmt: skip
    assert sizes == [1, 2]  # a and c (one sibling) together, b alone
    assert {c["program_id"] for c in contexts} == {
        session_key(keyed("a", 1)),
        session_key(keyed("b", 2)),
    }


async def test_without_a_key_batches_mix_even_behind_a_router(recorder: Recorder) -> None:
    _batch_handler(recorder)
    recorder.workers = [{"url": "http://gpu1:8000"}]
    async with vllm(recorder, session_affinity=None) as b:
        await b.complete_batch([keyed("a", 1), keyed("b", 2)])
    assert recorder.probes == 0
    assert len(posts(recorder)) == 1


async def test_a_failed_probe_mixes_and_asks_again_later(recorder: Recorder) -> None:
    _batch_handler(recorder)
    routing = _session.SessionRouting(SessionConfig(), {})

    async def failing(url: httpx.URL) -> httpx.Response:
        raise BackendServerError("down", url=str(url))

    async def router(url: httpx.URL) -> httpx.Response:
        return httpx.Response(200, json={"workers": []})

    async def hanging(url: httpx.URL) -> httpx.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    url = httpx.URL("http://srv/workers")
    with mock.patch.object(_session, "_DETECT_TIMEOUT_S", 0.01):
        await routing.resolve(hanging, url, now=-100.0)
    assert not routing.per_session
    await routing.resolve(failing, url, now=0.0)
    assert not routing.per_session
    await routing.resolve(router, url, now=1.0)  # too soon: not asked
    assert not routing.per_session
    asked: list[int] = []
    for i, status in enumerate((503, 401, 429)):  # busy or refusing: asked again later

        async def refusing(url: httpx.URL, status: int = status) -> httpx.Response:
            asked.append(status)
            return httpx.Response(status, json={"error": "no"})

        await routing.resolve(refusing, url, now=100.0 * (i + 1))
        assert not routing.per_session
    assert asked == [503, 401, 429]
    await routing.resolve(router, url, now=1_000.0)
    assert routing.per_session
    assert routing.group_key(sibling_req(1)) == session_key(sibling_req(1))


async def test_sglang_generate_batches_keep_sessions_apart_behind_a_router(
    recorder: Recorder,
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/v1/completions":  # a member alone
            answer = {"index": 0, "text": body["prompt"].upper(), "finish_reason": "stop"}
            return httpx.Response(200, json={"id": "c", "model": "m", "choices": [answer]})
        return httpx.Response(
            200,
            json=[
                {"text": t.upper(), "meta_info": {"prompt_tokens": 1, "completion_tokens": 1}}
                for t in body["text"]
            ],
        )

    recorder.handler = handler
    recorder.workers = [{"url": "http://gpu1:30000"}]
    prompts = [
        ChatRequest(
            model="m",
            messages=(),
            params={"prompt": p, "max_tokens": 2},
            route_key=f"sibling:g/{s}",
            batchable=True,
        )
        for p, s in (("a", 1), ("b", 2), ("c", 1))
    ]
    async with SGLangBackend("http://srv:30000", transport=recorder.transport) as b:
        out = await b.complete_batch(prompts)
    assert [r.content for r in out] == ["A", "B", "C"]
    generate = [c for c in recorder.requests if c.url.path == "/generate"]
    assert len(generate) == 1
    assert generate[0].headers["x-smg-routing-key"] == session_key(prompts[0])
    assert json.loads(generate[0].content)["text"] == ["a", "c"]
    alone = next(c for c in recorder.requests if c.url.path == "/v1/completions")
    assert alone.headers["x-smg-routing-key"] == session_key(prompts[1])


# ---------------------------------------------------------------------------- engine hints


async def test_no_engine_hints_by_default(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    async with vllm(recorder) as b:
        await b.chat(sibling_req(2, turn=1))
    assert "vllm_xargs" not in recorder.last_body


async def test_agentic_context_hints(recorder: Recorder) -> None:
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    config = SessionConfig(engine_hints="agentic_context")
    request = sibling_req(2, turn=3, priority=-2, params={"max_tokens": 64})
    async with vllm(recorder, session_affinity=config) as b:
        await b.chat(request)
        await b.chat(replace(request, turn=None, priority=0, params={"vllm_xargs": {"a": 1}}))
    key = session_key(request)
    first = json.loads(recorder.requests[0].content)["vllm_xargs"]["agentic_context"]
    assert first == {
        "program_id": key,
        "session_id": key,
        "step_id": 3,
        "priority": 2,  # the router resumes larger values first; ours: lower sooner
        "expected_output_length": 64,
    }
    second = recorder.last_body["vllm_xargs"]
    assert second == {"a": 1, "agentic_context": {"program_id": key, "session_id": key}}


async def test_the_learned_tool_wait_is_sent_as_the_programs_kv_retention(
    recorder: Recorder,
) -> None:
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    config = SessionConfig(engine_hints="agentic_context")
    request = replace(sibling_req(1, turn=2), retention_s=4.56789)
    async with vllm(recorder, session_affinity=config) as b:
        await b.chat(request)
        await b.chat(replace(request, retention_s=None))
    hinted, unknown = (
        json.loads(r.content)["vllm_xargs"]["agentic_context"] for r in recorder.requests
    )
    assert hinted["kv_retention_ttl_seconds"] == 4.568
    assert "kv_retention_ttl_seconds" not in unknown
    async with vllm(recorder) as b:  # hints off (the default): nothing is sent
        await b.chat(request)
    assert "vllm_xargs" not in recorder.last_body


async def test_callers_with_other_credentials_never_share_a_key(recorder: Recorder) -> None:
    # Two tenants (API keys) behind one router, same conversation or sibling id: the
    # router must not see one session (or one program, with engine hints) for both.
    recorder.handler = lambda r: httpx.Response(200, json=completion())
    config = SessionConfig(engine_hints="agentic_context")
    conversation = ChatRequest(model="m", messages=[SYSTEM, {"role": "user", "content": "hi"}])
    for request in (sibling_req(1), conversation):
        recorder.requests.clear()
        for api_key in ("sk-tenant-a", "sk-tenant-b", "sk-tenant-a"):
            async with vllm(recorder, api_key=api_key, session_affinity=config) as b:
                await b.chat(request)
        a, b_, a_again = (r.headers["x-session-id"] for r in recorder.requests)
        assert a != b_
        assert a == a_again  # stable per caller: still one session per sibling or conversation
        programs = [
            json.loads(r.content)["vllm_xargs"]["agentic_context"]["program_id"]
            for r in recorder.requests
        ]
        assert programs == [a, b_, a_again]
        assert "sk-tenant" not in a + b_


async def test_batches_that_start_together_ask_once(recorder: Recorder) -> None:
    _batch_handler(recorder)
    recorder.workers = [{"url": "http://gpu1:8000"}]

    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.01)  # a network: the other batches start meanwhile
        return recorder(request)

    async with VLLMBackend("http://srv:8000", transport=httpx.MockTransport(slow)) as b:
        batches = [[keyed("a", i), keyed("b", i + 10)] for i in range(4)]
        await asyncio.gather(*(b.complete_batch(batch) for batch in batches))
    assert recorder.probes == 1
    assert len(posts(recorder)) == 8  # every batch waited for the answer: per session
