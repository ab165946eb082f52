"""DynamoBackend: the X-Dynamo-* headers, nvext.agent_hints, cache_control, the URL scheme."""

from __future__ import annotations

import httpx
import pytest

from langgraph_batch._context import SiblingInfo, sibling_scope
from langgraph_batch.backends import ChatRequest, DynamoBackend, backend_from_url, backend_key
from langgraph_batch.backends._dynamo_hints import (
    OutputLengths,
    agent_hints,
    cache_control,
    dynamo_headers,
    program_key,
)
from langgraph_batch.backends._session import session_key
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.chat_model._request import build_request
from tests.fakes.http import Recorder, completion


def make(recorder: Recorder, **kw: object) -> DynamoBackend:
    return DynamoBackend("http://frontend:8000/v1", transport=recorder.transport, **kw)  # type: ignore[arg-type]


def req(**kw: object) -> ChatRequest:
    kw.setdefault("model", "m")
    kw.setdefault("messages", [{"role": "user", "content": "hi"}])
    return ChatRequest(**kw)  # type: ignore[arg-type]


def answer(completion_tokens: int = 2) -> httpx.Response:
    usage = {"prompt_tokens": 10, "completion_tokens": completion_tokens, "total_tokens": 12}
    return httpx.Response(200, json=completion(usage=usage))


def test_the_scheme_builds_a_dynamo_backend() -> None:
    backend = backend_from_url("dynamo://127.0.0.1:8000")
    assert isinstance(backend, DynamoBackend)
    assert backend.base_url == "http://127.0.0.1:8000"
    assert backend_key("dynamo://127.0.0.1:8000/v1") == backend.key
    assert backend_key("dynamo://h:1").startswith("DynamoBackend:http://h:1")
    assert isinstance(backend_from_url("dynamo+https://h", cache_control=True), DynamoBackend)


def test_a_negative_latency_step_is_refused() -> None:
    with pytest.raises(ValueError, match="latency_per_turn_s"):
        DynamoBackend("http://h:1", latency_per_turn_s=-1.0)


async def test_a_sibling_sends_its_session_parent_and_final_headers(recorder: Recorder) -> None:
    recorder.handler = lambda r: answer()
    sibling = req(route_key="sibling:run/3", program="run", turn=1, final=True)
    async with make(recorder, parent_session=True) as b:
        await b.chat(sibling)
        await b.chat(req(route_key="sibling:run/4", program="run"))
    first, second = recorder.requests
    key = first.headers["X-Dynamo-Session-ID"]
    assert key == session_key(sibling)
    assert len(key) == 32
    assert first.headers["X-Session-ID"] == key  # the SessionConfig headers stay
    parent = first.headers["X-Dynamo-Parent-Session-ID"]
    assert parent == program_key(sibling)
    assert parent not in (key, "run")
    assert first.headers["X-Dynamo-Session-Final"] == "true"
    assert second.headers["X-Dynamo-Parent-Session-ID"] == parent  # one run, one parent
    assert second.headers["X-Dynamo-Session-ID"] != key
    assert "X-Dynamo-Session-Final" not in second.headers


async def test_no_parent_by_default_nor_outside_a_fan_out(recorder: Recorder) -> None:
    recorder.handler = lambda r: answer()
    async with make(recorder) as b:
        await b.chat(req(route_key="sibling:run/3", program="run", final=True))
    async with make(recorder, parent_session=True) as b:
        await b.chat(req())
    for request in recorder.requests:
        assert "X-Dynamo-Session-ID" in request.headers
        assert "X-Dynamo-Parent-Session-ID" not in request.headers
    assert recorder.requests[0].headers["X-Dynamo-Session-Final"] == "true"


async def test_no_session_affinity_sends_no_session_header(recorder: Recorder) -> None:
    recorder.handler = lambda r: answer()
    async with make(recorder, session_affinity=None) as b:
        await b.chat(req(route_key="sibling:run/3", program="run", final=True))
    assert not [h for h in recorder.requests[0].headers if h.lower().startswith("x-dynamo")]
    assert "X-Session-ID" not in recorder.requests[0].headers


async def test_agent_hints_carry_priority_osl_and_latency(recorder: Recorder) -> None:
    recorder.handler = lambda r: answer(completion_tokens=40)
    async with make(recorder) as b:
        assert b.capabilities.priority  # the scheduler fills the progress priority
        await b.chat(req(priority=-5, turn=0, params={"max_tokens": 64}))
        assert recorder.last_body["nvext"] == {"agent_hints": {"priority": -5}}
        for _ in range(3):
            await b.chat(req(turn=2))
        await b.chat(req(priority=7, turn=2, params={"max_tokens": 30}))
    hints = recorder.last_body["nvext"]["agent_hints"]
    # osl: learned (40), capped by max_tokens; 1 s of head start per completed turn.
    assert hints == {"priority": 7, "osl": 30, "latency_sensitivity": 2.0}
    assert "cache_control" not in recorder.last_body["nvext"]


