"""A sibling that fails against a real server is reported, logged and isolated.

The emulator refuses one sibling's prompt (longer than its `max_model_len`);
that sibling becomes a `SiblingError` in its place, a WARNING names its index
and error type, the others answer, and nothing in the logs quotes the
prompt or the API key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.nodes import SiblingError, fan_out

API_KEY = "sk-test-do-not-log-7f3a9c"


class Parent(TypedDict, total=False):
    docs: list[str]
    out: list[Any]


def sibling_graph(llm: BatchedChatModel) -> Any:
    async def model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    b = StateGraph(MessagesState)
    b.add_node("model", model)
    b.add_edge(START, "model")
    return b.compile()


async def test_a_refused_sibling_is_logged_by_index_and_type_only(
    start_emulator: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    url = await asyncio.to_thread(
        start_emulator, scenario="echo", profile="zero", max_model_len=400
    )
    llm = BatchedChatModel(
        model="emulated-llama-3-8b",
        base_url=url.replace("http://", "vllm://"),
        api_key=API_KEY,
        max_tokens=8,
        max_retries=0,
    )
    secret_doc = "classified " * 600  # far over 400 tokens
    docs = ["short one", "short two", secret_doc, "short four"]
    b = StateGraph(Parent)
    b.add_node(
        "fan",
        fan_out(
            sibling_graph(llm),
            items="docs",
            into="out",
            # A conversation with an earlier turn: never HTTP-batched, so one bad
            # prompt cannot take batch-mates with it (that is the batching
            # layer's own concern, tested there).
            make_input=lambda doc, i: {
                "messages": [HumanMessage("hi"), AIMessage("hello"), HumanMessage(doc)]
            },
            result=lambda final: final["messages"][-1].content,
        ),
    )
    b.add_edge(START, "fan")
    with caplog.at_level(logging.DEBUG, logger="langgraph_batch"):
        out = (await b.compile().ainvoke({"docs": docs}))["out"]
        await llm.get_scheduler().aclose()
    assert [isinstance(r, SiblingError) for r in out] == [False, False, True, False]
    err = out[2]
    assert err.index == 2
    assert not err.retryable
    warnings = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name == "langgraph_batch.nodes.fan_out"
    ]
    assert len(warnings) == 1
    assert warnings[0].lgb_index == 2  # type: ignore[attr-defined]
    assert err.error_type in warnings[0].getMessage()
    for record in caplog.records:
        text = record.getMessage() + str(record.__dict__)
        assert API_KEY not in text
        assert "classified classified" not in text
