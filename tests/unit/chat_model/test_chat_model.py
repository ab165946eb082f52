from __future__ import annotations

import asyncio
import gc
import uuid
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage
from langchain_core.tools import tool
from pydantic import SecretStr

from langgraph_batch._context import SiblingInfo, sibling_scope
from langgraph_batch.backends.base import ChatRequest
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.errors import BackendBadRequestError
from tests.fakes.backends import Reply, ScriptedBackend


def make(
    backend: ScriptedBackend | None = None, **kw: Any
) -> tuple[BatchedChatModel, ScriptedBackend]:
    backend = backend or ScriptedBackend(base_url=f"fake://{uuid.uuid4().hex}")
    return BatchedChatModel(model="m", backend=backend, **kw), backend


@tool
def search(query: str) -> str:
    """Search the web."""
    return f"results for {query}"


# ----------------------------------------------------------------- construction


def test_fields_aliases_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    llm = BatchedChatModel(model_name="x", base_url="vllm://127.0.0.1:8000")
    assert llm.model == "x"
    assert llm.api_key is None
    monkeypatch.setenv("OPENAI_API_KEY", "from-openai")
    assert BatchedChatModel(model="x").api_key == SecretStr("from-openai")
    monkeypatch.setenv("LGB_API_KEY", "from-lgb")
    assert BatchedChatModel(model="x").api_key == SecretStr("from-lgb")
    monkeypatch.setenv("LGB_BASE_URL", "sglang://h:30000")
    assert BatchedChatModel(model="x").provider == "sglang"


@pytest.mark.parametrize("url", ["ftp://host", "localhost:8000", "vllm://"])
def test_bad_url_names_the_value(url: str) -> None:
    with pytest.raises(ValueError, match=url.replace(":", ":")):
        BatchedChatModel(model="x", base_url=url)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout", 0),
        ("total_timeout", -1.0),
        ("max_inflight", 0),
        ("max_retries", -1),
        ("max_tokens", -5),
        ("max_tokens", 0),
        ("temperature", -0.1),
        ("stream_chunk_timeout", -1),
    ],
)
def test_bad_numbers_fail_at_construction(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field) as info:
        BatchedChatModel(model="x", **{field: value})
    assert str(value) in str(info.value)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("vllm://127.0.0.1:99999", "99999"),
        ("http://h:0/v1", "port 0"),
        ("vllm://h:abc", "not a valid URL"),
        ("vllm://h:1,h:70000", "70000"),
    ],
)
def test_bad_ports_fail_at_construction(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BatchedChatModel(model="x", base_url=url)


def test_openai_scheme_without_a_key_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="needs an API key"):
        BatchedChatModel(model="gpt", base_url="openai://api.openai.com")
    assert BatchedChatModel(model="gpt", base_url="openai://api.openai.com", api_key="sk-x")


@pytest.mark.parametrize(
    "url",
    [
        "vllm://127.0.0.1:8000",
        "http://127.0.0.1:8000/v1/",
        "sglang+https://gpu:30000",
        "openai://api.example.com",
    ],
)
async def test_scheduler_key_matches_the_backend_it_builds(url: str) -> None:
    from langgraph_batch.backends import backend_from_url

    llm = BatchedChatModel(model="m", base_url=url, api_key="k", timeout=5)
    async with backend_from_url(url, api_key="k") as backend:
        assert llm.scheduler_key == backend.key
    scheduler = llm.get_scheduler()
    try:
        assert scheduler.backend.key == llm.scheduler_key
        assert scheduler is llm.get_scheduler()
        # Same endpoint and key, other sampling options: the same scheduler.
        same = BatchedChatModel(model="other", base_url=url, api_key="k", temperature=1.0)
        assert scheduler is same.get_scheduler()
    finally:
        await scheduler.aclose()


