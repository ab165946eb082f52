"""LangChainBackend on its own: request conversion, streaming, structured output, keys."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.tool import invalid_tool_call
from pydantic import Field, SecretStr

from langgraph_batch.backends import LangChainBackend
from langgraph_batch.backends._langchain_convert import openai_to_messages
from langgraph_batch.backends.base import ChatChunk, ChatRequest
from langgraph_batch.chat_model._convert import messages_to_openai
from langgraph_batch.errors import BackendBadRequestError, BackendError, BackendTimeoutError
from tests.fakes.chat_models import ProviderFake, reply

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
VERDICT_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "Verdict",
        "schema": {
            "type": "object",
            "properties": {"label": {"type": "string"}, "score": {"type": "number"}},
            "required": ["label", "score"],
        },
    },
}


def request(
    messages: list[dict[str, Any]] | None = None, *, stream: bool = False, **params: Any
) -> ChatRequest:
    return ChatRequest(
        model="label-only",
        messages=messages or [{"role": "user", "content": "hi"}],
        params=params,
        stream=stream,
        request_id="lgb-test-1",
    )


def test_openai_messages_round_trip_to_langchain() -> None:
    original: list[BaseMessage] = [
        SystemMessage("be brief"),
        HumanMessage("weather in paris?", name="ann"),
        AIMessage(
            content="",
            tool_calls=[{"name": "weather", "args": {"city": "paris"}, "id": "c1"}],
            invalid_tool_calls=[invalid_tool_call(name="weather", args="{bad", id="c2")],
        ),
        ToolMessage("sunny", tool_call_id="c1"),
        AIMessage("It is sunny."),
    ]
    back = openai_to_messages(messages_to_openai(original))
    assert [type(m) for m in back] == [type(m) for m in original]
    assert back[1].content == "weather in paris?"
    assert back[1].name == "ann"
    ai = back[2]
    assert isinstance(ai, AIMessage)
    assert ai.tool_calls == [
        {"name": "weather", "args": {"city": "paris"}, "id": "c1", "type": "tool_call"}
    ]
    assert ai.invalid_tool_calls[0]["args"] == "{bad"
    assert ai.invalid_tool_calls[0]["id"] == "c2"
    tool = back[3]
    assert isinstance(tool, ToolMessage)
    assert (tool.tool_call_id, tool.content) == ("c1", "sunny")
    (dev,) = openai_to_messages([{"role": "developer", "content": "rules"}])
    assert isinstance(dev, SystemMessage)
    assert dev.additional_kwargs["__openai_role__"] == "developer"
    with pytest.raises(BackendBadRequestError, match="without a role"):
        openai_to_messages([{"content": "x"}])


async def test_text_answer_usage_metadata_and_finish_reason() -> None:
    fake = ProviderFake(script=lambda m, k: reply("hello there", stop_reason="end_turn"))
    backend = LangChainBackend(fake)
    resp = await backend.chat(
        request(
            [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
            max_tokens=32,
            temperature=0.2,
            stop=["\n\n"],
            stream_options={"include_usage": True},
            seed=7,
        )
    )
    assert resp.content == "hello there"
    assert resp.tool_calls == ()
    assert resp.finish_reason == "stop"  # Anthropic's end_turn
    assert resp.model == "fake-model-2025"  # from response_metadata
    assert resp.id == "msg_123"
    assert resp.request_id == "lgb-test-1"
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (11, 5)
    assert resp.usage.cached_tokens == 4  # input_token_details.cache_read
    (call,) = fake.calls
    assert [type(m) for m in call["messages"]] == [SystemMessage, HumanMessage]
    assert call["stop"] == ["\n\n"]
    # Sampling parameters reach the model as call kwargs; wire-only fields do not.
    assert (call["max_tokens"], call["temperature"], call["seed"]) == (32, 0.2, 7)
    assert "stream_options" not in call
    assert "tools" not in call


@pytest.mark.parametrize(
    ("wire_choice", "bound_choice"),
    [
        ("required", "any"),
        ("auto", "auto"),
        ({"type": "function", "function": {"name": "weather"}}, "weather"),
        (None, None),
    ],
)
async def test_tools_bound_with_the_models_own_bind_tools(
    wire_choice: Any, bound_choice: Any
) -> None:
    fake = ProviderFake(
        script=lambda m, k: reply(
            tool_calls=[("weather", {"city": "lima"})], stop_reason="tool_use"
        )
    )
    params: dict[str, Any] = {"tools": [WEATHER], "parallel_tool_calls": False}
    if wire_choice is not None:
        params["tool_choice"] = wire_choice
    resp = await LangChainBackend(fake).chat(request(**params))
    (call,) = fake.calls
    assert call["tools"] == [WEATHER]
    assert call["tool_choice"] == bound_choice
    assert call["parallel_tool_calls"] is False
    (tc,) = resp.tool_calls
    assert (tc.id, tc.name, json.loads(tc.arguments)) == ("toolu_0", "weather", {"city": "lima"})
    assert resp.finish_reason == "tool_calls"


async def test_streaming_renumbers_tool_fragments_and_ends_with_usage() -> None:
    fake = ProviderFake(
        script=lambda m, k: reply(
            "let me check",
            tool_calls=[("weather", {"city": "paris"}), ("weather", {"city": "oslo"})],
        ),
        stream_index_offset=1,  # as Anthropic numbers content blocks
    )
    chunks: list[ChatChunk] = []
    resp = await LangChainBackend(fake).chat(
        request(stream=True, tools=[WEATHER]), on_chunk=chunks.append
    )
    text = "".join(c.content for c in chunks)
    assert text == "let me check"
    fragments = [f for c in chunks for f in c.tool_call_chunks]
    assert sorted({f.index for f in fragments}) == [0, 1]
    firsts = [f for f in fragments if f.id is not None]
    assert [(f.index, f.id, f.name) for f in firsts] == [
        (0, "toolu_0", "weather"),
        (1, "toolu_1", "weather"),
    ]
    assert all(f.name is None for f in fragments if f.id is None)  # names once per call
    args = {i: "".join(f.arguments or "" for f in fragments if f.index == i) for i in (0, 1)}
    assert json.loads(args[0]) == {"city": "paris"}
    assert json.loads(args[1]) == {"city": "oslo"}
    last = chunks[-1]
    assert last.usage is not None
    assert last.usage.cached_tokens == 4
    assert last.finish_reason == "tool_calls"
    assert [json.loads(c.arguments)["city"] for c in resp.tool_calls] == ["paris", "oslo"]
    assert resp.content == "let me check"
    assert resp.usage == last.usage


async def test_structured_output_by_forced_tool_for_models_without_response_format() -> None:
    def script(messages: list[BaseMessage], kwargs: dict[str, Any]) -> AIMessage:
        assert kwargs["tool_choice"] == "Verdict"
        (tool,) = kwargs["tools"]
        assert tool["function"]["parameters"] == VERDICT_FORMAT["json_schema"]["schema"]
        return reply(tool_calls=[("Verdict", {"label": "ok", "score": 0.5})])

    fake = ProviderFake(script=script)
    backend = LangChainBackend(fake)
    resp = await backend.chat(request(response_format=VERDICT_FORMAT))
    assert json.loads(resp.content or "") == {"label": "ok", "score": 0.5}
    assert resp.tool_calls == ()
    assert resp.finish_reason == "stop"
    assert "response_format" not in fake.calls[0]
    # Streamed, the structured answer comes whole, then the usage chunk.
    chunks: list[ChatChunk] = []
    resp = await backend.chat(
        request(stream=True, response_format=VERDICT_FORMAT), on_chunk=chunks.append
    )
    assert json.loads(chunks[0].content) == {"label": "ok", "score": 0.5}
    assert chunks[-1].usage is not None


async def test_response_format_passes_through_when_asked() -> None:
    fake = ProviderFake(script=lambda m, k: reply('{"label": "x", "score": 1}'))
    backend = LangChainBackend(fake, pass_response_format=True)
    resp = await backend.chat(request(response_format=VERDICT_FORMAT, tools=[WEATHER]))
    assert fake.calls[0]["response_format"] == VERDICT_FORMAT
    assert fake.calls[0]["tools"] == [WEATHER]
    assert json.loads(resp.content or "")["label"] == "x"


@pytest.mark.parametrize(
    "params",
    [
        {"response_format": {"type": "json_object"}},
        {"response_format": VERDICT_FORMAT, "tools": [WEATHER]},
    ],
)
async def test_unsupported_structured_requests_fail_clearly(params: dict[str, Any]) -> None:
    fake = ProviderFake(script=lambda m, k: reply("x"))
    with pytest.raises(BackendBadRequestError, match="function_calling") as info:
        await LangChainBackend(fake).chat(request(**params))
    assert not info.value.is_retryable
    assert fake.calls == []


async def test_model_without_tool_support_is_a_bad_request() -> None:
    from langchain_core.language_models import GenericFakeChatModel

    fake = GenericFakeChatModel(messages=iter([AIMessage("x")]))
    with pytest.raises(BackendBadRequestError, match="bind_tools"):
        await LangChainBackend(fake).chat(request(tools=[WEATHER]))


async def test_generic_fake_chat_model_streams_through() -> None:
    from langchain_core.language_models import GenericFakeChatModel

    fake = GenericFakeChatModel(messages=iter([AIMessage("one two three")]))
    chunks: list[ChatChunk] = []
    resp = await LangChainBackend(fake).chat(request(stream=True), on_chunk=chunks.append)
    assert "".join(c.content for c in chunks) == "one two three"
    assert len([c for c in chunks if c.content]) > 1
    assert resp.content == "one two three"
    assert resp.usage is None  # the fake reports none


async def test_timeout_is_a_backend_timeout() -> None:
    never = asyncio.Event()

    class Slow(ProviderFake):
        async def _agenerate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> Any:
            await never.wait()

    backend = LangChainBackend(Slow(script=None), timeout=0.01)
    with pytest.raises(BackendTimeoutError, match=r"within 0\.01 s") as info:
        await backend.chat(request())
    assert info.value.is_retryable
    with pytest.raises(ValueError, match="timeout"):
        LangChainBackend(ProviderFake(script=None), timeout=0)


def test_key_separates_credentials_and_never_shows_them() -> None:
    secret_a, secret_b = "sk-live-AAAA1111secret", "sk-live-BBBB2222secret"
    a1 = LangChainBackend(ProviderFake(script=None, api_key=SecretStr(secret_a)))
    a2 = LangChainBackend(ProviderFake(script=None, api_key=SecretStr(secret_a)))
    b = LangChainBackend(ProviderFake(script=None, api_key=SecretStr(secret_b)))
    other_url = LangChainBackend(
        ProviderFake(script=None, api_key=SecretStr(secret_a), base_url="https://eu.example.test")
    )
    warmer = LangChainBackend(
        ProviderFake(script=None, api_key=SecretStr(secret_a), temperature=0.9)
    )
    assert a1.key == a2.key  # same configuration: one scheduler
    assert len({a1.key, b.key, other_url.key, warmer.key}) == 4
    assert a1.key.startswith("LangChainBackend:ProviderFake:fake-model:")
    for backend in (a1, b):
        for text in (backend.key, repr(backend)):
            for secret in (secret_a, secret_b):
                assert secret not in text
                assert secret[-8:] not in text
    assert LangChainBackend(ProviderFake(script=None), key="team-a").key.endswith(":team-a")
    assert "fake-model" in repr(a1)


def test_rejects_what_is_not_a_chat_model() -> None:
    fake = ProviderFake(script=None)
    with pytest.raises(TypeError, match="BaseChatModel"):
        LangChainBackend(fake.bind_tools([WEATHER]))  # type: ignore[arg-type]


def test_warns_when_the_wrapped_model_retries_itself(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="langgraph_batch.backends.langchain"):
        LangChainBackend(ProviderFake(script=None, max_retries=0))
        assert not caplog.records
        LangChainBackend(ProviderFake(script=None, max_retries=2))
    (record,) = caplog.records
    assert "max_retries=2" in record.getMessage()


async def test_capabilities_and_models() -> None:
    backend = LangChainBackend(ProviderFake(script=None))
    caps = backend.capabilities
    assert (caps.priority, caps.metrics, caps.batch_completions) == (False, False, False)
    assert [m.id for m in await backend.models()] == ["fake-model"]
    assert await backend.metrics() is None
    async with backend:
        pass  # aclose leaves the wrapped model alone


def test_exported_from_backends() -> None:
    from langgraph_batch import backends

    assert "LangChainBackend" in backends.__all__
    assert backends.LangChainBackend is LangChainBackend


class LoopBound(ProviderFake):
    """Like a provider SDK's pooled HTTP client: usable only from the loop that first used it."""

    loops: list[Any] = Field(default_factory=list, exclude=True)

    async def _agenerate(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> Any:
        loop = asyncio.get_running_loop()
        if self.loops and loop is not self.loops[0]:
            raise RuntimeError("<Event> is bound to a different event loop")
        self.loops.append(loop)
        return await super()._agenerate(messages, stop, run_manager, **kw)


def test_calls_from_several_event_loops_share_one_home_loop() -> None:
    # Each asyncio.run is a new loop (so are BatchedChatModel's sync calls, on
    # the background loop): by default the wrapped model only ever sees one.
    fake = LoopBound(script=lambda m, k: reply("hi"))
    backend = LangChainBackend(fake)
    for _ in range(3):
        assert asyncio.run(backend.chat(request())).content == "hi"
    assert len(fake.loops) == 3
    assert len(set(map(id, fake.loops))) == 1

    chunks: list[ChatChunk] = []

    async def streamed() -> str | None:
        resp = await backend.chat(request(stream=True), on_chunk=chunks.append)
        return resp.content

    fake.script = lambda m, k: reply("one two three")
    assert asyncio.run(streamed()) == "one two three"
    assert "".join(c.content for c in chunks) == "one two three"  # relayed, in order

    # Without isolation the second loop breaks the model, as it would a real SDK.
    direct = LangChainBackend(LoopBound(script=lambda m, k: reply("hi")), isolate_loop=False)
    asyncio.run(direct.chat(request()))
    with pytest.raises(BackendError, match="different event loop"):
        asyncio.run(direct.chat(request()))


async def test_cancelling_the_caller_cancels_the_call_on_the_home_loop() -> None:
    started = threading.Event()
    cancelled = threading.Event()

    class Hanging(ProviderFake):
        async def _agenerate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> Any:
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    backend = LangChainBackend(Hanging(script=None))
    task = asyncio.create_task(backend.chat(request()))
    assert await asyncio.to_thread(started.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(cancelled.wait, 5)
