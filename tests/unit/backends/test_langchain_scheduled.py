"""Degraded mode end to end: BatchedChatModel(backend=LangChainBackend(fake)) in graphs.

The fake stands in for a cloud model: it answers like a tool-calling agent and
raises the openai SDK's 429 on some calls. The scheduler must retry those
(honouring Retry-After), shrink its in-flight limit, keep results in order, and
the tool hooks must still coalesce identical tool calls.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import tools_condition
from pydantic import BaseModel
from typing_extensions import TypedDict

from langgraph_batch import (
    BatchedChatModel,
    BatchMiddleware,
    BatchPolicy,
    RetryPolicy,
    fan_out,
)
from langgraph_batch.backends import LangChainBackend
from langgraph_batch.tools import BatchToolNode, coalesce
from tests.fakes.chat_models import ProviderFake, rate_limit_error, reply

CITIES = ["paris", "tokyo", "lima"]


class Agent:
    """A tool-calling provider fake whose first `fail_first` calls get a 429."""

    def __init__(self, *, fail_first: int = 0) -> None:
        self.fail_first = fail_first
        self.attempts = 0
        self.tool_names: set[str] = set()
        self.model = ProviderFake(script=self.answer)

    def answer(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> Any:
        self.attempts += 1
        if self.attempts <= self.fail_first:
            return rate_limit_error("1")
        self.tool_names.update(t["function"]["name"] for t in kwargs.get("tools") or ())
        last = messages[-1]
        if isinstance(last, ToolMessage):
            return reply(f"final:{last.content}", stop_reason="end_turn")
        human = next(m for m in messages if isinstance(m, HumanMessage))
        match = re.search(r"city=(\w+)", str(human.content))
        assert match is not None, human.content
        return reply(tool_calls=[("weather", {"city": match.group(1)})], stop_reason="tool_use")


class Weather:
    def __init__(self) -> None:
        self.executions: Counter[str] = Counter()

        @tool
        async def weather(city: str) -> str:
            """Weather for a city."""
            self.executions[city] += 1
            await asyncio.sleep(0)
            return f"sunny in {city}"

        self.tool = coalesce(weather)


def batched(agent: Agent, **kw: Any) -> BatchedChatModel:
    kw.setdefault(
        "policy", BatchPolicy(inflight_limit=4, retry=RetryPolicy(initial_interval=0.005))
    )
    return BatchedChatModel(
        model="label", backend=LangChainBackend(agent.model), max_retries=5, **kw
    )


class SiblingState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class Parent(TypedDict, total=False):
    cities: list[str]
    answers: list[Any]


def react_agent(llm: BatchedChatModel, weather: Any) -> Any:
    bound = llm.bind_tools([weather])

    async def model(state: SiblingState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    builder = StateGraph(SiblingState)
    builder.add_node("model", model)
    builder.add_node("tools", BatchToolNode([weather]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "model")
    return builder.compile()


def parent(subgraph: Any) -> Any:
    builder = StateGraph(Parent)
    builder.add_node(
        "fan",
        fan_out(
            subgraph,
            items="cities",
            into="answers",
            make_input=lambda city, i: {"messages": [HumanMessage(f"sibling {i}: city={city}")]},
            result=lambda final: final["messages"][-1].content,
        ),
    )
    builder.add_edge(START, "fan")
    return builder.compile()


async def test_fan_out_over_a_rate_limited_langchain_model() -> None:
    agent = Agent(fail_first=4)
    weather = Weather()
    llm = batched(agent)
    n = 12
    cities = [CITIES[i % 3] for i in range(n)]

    out = await parent(react_agent(llm, weather.tool)).ainvoke({"cities": cities})

    assert out["answers"] == [f"final:sunny in {c}" for c in cities]  # correct, in input order
    stats = llm.get_scheduler().stats()
    assert stats.retries == 4  # every 429 retried by the scheduler
    assert stats.failed == 0
    assert stats.completed == 2 * n
    assert agent.attempts == 2 * n + 4
    assert agent.tool_names == {"weather"}  # the tools reached the wrapped model
    assert sum(weather.executions.values()) == 3  # coalesced: one execution per distinct city
    assert stats.prompt_tokens == 11 * 2 * n  # usage_metadata reached the scheduler
    assert stats.cached_tokens == 4 * 2 * n


async def test_create_agent_with_batch_middleware_over_a_langchain_model() -> None:
    agent = Agent(fail_first=2)
    weather = Weather()
    llm = batched(agent)
    graph = create_agent(llm, [weather.tool], middleware=[BatchMiddleware()])
    out = await parent(graph).ainvoke({"cities": CITIES * 2})
    assert out["answers"] == [f"final:sunny in {c}" for c in CITIES * 2]
    assert sum(weather.executions.values()) == 3
    assert llm.get_scheduler().stats().retries == 2


async def test_a_429_shrinks_the_in_flight_limit() -> None:
    agent = Agent(fail_first=1)
    llm = batched(agent)
    msg = await llm.ainvoke("city=oslo")
    assert isinstance(msg, AIMessage)
    assert msg.tool_calls[0]["args"] == {"city": "oslo"}
    stats = llm.get_scheduler().stats()
    assert stats.retries == 1
    assert stats.inflight_limit < 4  # AIMD: lowered by the 429, as over HTTP


async def test_out_of_retries_the_caller_gets_the_typed_error() -> None:
    from langgraph_batch.errors import BackendRateLimitError

    agent = Agent(fail_first=100)
    llm = BatchedChatModel(
        model="label",
        backend=LangChainBackend(agent.model),
        max_retries=1,
        policy=BatchPolicy(retry=RetryPolicy(initial_interval=0.001)),
    )
    with pytest.raises(BackendRateLimitError) as info:
        await llm.ainvoke("city=oslo")
    assert info.value.retry_after_s == 0.001
    assert agent.attempts == 2


async def test_streaming_through_the_scheduler_reports_each_token_once() -> None:
    agent = Agent()
    agent.model.script = lambda m, k: reply("alpha beta gamma")
    llm = batched(agent)

    class State(TypedDict):
        messages: Annotated[list[AnyMessage], add_messages]

    async def node(state: State) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    builder = StateGraph(State)
    builder.add_node("model", node)
    builder.add_edge(START, "model")
    graph = builder.compile()
    tokens: list[str] = []
    async for message, _meta in graph.astream(
        {"messages": [HumanMessage("hi")]}, stream_mode="messages"
    ):
        tokens.append(str(message.content))
    # Only BatchedChatModel's run streams: the wrapped model's inner run does not echo it.
    assert "".join(tokens) == "alpha beta gamma"
    chunks = [c async for c in llm.astream("hi")]
    assert "".join(str(c.content) for c in chunks) == "alpha beta gamma"
    assert chunks[-1].usage_metadata is not None
    assert chunks[-1].usage_metadata["input_token_details"] == {"cache_read": 4}


class Verdict(BaseModel):
    label: str
    score: float


async def test_structured_output_through_the_scheduler() -> None:
    agent = Agent()

    def script(messages: list[BaseMessage], kwargs: dict[str, Any]) -> AIMessage:
        (schema_tool,) = kwargs["tools"]
        return reply(tool_calls=[(schema_tool["function"]["name"], {"label": "ok", "score": 1})])

    agent.model.script = script
    llm = batched(agent)
    for method in ("json_schema", "function_calling"):
        verdict = await llm.with_structured_output(Verdict, method=method).ainvoke("judge")
        assert verdict == Verdict(label="ok", score=1.0), method