async def test_the_priority_sign_follows_the_engine(recorder: Recorder) -> None:
    recorder.handler = lambda r: answer()
    async with make(recorder, low_priority_values_first=False) as b:
        await b.chat(req(priority=3))
    assert recorder.last_body["nvext"]["agent_hints"]["priority"] == -3


async def test_agent_hints_off_sends_no_nvext(recorder: Recorder) -> None:
    recorder.handler = lambda r: answer()
    async with make(recorder, agent_hints=False) as b:
        assert not b.capabilities.priority
        await b.chat(req(priority=3, turn=4, retention_s=30.0))
    assert "nvext" not in recorder.last_body


async def test_cache_control_only_when_asked_and_the_callers_nvext_wins(
    recorder: Recorder,
) -> None:
    recorder.handler = lambda r: answer()
    async with make(recorder, cache_control=True) as b:
        await b.chat(req(retention_s=12.5))
        assert recorder.last_body["nvext"] == {"cache_control": {"type": "ephemeral", "ttl": "300"}}
        await b.chat(req(retention_s=None))
        assert "nvext" not in recorder.last_body
        own = {"nvext": {"agent_hints": {"priority": 1}, "extra_fields": ["worker_id"]}}
        await b.chat(req(priority=9, retention_s=900.0, params=own))
    assert recorder.last_body["nvext"] == {
        "agent_hints": {"priority": 1},
        "extra_fields": ["worker_id"],
        "cache_control": {"type": "ephemeral", "ttl": "900"},
    }


@pytest.mark.parametrize(
    ("wait", "ttl"),
    [
        (None, None),
        (0.0, None),
        (-1.0, None),
        (0.4, "300"),
        (299.0, "300"),
        (1234.6, "1235"),
        (3600.0, "3600"),
        (86400.0, "3600"),
    ],
)
def test_the_ttl_is_the_learned_wait_clamped(wait: float | None, ttl: str | None) -> None:
    got = cache_control(wait)
    assert (got["ttl"] if got else None) == ttl
    if got:
        assert got["type"] == "ephemeral"


def test_hints_stay_integers_dynamo_accepts() -> None:
    # Dynamo 1.6.1: priority is an i32, osl a u32; a float or a huge value is an HTTP 400.
    hints = agent_hints(req(priority=2**40, turn=0), osl=12)
    assert hints == {"priority": 2**31 - 1, "osl": 12}
    assert agent_hints(req(), osl=None) == {}
    assert agent_hints(req(turn=3), osl=0, latency_per_turn_s=0.0) == {}


def test_final_header_only_on_a_final_call() -> None:
    assert dynamo_headers(req(), "s", None) == {"X-Dynamo-Session-ID": "s"}
    assert dynamo_headers(req(final=True), "s", "p") == {
        "X-Dynamo-Session-ID": "s",
        "X-Dynamo-Parent-Session-ID": "p",
        "X-Dynamo-Session-Final": "true",
    }


def test_program_keys_are_opaque_and_scoped() -> None:
    a = req(program="run-1")
    assert program_key(req()) is None
    assert program_key(a) == program_key(req(program="run-1", route_key="sibling:x"))
    assert program_key(a) != program_key(req(program="run-2"))
    assert program_key(a, "tenant-a") != program_key(a, "tenant-b")


def test_output_lengths_learn_per_turn_then_overall() -> None:
    lengths = OutputLengths()
    assert lengths.expect(req(turn=0)) is None
    for n in (10, 12, 200):
        lengths.observe(0, n)
    assert lengths.expect(req(turn=0)) == 12  # the median
    assert lengths.expect(req(turn=5)) == 12  # an unseen turn: every turn's median
    for n in (50, 60, 70):
        lengths.observe(1, n)
    assert lengths.expect(req(turn=1)) == 60
    lengths.observe(1, 0)  # no usage: nothing learned
    assert lengths.expect(req(turn=1)) == 60


@pytest.mark.parametrize(
    ("tool_name", "kwargs", "final"),
    [
        (None, {}, False),  # no tool called yet: the answer may still call one
        ("search", {"tools": [{"type": "function", "function": {"name": "s"}}]}, False),
        ("search", {}, True),  # has called tools, binds none: its answer turn
        ("search", {"tools": [{"type": "function"}], "tool_choice": "none"}, True),
    ],
)
def test_build_request_names_the_run_and_a_known_last_call(
    tool_name: str | None, kwargs: dict[str, object], final: bool
) -> None:
    model = BatchedChatModel(model="m", base_url="dynamo://127.0.0.1:1")
    sibling = SiblingInfo(group="g", index=2, turn=1, run_id="run-9", tool_name=tool_name)
    with sibling_scope(sibling):
        request, _ = build_request(model, [], None, kwargs, stream=False)
    assert request.program == "run-9"
    assert request.final is final
    outside, _ = build_request(model, [], None, {}, stream=False)
    assert outside.program is None
    assert outside.final is False