async def test_models_with_other_credentials_never_share_a_scheduler() -> None:
    url = "vllm://127.0.0.1:8000"
    a = BatchedChatModel(model="m", base_url=url, api_key="sk-tenant-a")
    b = BatchedChatModel(model="m", base_url=url, api_key="sk-tenant-b")
    no_key = BatchedChatModel(model="m", base_url=url)
    headed = BatchedChatModel(model="m", base_url=url, default_headers={"X-Tenant": "a"})
    queried = BatchedChatModel(model="m", base_url=url, default_query={"tenant": "a"})
    keys = {m.scheduler_key for m in (a, b, no_key, headed, queried)}
    assert len(keys) == 5
    for key in keys:
        assert "sk-tenant" not in key
    assert (
        a.scheduler_key
        == BatchedChatModel(model="x", base_url=url, api_key="sk-tenant-a").scheduler_key
    )
    schedulers = [m.get_scheduler() for m in (a, b, no_key, headed, queried)]
    try:
        assert len({id(s) for s in schedulers}) == 5
        backends = [s.backend for s in schedulers]
        assert len({id(x) for x in backends}) == 5
    finally:
        for s in schedulers:
            await s.aclose()


async def test_a_scheduler_name_cannot_carry_another_models_credentials() -> None:
    name = f"tenant-{uuid.uuid4().hex}"
    first = BatchedChatModel(model="m", base_url="vllm://h:1", api_key="sk-a", scheduler=name)
    scheduler = first.get_scheduler()
    try:
        other = BatchedChatModel(model="m", base_url="vllm://h:1", api_key="sk-b", scheduler=name)
        with pytest.raises(ValueError, match="another scheduler name") as info:
            other.get_scheduler()
        assert "sk-" not in str(info.value)
        same = BatchedChatModel(model="n", base_url="vllm://h:1", api_key="sk-a", scheduler=name)
        assert same.get_scheduler() is scheduler
    finally:
        await scheduler.aclose()


def test_default_policy_caps_at_256_and_starts_at_64() -> None:
    llm = BatchedChatModel(model="m", backend=ScriptedBackend(base_url="fake://default-policy"))
    assert llm.max_inflight == 256
    policy = llm.default_policy()
    assert (policy.hard_cap, policy.initial_inflight, policy.inflight_limit) == (256, 64, 256)
    assert BatchedChatModel(model="m", max_inflight=32).default_policy().initial_inflight == 32


async def test_named_and_explicit_schedulers() -> None:
    from langgraph_batch.scheduler import Scheduler

    backend = ScriptedBackend(base_url=f"fake://{uuid.uuid4().hex}")
    named = BatchedChatModel(model="m", backend=backend, scheduler="my-sched", max_inflight=4)
    assert named.scheduler_key == "my-sched"
    sched = named.get_scheduler()
    assert sched.name == "my-sched"
    # max_inflight is the hard cap: the adaptive limit may shrink, never grow past it.
    assert sched.policy.inflight_limit == 4
    assert sched.policy.inflight_cap == 4
    assert sched.policy.hard_cap == 4
    assert sched.policy.initial_inflight == 4
    await sched.aclose()
    async with Scheduler(ScriptedBackend(base_url="fake://explicit")) as explicit:
        llm = BatchedChatModel(model="m", scheduler=explicit)
        assert llm.get_scheduler() is explicit
        assert (await llm.ainvoke("hi")).content == "hello world"


def test_bad_scheduler_type() -> None:
    with pytest.raises(ValueError, match="scheduler must be"):
        BatchedChatModel(model="x", scheduler=42)


@pytest.mark.parametrize(
    ("url", "provider"),
    [
        ("vllm://h:1", "vllm"),
        ("sglang://h:1", "sglang"),
        ("openai://api.openai.com", "openai"),
        ("http://h:1/v1", "openai"),
    ],
)
def test_ls_params(url: str, provider: str) -> None:
    llm = BatchedChatModel(
        model="m", base_url=url, api_key="k", temperature=0.2, max_tokens=9, stop=["x"]
    )
    params = llm._get_ls_params()
    assert params == {
        "ls_provider": provider,
        "ls_model_name": "m",
        "ls_model_type": "chat",
        "ls_temperature": 0.2,
        "ls_max_tokens": 9,
        "ls_stop": ["x"],
    }
    assert llm._get_ls_params(model="other")["ls_model_name"] == "other"
    assert llm._llm_type == "langgraph-batch"
    assert llm._identifying_params["model_name"] == "m"


