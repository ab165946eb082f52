"""Session keys and request ids on the wire to the real engine; token counts by `/tokenize`.

A recording proxy (`tests/faultproxy.py`) sits between the client and the
engine: the engine answers every request (vLLM accepts the session headers
and the body's `request_id`), and the proxy shows what was sent. Token counts
come from the engine's `/tokenize` with its chat template, and must equal the
`prompt_tokens` the engine reports for the same messages.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, TypedDict

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph

from benchmarks.vllm_cpu import VLLMCPUServer
from langgraph_batch import BatchedChatModel, fan_out
from langgraph_batch.backends.base import ChatRequest
from tests.engine._client import GREEDY_NOISE, vllm_url
from tests.faultproxy import FaultProxy

_KEY = re.compile(r"^[0-9a-f]{32}$")


class Sib(TypedDict, total=False):
    topic: str
    turns: list[str]


class Parent(TypedDict, total=False):
    topics: list[str]
    out: list[Any]


async def test_each_sibling_carries_one_opaque_session_key_across_its_turns(
    engine: VLLMCPUServer,
) -> None:
    async with FaultProxy(engine.url) as proxy:
        llm = BatchedChatModel(
            model=engine.model,
            base_url=proxy.url.replace("http://", "vllm://"),
            max_tokens=3,
            **GREEDY_NOISE,
        )

        async def talk(state: Sib) -> Sib:
            first = await llm.ainvoke([HumanMessage(f"About {state['topic']}")])
            again = [HumanMessage(f"About {state['topic']}"), first, HumanMessage("More.")]
            second = await llm.ainvoke(again)
            return {"turns": [str(first.content), str(second.content)]}

        sib = StateGraph(Sib)
        sib.add_node("talk", talk)
        sib.add_edge(START, "talk")
        parent = StateGraph(Parent)
        parent.add_node(
            "fan",
            fan_out(
                sib.compile(), items="topics", into="out", make_input=lambda t, i: {"topic": t}
            ),
        )
        parent.add_edge(START, "fan")
        topics = ["kv caches", "schedulers", "tokenizers"]
        out = (await parent.compile().ainvoke({"topics": topics}))["out"]
        seen = [s for s in proxy.seen if s.path.startswith("/v1/chat/completions")]
    assert [len(o["turns"]) for o in out] == [2, 2, 2]
    keys_of: dict[str, set[str]] = {}
    for s in seen:
        body = json.loads(s.body)
        key = s.headers["x-session-id"]
        assert _KEY.match(key)  # opaque: 128 bits of an HMAC, no content
        assert s.headers["x-smg-routing-key"] == key
        assert s.headers["x-request-id"] == body["request_id"]
        # lgb-<run>-<index>-t<turn>-<nonce>: the sibling that sent it (a batched call:
        # its first member's, whose key the call carries).
        sibling = body["request_id"].split("-")[2]
        keys_of.setdefault(sibling, set()).add(key)
    assert sorted(keys_of) == ["0", "1", "2"]
    assert all(len(keys) == 1 for keys in keys_of.values())  # one key per sibling...
    assert len(set().union(*keys_of.values())) == 3  # ...and a different one for each
    second_turns = [s for s in seen if len(json.loads(s.body).get("messages", [])) == 3]
    assert len(second_turns) == 3  # each sibling's second turn went out on its own
    await llm.get_scheduler().aclose()


@tool
def weather(city: Literal["paris", "rome"]) -> str:
    """Today's weather in a city."""
    return f"sunny in {city}"


def test_token_counts_equal_the_engines_prompt_tokens(engine: VLLMCPUServer) -> None:
    llm = BatchedChatModel(
        model=engine.model, base_url=vllm_url(engine), max_tokens=1, **GREEDY_NOISE
    )
    call = {"name": "weather", "args": {"city": "rome"}, "id": "call_1", "type": "tool_call"}
    conversations = [
        [HumanMessage("hi")],
        [
            SystemMessage("You answer about the weather."),
            HumanMessage("Weather in Rome?"),
            AIMessage("", tool_calls=[call]),
            ToolMessage("sunny in rome", tool_call_id="call_1"),
            HumanMessage("And tomorrow?"),
        ],
    ]
    for messages in conversations:
        for tools in (None, [weather]):
            counted = llm.get_num_tokens_from_messages(messages, tools=tools)
            model = llm.bind_tools(tools) if tools else llm
            usage = model.invoke(messages).usage_metadata
            assert usage is not None
            assert usage["input_tokens"] == counted, (tools, messages)


async def test_a_text_count_equals_the_engines_count_of_that_raw_prompt(
    engine: VLLMCPUServer,
) -> None:
    # Counted without special tokens, as a raw prompt (no template) costs.
    llm = BatchedChatModel(model=engine.model, base_url=vllm_url(engine))
    text = "The scheduler keeps at most max_inflight requests on the wire."
    counted = await llm.aget_num_tokens(text)
    assert counted > 5
    scheduler = llm.get_scheduler()
    request = ChatRequest(model=engine.model, messages=(), params={"prompt": text, "max_tokens": 1})
    response = await scheduler.submit(request)
    assert response.usage is not None
    assert response.usage.prompt_tokens == counted
    await scheduler.aclose()
