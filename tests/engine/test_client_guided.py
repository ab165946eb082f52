"""Guided decoding through BatchedChatModel on the real engine: schemas and forced tools.

Random weights follow a grammar and nothing else, so what these tests see is
vLLM's enforcement (xgrammar) and the client's handling of it: schemas whose
values come from enums (a random model never closes a free string or number
soon), sampled with a seed per call (the same noise every run).

vLLM 0.32 with a tool parser forces a named or `"required"` `tool_choice` on
the call's envelope only; the arguments follow the tool's schema only when the
tool is `strict` (`--tool-strict-level auto`). The vLLM backend therefore sends
forced tools as strict unless the caller said `strict=False`: both cases are
here, the second with its typed error.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from pydantic import BaseModel

from benchmarks.vllm_cpu import VLLMCPUServer
from langgraph_batch import BatchedChatModel
from langgraph_batch.errors import MalformedToolCallError
from tests.engine._client import vllm_url
from tests.faultproxy import FaultProxy

SEEDS = range(4)


class Ticket(BaseModel):
    """A triaged ticket."""

    kind: Literal["bug", "feature", "question"]
    urgent: bool
    team: Literal["core", "docs"]


@tool
def weather(city: Literal["paris", "rome", "oslo"], unit: Literal["c", "f"] = "c") -> str:
    """Today's weather in a city."""
    return f"sunny in {city}"


@tool
def search(topic: Literal["kv", "batching"]) -> str:
    """Search the docs."""
    return f"docs about {topic}"


def model(server: VLLMCPUServer, **kw: Any) -> BatchedChatModel:
    """A sampling model of the engine (temperature 1, a seed per call)."""
    kw.setdefault("max_tokens", 400)
    kw.setdefault("base_url", vllm_url(server))
    return BatchedChatModel(model=server.model, temperature=1.0, **kw)


def check_calls(msg: AIMessage, names: set[str], *, one: bool) -> None:
    """The message's tool calls (exactly one when `one`), checked against the tools' enums."""
    assert msg.invalid_tool_calls == []
    assert msg.tool_calls
    if one:
        assert len(msg.tool_calls) == 1
    for call in msg.tool_calls:
        assert call["name"] in names
        args = call["args"]
        if call["name"] == "weather":
            assert args["city"] in {"paris", "rome", "oslo"}
            assert set(args) <= {"city", "unit"}
            assert args.get("unit", "c") in {"c", "f"}
        else:
            assert args == {"topic": args["topic"]}
            assert args["topic"] in {"kv", "batching"}


async def test_structured_output_is_a_valid_object(engine: VLLMCPUServer) -> None:
    llm = model(engine)
    structured = llm.with_structured_output(Ticket, include_raw=True)
    seen: set[tuple[str, bool, str]] = set()
    for seed in SEEDS:
        out = await structured.ainvoke("Triage: the cache leaks.", seed=seed)
        assert out["parsing_error"] is None
        ticket = out["parsed"]
        assert isinstance(ticket, Ticket)
        assert out["raw"].response_metadata["finish_reason"] == "stop"
        seen.add((ticket.kind, ticket.urgent, ticket.team))
    assert len(seen) > 1  # the values are sampled, not a fixed default
    # A JSON-schema dict gives a dict with exactly the schema's keys.
    schema = {
        "title": "verdict",
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "level": {"enum": [1, 2, 3]}},
        "required": ["ok", "level"],
        "additionalProperties": False,
    }
    verdict = await llm.with_structured_output(schema).ainvoke("Judge it.", seed=1)
    assert set(verdict) == {"ok", "level"}
    assert isinstance(verdict["ok"], bool)
    assert verdict["level"] in {1, 2, 3}
    await llm.get_scheduler().aclose()


async def test_forced_tool_choice_gives_a_call_whose_args_follow_the_schema(
    engine: VLLMCPUServer,
) -> None:
    async with FaultProxy(engine.url) as proxy:
        llm = model(engine, base_url=proxy.url.replace("http://", "vllm://"))
        named = llm.bind_tools([weather, search], tool_choice="weather")
        required = llm.bind_tools([weather, search], tool_choice="any")
        for seed in SEEDS:
            check_calls(await named.ainvoke("Weather?", seed=seed), {"weather"}, one=True)
            # "required" lets vLLM emit parallel calls: each must be valid.
            msg = await required.ainvoke("Anything.", seed=seed)
            check_calls(msg, {"weather", "search"}, one=False)
        bodies = [json.loads(s.body) for s in proxy.seen if s.path == "/v1/chat/completions"]
    # The client marked the tools the choice may call strict, schemas unchanged.
    first = bodies[0]
    assert first["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    strict = {t["function"]["name"]: t["function"].get("strict") for t in first["tools"]}
    assert strict == {"weather": True, "search": None}
    assert first["tools"][0]["function"]["parameters"]["required"] == ["city"]
    assert all(t["function"]["strict"] is True for t in bodies[1]["tools"])
    await llm.get_scheduler().aclose()


async def test_forced_tool_without_strict_fails_with_a_typed_error(engine: VLLMCPUServer) -> None:
    # strict=False is the caller's word: vLLM then pins only the envelope, and the
    # random model writes some JSON value (or runs out of tokens inside it).
    llm = model(engine, max_tokens=60, max_retries=1)
    loose = llm.bind_tools([weather], tool_choice="weather", strict=False)
    with pytest.raises(MalformedToolCallError) as caught:
        await loose.ainvoke("Weather?", seed=0)
    err = caught.value
    assert err.tool_name == "weather"
    assert err.attempts == 2  # the first answer and its one retry were both malformed
    no_call = err.reason == "no tool call although tool_choice forced one"
    assert no_call or err.reason.endswith("not an object"), err.reason
    assert err.request_id
    assert err.request_id.startswith("lgb-")
    stats = llm.get_scheduler().stats()
    assert stats.malformed_tool_calls >= 2
    # With invalid_tool_calls="return" the same answer comes back for the graph to handle.
    lenient = model(engine, max_tokens=60, invalid_tool_calls="return")
    msg = await lenient.bind_tools([weather], tool_choice="weather", strict=False).ainvoke(
        "Weather?", seed=0
    )
    assert not msg.tool_calls
    await llm.get_scheduler().aclose()
