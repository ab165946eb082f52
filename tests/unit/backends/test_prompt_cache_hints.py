"""Prompt-cache hints of `LangChainBackend`: Anthropic breakpoints, Bedrock, OpenAI keys, usage."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from langgraph_batch.backends import LangChainBackend
from langgraph_batch.backends._langchain_convert import usage_of
from langgraph_batch.backends._prompt_cache import (
    anthropic_breakpoints,
    cache_style,
    has_cache_control,
    openai_cache_key,
    ttl_for,
)
from langgraph_batch.backends.base import ChatRequest
from langgraph_batch.chat_model._convert import usage_to_metadata
from langgraph_batch.scheduler import BatchPolicy

anthropic = pytest.importorskip("langchain_anthropic")

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a key up.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}
SYSTEM = {"role": "system", "content": "rules " * 50}


def _claude() -> Any:
    return anthropic.ChatAnthropic(model="claude-sonnet-5", api_key="k", max_retries=0)


def _turn2() -> list[dict[str, Any]]:
    call = {"id": "t1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    return [
        SYSTEM,
        {"role": "user", "content": "task key=a"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "t1", "content": "42"},
    ]


def _payload(backend: LangChainBackend, req: ChatRequest) -> dict[str, Any]:
    """The body ChatAnthropic would send for the prepared call."""
    call = backend._prepare(req)
    bound: Any = call.runnable
    model = bound.bound if hasattr(bound, "bound") else bound
    extra = dict(getattr(bound, "kwargs", {}))
    return model._get_request_payload(call.messages, stop=call.stop, **extra, **call.kwargs)


def _marks(payload: dict[str, Any]) -> list[tuple[str, str]]:
    found = [
        ("tool", t["cache_control"]["ttl"])
        for t in payload.get("tools", [])
        if "cache_control" in t
    ]
    system = payload.get("system")
    if isinstance(system, list):
        found += [("system", b["cache_control"]["ttl"]) for b in system if "cache_control" in b]
    for m in payload["messages"]:
        if isinstance(m["content"], list):
            found += [
                (m["role"], b["cache_control"]["ttl"]) for b in m["content"] if "cache_control" in b
            ]
    return found


def test_claude_gets_a_prefix_and_a_history_breakpoint_that_moves_forward() -> None:
    backend = LangChainBackend(_claude())
    assert backend.capabilities.hosted_prompt_cache
    first = _payload(
        backend, ChatRequest(model="m", messages=_turn2()[:2], params={"tools": [TOOL]})
    )
    assert _marks(first) == [("system", "5m"), ("user", "5m")]
    second = _payload(backend, ChatRequest(model="m", messages=_turn2(), params={"tools": [TOOL]}))
    # The history breakpoint moved to the tool result (Anthropic's tool_result block).
    assert _marks(second) == [("system", "5m"), ("user", "5m")]
    assert second["messages"][-1]["content"][-1]["type"] == "tool_result"
    assert "cache_control" not in second["messages"][0]["content"][-1]


def test_without_a_system_message_the_last_tool_carries_the_prefix_breakpoint() -> None:
    backend = LangChainBackend(_claude())
    req = ChatRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], params={"tools": [TOOL]}
    )
    assert _marks(_payload(backend, req)) == [("tool", "5m"), ("user", "5m")]


def test_a_long_predicted_tool_wait_takes_the_one_hour_ttl() -> None:
    assert ttl_for(None) == "5m"
    assert ttl_for(60.0) == "5m"
    assert ttl_for(600.0) == "1h"
    backend = LangChainBackend(_claude())
    req = ChatRequest(model="m", messages=_turn2(), params={"tools": [TOOL]}, retention_s=900.0)
    assert _marks(_payload(backend, req)) == [("system", "1h"), ("user", "1h")]


def test_opt_out_and_callers_own_breakpoints() -> None:
    off = LangChainBackend(_claude(), prompt_caching=False)
    assert not off.capabilities.hosted_prompt_cache
    assert _marks(_payload(off, ChatRequest(model="m", messages=_turn2()))) == []
    own = [SystemMessage([{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}])]
    assert has_cache_control(own, None)
    msgs, tools = anthropic_breakpoints([HumanMessage("a"), AIMessage("b")], None, ttl="5m")
    assert tools is None
    assert msgs[1].content == "b"  # an assistant turn last: no history breakpoint
    with pytest.raises(ValueError, match="prompt_caching"):
        LangChainBackend(_claude(), prompt_caching="yes")  # type: ignore[arg-type]


def test_cache_style_by_model() -> None:
    from langchain_openai import ChatOpenAI

    assert cache_style(_claude()) == "anthropic"
    assert cache_style(ChatOpenAI(model="gpt-5", api_key="k")) == "openai"
    local = ChatOpenAI(model="m", api_key="k", base_url="http://127.0.0.1:8000/v1")
    assert cache_style(local) is None
    assert cache_style(local, mode=True) == "openai"
    assert cache_style(_claude(), mode=False) is None


def test_openai_models_get_a_prompt_cache_key_per_prefix_and_sibling_group() -> None:
    from langchain_openai import ChatOpenAI

    backend = LangChainBackend(ChatOpenAI(model="gpt-5", api_key="k", max_retries=0))
    assert not backend.capabilities.hosted_prompt_cache
    req = ChatRequest(
        model="m", messages=[SYSTEM, {"role": "user", "content": "a"}], route_key="sibling:r/3"
    )
    key = backend._prepare(req).kwargs["prompt_cache_key"]
    assert key == openai_cache_key(req.messages, None, "sibling:r/3")
    other = openai_cache_key([{"role": "system", "content": "other"}], None, "sibling:r/3")
    assert other != key
    mine = ChatRequest(model="m", messages=req.messages, params={"prompt_cache_key": "mine"})
    assert backend._prepare(mine).kwargs["prompt_cache_key"] == "mine"


def test_bedrock_converse_gets_cache_points(monkeypatch: pytest.MonkeyPatch) -> None:
    aws = pytest.importorskip("langchain_aws")
    # Static credentials: botocore must not look for them on the network.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    sent: list[dict[str, Any]] = []

    class FakeBedrock:
        def converse(self, **params: Any) -> dict[str, Any]:
            sent.append(params)
            return {
                "output": {"message": {"role": "assistant", "content": [{"text": "ok"}]}},
                "stopReason": "end_turn",
                "usage": {
                    "inputTokens": 5,
                    "outputTokens": 1,
                    "totalTokens": 2106,
                    "cacheReadInputTokens": 2000,
                    "cacheWriteInputTokens": 100,
                },
            }

    model = aws.ChatBedrockConverse(
        model="anthropic.claude-sonnet-4-5-20250929-v1:0",
        region_name="us-east-1",
        client=FakeBedrock(),
    )
    backend = LangChainBackend(model, isolate_loop=False)
    assert backend.capabilities.hosted_prompt_cache
    call = backend._prepare(ChatRequest(model="m", messages=_turn2(), params={"tools": [TOOL]}))
    assert call.kwargs["cache_control"] == {"type": "ephemeral", "ttl": "5m"}
    message = call.runnable.invoke(call.messages, **call.kwargs)
    body = sent[-1]
    assert any("cachePoint" in b for b in body["system"])
    assert any("cachePoint" in b for b in body["messages"][-1]["content"])
    usage = usage_of(message)
    assert usage is not None
    assert (usage.cached_tokens, usage.cache_creation_tokens) == (2000, 100)


def test_usage_reports_cache_reads_and_writes() -> None:
    message = AIMessage(
        "x",
        usage_metadata={
            "input_tokens": 2100,
            "output_tokens": 3,
            "total_tokens": 2103,
            "input_token_details": {
                "cache_read": 1000,
                "cache_creation": 0,
                "ephemeral_5m_input_tokens": 600,
                "ephemeral_1h_input_tokens": 400,
            },
        },
    )
    usage = usage_of(message)
    assert usage is not None
    assert (usage.cached_tokens, usage.cache_creation_tokens) == (1000, 1000)
    assert usage.cache_creation_1h_tokens == 400
    details = usage_to_metadata(usage)["input_token_details"]
    assert details == {
        "cache_read": 1000,
        "cache_creation": 1000,
        "ephemeral_1h_input_tokens": 400,
        "ephemeral_5m_input_tokens": 600,
    }


def test_hosted_caches_turn_prefix_warming_on() -> None:
    assert BatchPolicy().warms_prefixes("openai", hosted_prompt_cache=True)
    assert not BatchPolicy().warms_prefixes("openai")
    assert not BatchPolicy(prefix_warming="off").warms_prefixes("openai", hosted_prompt_cache=True)


def test_a_turn_longer_than_the_lookback_still_reads_the_previous_turn() -> None:
    from langgraph_batch.emulator._anthropic_api import parse
    from langgraph_batch.emulator._anthropic_cache import PromptCache

    backend = LangChainBackend(_claude())
    cache = PromptCache("claude-sonnet-5")
    system = {"role": "system", "content": "rules " * 1500}
    turn1 = [system, {"role": "user", "content": "task key=a"}]
    calls = [
        {"id": f"t{k}", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
        for k in range(12)
    ]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "", "tool_calls": calls},
        *({"role": "tool", "tool_call_id": f"t{k}", "content": str(k)} for k in range(12)),
    ]
    req1 = ChatRequest(model="m", messages=turn1, params={"tools": [TOOL]})
    first = cache.plan(parse(_payload(backend, req1)).blocks, now=0)
    cache.commit(first, now=1)
    payload = _payload(backend, ChatRequest(model="m", messages=turn2, params={"tools": [TOOL]}))
    assert len(_marks(payload)) == 3  # prefix, the previous turn's end, the last message
    second = cache.plan(parse(payload).blocks, now=2)
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