# ----------------------------------------------------------------- requests


async def test_ainvoke_builds_request_and_message() -> None:
    llm, backend = make(
        temperature=0.0,
        max_tokens=16,
        stop=["END"],
        extra_body={"top_k": 5},
        model_kwargs={"seed": 1},
    )
    msg = await llm.ainvoke([SystemMessage("sys"), HumanMessage("hi")])
    (req,) = backend.requests
    assert req.model == "m"
    assert req.messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert req.params == {
        "temperature": 0.0,
        "max_tokens": 16,
        "stop": ["END"],
        "top_k": 5,
        "seed": 1,
    }
    assert req.stream is False
    assert req.batchable is True
    assert req.request_id.startswith("lgb-")
    assert len(req.request_id) == 36
    assert isinstance(msg, AIMessage)
    assert msg.content == "hello world"
    assert msg.usage_metadata == {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
    assert msg.response_metadata["model_name"] == "m"
    assert msg.response_metadata["finish_reason"] == "stop"
    assert msg.response_metadata["request_id"] == req.request_id
    assert msg.response_metadata["id"] == f"chatcmpl-{req.request_id}"


async def test_call_kwargs_override_and_merge() -> None:
    llm, backend = make(temperature=0.5)
    await llm.ainvoke(
        "hi",
        stop=["a"],
        model="other",
        temperature=0.9,
        extra_body={"emulator": {"output_tokens": 2}},
    )
    (req,) = backend.requests
    assert req.model == "other"
    assert req.params == {"temperature": 0.9, "stop": ["a"], "emulator": {"output_tokens": 2}}


async def test_turn_from_history_and_sibling(monkeypatch: pytest.MonkeyPatch) -> None:
    llm, backend = make()
    scheduler = llm.get_scheduler()
    turns: list[tuple[int, Any]] = []
    original = type(scheduler).submit

    async def spy(self: Any, request: ChatRequest, **kw: Any) -> Any:
        turns.append((request.turn, kw["sibling"]))
        return await original(self, request, **kw)

    monkeypatch.setattr(type(scheduler), "submit", spy)
    history = [
        HumanMessage("a"),
        AIMessage("b"),
        HumanMessage("c"),
        AIMessage("d"),
        HumanMessage("e"),
    ]
    await llm.ainvoke(history)
    assert turns[-1] == (2, None)
    assert backend.requests[-1].batchable is False  # multi-turn

    info = SiblingInfo(group="g7", index=3, total=5, turn=4)
    with sibling_scope(info):
        await llm.ainvoke("x")
        await llm.ainvoke("y")
    assert turns[-2:] == [(4, info), (5, info)]
    assert info.turn == 6
    assert backend.requests[-2].request_id.startswith("lgb-g7-3-t4-")
    assert backend.requests[-1].request_id.startswith("lgb-g7-3-t5-")


async def test_failed_call_does_not_advance_turn() -> None:
    llm, _ = make(
        backend=ScriptedBackend(
            lambda r: Reply(error=BackendBadRequestError("nope", status_code=400))
        )
    )
    info = SiblingInfo(group="g", index=0)
    with sibling_scope(info), pytest.raises(BackendBadRequestError, match="nope"):
        await llm.ainvoke("x")
    assert info.turn == 0


# ----------------------------------------------------------------- tools


async def test_bind_tools_tool_choice_and_passthrough() -> None:
    # The fake answers text: "return" keeps a forced choice without a call from raising.
    llm, backend = make(invalid_tool_calls="return")
    await llm.bind_tools([search], tool_choice="any", parallel_tool_calls=False).ainvoke("q")
    await llm.bind_tools([search], tool_choice="search", strict=True).ainvoke("q")
    await llm.bind_tools([search]).ainvoke("q")
    rf = {
        "type": "json_schema",
        "json_schema": {"name": "Out", "schema": {"type": "object"}, "strict": True},
    }
    await llm.bind_tools([search], response_format=rf, custom_flag=1).ainvoke("q")
    p0, p1, p2, p3 = (r.params for r in backend.requests)
    assert p0["tools"][0]["function"]["name"] == "search"
    assert p0["tool_choice"] == "required"
    assert p0["parallel_tool_calls"] is False
    assert p1["tool_choice"] == {"type": "function", "function": {"name": "search"}}
    assert p1["tools"][0]["function"]["strict"] is True
    assert "tool_choice" not in p2
    assert p3["response_format"] == rf
    assert p3["custom_flag"] == 1
    assert not backend.requests[0].batchable


async def test_tool_calls_and_malformed_arguments_returned_like_chat_openai() -> None:
    backend = ScriptedBackend(
        lambda r: Reply(tool_calls=[("search", '{"query": "x"}'), ("search", "{not json")])
    )
    llm, _ = make(backend, invalid_tool_calls="return")
    msg = await llm.bind_tools([search]).ainvoke("q")
    assert msg.tool_calls == [
        {"name": "search", "args": {"query": "x"}, "id": "call_0", "type": "tool_call"}
    ]
    assert len(msg.invalid_tool_calls) == 1
    assert msg.invalid_tool_calls[0]["args"] == "{not json"
    assert msg.response_metadata["finish_reason"] == "tool_calls"


async def test_agent_answers_invalid_tool_call_with_error_message() -> None:
    from langchain.agents import create_agent

    def script(request: ChatRequest) -> Reply:
        if any(m["role"] == "tool" for m in request.messages):
            return Reply(content="sorry, retrying is pointless")
        return Reply(tool_calls=[("search", "not json at all")])

    llm, backend = make(
        ScriptedBackend(script, base_url=f"fake://{uuid.uuid4().hex}"), invalid_tool_calls="return"
    )
    agent = create_agent(llm, tools=[search])
    # The malformed call ends the turn (no valid call to run) without an exception.
    out = await agent.ainvoke({"messages": [HumanMessage("q")]})
    ai = out["messages"][-1]
    assert ai.tool_calls == []
    assert ai.invalid_tool_calls[0]["args"] == "not json at all"
    # On the next turn create_agent answers the invalid call with an error
    # ToolMessage, and the raw arguments are replayed as the model sent them.
    out = await agent.ainvoke({"messages": [*out["messages"], HumanMessage("again")]})
    assert out["messages"][-1].content == "sorry, retrying is pointless"
    second = backend.requests[1].messages
    assert second[1]["tool_calls"][0]["function"]["arguments"] == "not json at all"
    assert second[2]["role"] == "tool"
    assert second[2]["tool_call_id"] == "call_0"
    assert len(backend.requests) == 2


# ----------------------------------------------------------------- streaming


async def test_astream_text_tool_chunks_and_last_chunk() -> None:
    backend = ScriptedBackend(
        lambda r: Reply(content="one two three", tool_calls=[("search", '{"query": "abc"}')])
    )
    llm, _ = make(backend)
    chunks = [c async for c in llm.bind_tools([search]).astream("q")]
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    assert [c.content for c in chunks[:3]] == ["one", " two", " three"]
    assert any(c.tool_call_chunks for c in chunks)
    last = chunks[-1]
    assert last.chunk_position == "last"
    assert last.usage_metadata == {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
    assert sum(1 for c in chunks if c.usage_metadata) == 1
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    assert isinstance(full, AIMessageChunk)
    assert full.content == "one two three"
    assert full.tool_calls[0]["args"] == {"query": "abc"}
    assert full.response_metadata["finish_reason"] == "tool_calls"
    (req,) = backend.requests
    assert req.stream is True
    assert req.params["stream_options"] == {"include_usage": True}


async def test_streaming_true_routes_invoke_through_stream() -> None:
    llm, backend = make(streaming=True)
    msg = await llm.ainvoke("hi")
    assert msg.content == "hello world"
    assert msg.usage_metadata is not None
    assert backend.requests[0].stream is True
    assert msg.response_metadata["model_name"] == "m"


async def test_stream_error_propagates() -> None:
    backend = ScriptedBackend(
        lambda r: Reply(
            content="partial answer", error=BackendBadRequestError("bad", status_code=400)
        )
    )
    llm, _ = make(backend)
    seen: list[str] = []

    async def consume() -> None:
        async for c in llm.astream("q"):
            seen.append(c.text)

    with pytest.raises(BackendBadRequestError, match="bad"):
        await consume()
    assert seen == ["partial", " answer"]


async def test_cancelling_the_stream_consumer_cancels_the_call() -> None:
    gate = asyncio.Event()
    backend = ScriptedBackend(lambda r: Reply(content="a b"), gate=gate)
    llm, _ = make(backend)
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in llm.astream("q"):
            first.set()

    task = asyncio.create_task(consume())
    await first.wait()
    await backend.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert backend.cancelled == 1
    assert backend.inflight == 0


async def test_closing_the_stream_early_cancels_the_call() -> None:
    gate = asyncio.Event()
    backend = ScriptedBackend(lambda r: Reply(content="a b c"), gate=gate)
    llm, _ = make(backend)
    stream = llm.astream("q")
    async for _ in stream:
        break
    await stream.aclose()  # type: ignore[attr-defined]
    # The inner generator is finalised by the loop's asyncgen hook: let it run.
    for _ in range(100):
        if backend.cancelled:
            break
        await asyncio.sleep(0)
    assert backend.cancelled == 1
    assert backend.inflight == 0


async def test_a_consumer_that_leaves_as_the_call_fails_leaves_no_unread_error() -> None:
    # Seen in the chaos suite: a sibling cancelled between two chunks while its call
    # failed left the call's task with an error nobody read ("Task exception was
    # never retrieved", which the test runner raises).
    error = BackendBadRequestError("bad", status_code=400)
    backend = ScriptedBackend(lambda r: Reply(content="a b c", error=error))
    llm, _ = make(backend)
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        stream = llm._stream_chunks([HumanMessage("q")], None, {})
        await anext(stream)
        for _ in range(100):  # the call goes on and fails meanwhile
            await asyncio.sleep(0)
            if not backend.inflight:
                break
        await asyncio.sleep(0)
        await stream.aclose()  # type: ignore[attr-defined]
        del stream
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert [c["message"] for c in reported] == []


# ----------------------------------------------------------------- concurrency


async def test_concurrent_calls_respect_max_inflight() -> None:
    gate = asyncio.Event()
    backend = ScriptedBackend(gate=gate, base_url=f"fake://{uuid.uuid4().hex}")
    llm = BatchedChatModel(model="m", backend=backend, max_inflight=2)
    tasks = [asyncio.create_task(llm.ainvoke(f"q{i}")) for i in range(6)]
    await backend.started.wait()
    for _ in range(50):  # let the scheduler try to admit more
        await asyncio.sleep(0)
    assert backend.inflight == 2
    gate.set()
    results = await asyncio.gather(*tasks)
    assert len(results) == 6
    assert backend.peak == 2
    assert len(backend.requests) == 6


async def test_langgraph_messages_stream_mode_gets_tokens() -> None:
    """stream_mode="messages" routes invoke to _astream with run_manager=None."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    llm, backend = make()

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState).add_node("agent", agent)
    graph.add_edge(START, "agent").add_edge("agent", END)
    tokens = [
        msg.text
        async for msg, _meta in graph.compile().astream(
            {"messages": [HumanMessage("hi")]}, stream_mode="messages"
        )
    ]
    assert "".join(tokens) == "hello world"
    assert len(tokens) >= 3
    assert backend.requests[0].stream is True


def test_stream_chunk_timeout_default_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert BatchedChatModel(model="x").stream_chunk_timeout == 120.0
    monkeypatch.setenv("LGB_STREAM_CHUNK_TIMEOUT_S", "7.5")
    assert BatchedChatModel(model="x").stream_chunk_timeout == 7.5
    monkeypatch.setenv("LGB_STREAM_CHUNK_TIMEOUT_S", "0")
    assert BatchedChatModel(model="x").stream_chunk_timeout is None
    assert BatchedChatModel(model="x", stream_chunk_timeout=3).stream_chunk_timeout == 3
    monkeypatch.setenv("LGB_STREAM_CHUNK_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="LGB_STREAM_CHUNK_TIMEOUT_S"):
        BatchedChatModel(model="x")
