"""Rate budgets against the emulator's provider-style limits: no 429s, makespan near the bound.

50 concurrent requests (the LLM calls of 50 fan_out siblings' first turn)
whose tokens exceed the emulator's per-minute budget several times over.
The minute is 60 / time_scale wall seconds (2 s here). Without pacing the
burst draws 429s and retries; with a budget, stated or learned from the
`x-ratelimit-*` headers, none, and the makespan stays near the bound
(tokens beyond the first full bucket / the refill rate). The same through
`fan_out` (50 siblings of two model calls each) and through
`LangChainBackend(ChatOpenAI(include_response_headers=True))`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from langchain_core.messages import AnyMessage, HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

from langgraph_batch._rate_budget import existing_pacer, forget_pacers
from langgraph_batch.backends import LangChainBackend, OpenAICompatibleBackend
from langgraph_batch.backends.base import ChatRequest
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.nodes import SiblingError, fan_out
from langgraph_batch.scheduler import BatchPolicy, RateLimitPolicy, RetryPolicy, Scheduler

pytestmark = pytest.mark.timeout(60)

SIBLINGS = 50
TPM = 1500
TIME_SCALE = 30.0  # a minute of 2 s (1 s drew a 429 or two on a loaded 2-core machine)
MINUTE_S = 60.0 / TIME_SCALE
MAX_TOKENS = 16
# The share of the limits the budgets use. It is also the budget's margin for
# requests that reach the server after the pacer let them go: a full bucket
# cannot bank the refill of that delay (docs/rate-limits.md). The default 0.95
# covers 3 s at a real 60 s minute but 0.1 s at this 2 s one, and a loaded
# 2-core machine delays requests more: run 3 at once, the fan_out test drew one
# 429 in 3 of 6 runs. 0.75 covers 0.5 s.
HEADROOM = 0.75
PATIENT = RetryPolicy(max_attempts=40, initial_interval=0.05, max_interval=1.0)


class Sibling(TypedDict):
    messages: list[AnyMessage]


class Parent(TypedDict, total=False):
    docs: list[str]
    answers: list[Any]


def _emulator(start: Callable[..., str]) -> str:
    return start(
        profile="zero",
        scenario="echo",
        time_scale=TIME_SCALE,
        rate_limit_rpm=6000,
        rate_limit_tpm=TPM,
    )


async def _fan_out(url: str, rate_limit: RateLimitPolicy) -> dict[str, Any]:
    forget_pacers()
    backend = OpenAICompatibleBackend(url)
    policy = BatchPolicy(rate_limit=rate_limit, retry=PATIENT)
    requests = [
        ChatRequest(
            model="emulated-llama-3-8b",
            messages=[{"role": "user", "content": f"sibling {i}: " + "summarise this. " * 25}],
            params={"max_tokens": MAX_TOKENS},
        )
        for i in range(SIBLINGS)
    ]
    async with Scheduler(backend, policy=policy, owns_backend=True) as scheduler:
        t0 = time.monotonic()
        responses = await asyncio.gather(*(scheduler.submit(r) for r in requests))
        makespan = time.monotonic() - t0
        waits = scheduler.stats().rate_waits
    tokens = sum(r.usage.total_tokens for r in responses if r.usage is not None)
    async with httpx.AsyncClient() as client:
        stats = (await client.get(url + "/emulator/stats")).json()
    return {
        "makespan_s": makespan,
        "tokens": tokens,
        "rate_limited": stats["rate_limited"],
        "rate_waits": waits,
        "bound_s": _bound(tokens),
    }


def _bound(tokens: float) -> float:
    """The makespan's bound: the budget's first full bucket at once, the rest at its rate."""
    budget = TPM * HEADROOM
    return max(0.0, tokens - budget) / (budget / MINUTE_S)


@pytest.fixture
def url(start_emulator: Callable[..., str]) -> str:
    return _emulator(start_emulator)


async def test_without_a_budget_the_burst_draws_429s(url: str) -> None:
    run = await _fan_out(url, RateLimitPolicy(follow_headers=False, probe=False))
    assert run["tokens"] > 3 * TPM  # demand is several minutes' budget
    assert run["rate_limited"] > 0
    assert run["rate_waits"] == 0


async def test_a_stated_budget_sends_no_request_the_server_refuses(url: str) -> None:
    run = await _fan_out(
        url, RateLimitPolicy(tokens_per_min=TPM, minute_s=MINUTE_S, headroom=HEADROOM)
    )
    assert run["rate_limited"] == 0
    assert run["rate_waits"] > 0
    assert run["makespan_s"] < 1.5 * run["bound_s"] + 0.5, run


async def test_a_budget_learned_from_the_headers_sends_no_refused_request(url: str) -> None:
    # Limits and the minute from x-ratelimit-*.
    run = await _fan_out(url, RateLimitPolicy(headroom=HEADROOM))
    assert run["rate_limited"] == 0
    assert run["makespan_s"] < 1.5 * run["bound_s"] + 0.5, run


async def test_fan_out_siblings_of_two_turns_share_one_learned_budget(url: str) -> None:
    # The same through the public surface: 50 fan_out siblings, each a subgraph
    # of two model calls (the second carries the first answer), one
    # BatchedChatModel whose scheduler learns the budget from the headers.
    forget_pacers()
    llm = BatchedChatModel(
        model="emulated-llama-3-8b",
        base_url=url,
        max_tokens=MAX_TOKENS,
        policy=BatchPolicy(rate_limit=RateLimitPolicy(headroom=HEADROOM), retry=PATIENT),
    )

    async def think(state: Sibling) -> Sibling:
        answer = await llm.ainvoke(state["messages"])
        return {"messages": [*state["messages"], answer, HumanMessage("and so?")]}

    async def conclude(state: Sibling) -> Sibling:
        return {"messages": [*state["messages"], await llm.ainvoke(state["messages"])]}

    sub = StateGraph(Sibling)
    sub.add_node("think", think)
    sub.add_node("conclude", conclude)
    sub.add_edge(START, "think")
    sub.add_edge("think", "conclude")
    parent = StateGraph(Parent)
    parent.add_node(
        "siblings",
        fan_out(
            sub.compile(),
            items="docs",
            into="answers",
            make_input=lambda doc, i: {"messages": [HumanMessage(doc)]},
            result=lambda final: final["messages"][-1].content,
        ),
    )
    parent.add_edge(START, "siblings")
    docs = [f"sibling {i}: " + "summarise this. " * 25 for i in range(SIBLINGS)]
    t0 = time.monotonic()
    out = await parent.compile().ainvoke({"docs": docs})
    makespan = time.monotonic() - t0
    assert len(out["answers"]) == SIBLINGS
    assert not [a for a in out["answers"] if isinstance(a, SiblingError)]
    async with httpx.AsyncClient() as client:
        stats = (await client.get(url + "/emulator/stats")).json()
    assert stats["rate_limited"] == 0
    tokens = stats["prompt_tokens_received"] + stats["generation_tokens"]
    bound = _bound(tokens)
    assert tokens > 6 * TPM
    assert makespan < 1.5 * bound + 1.0, (makespan, bound)


async def test_batch_and_completions_calls_count_one_request_per_prompt(
    start_emulator: Callable[..., str],
) -> None:
    url = await asyncio.to_thread(
        start_emulator, profile="zero", scenario="echo", time_scale=1.0, rate_limit_rpm=3
    )
    conv = [{"role": "user", "content": "hi"}]
    async with httpx.AsyncClient(base_url=url) as client:
        ok = await client.post(
            "/v1/chat/completions/batch", json={"messages": [conv, conv], "max_tokens": 4}
        )
        assert ok.status_code == 200
        assert ok.headers["x-ratelimit-remaining-requests"] == "1"
        over = await client.post("/v1/completions", json={"prompt": ["a", "b"], "max_tokens": 4})
        assert over.status_code == 429
        assert int(over.headers["retry-after"]) >= 1
        one = await client.post("/v1/completions", json={"prompt": "a", "max_tokens": 4})
        assert one.status_code == 200
        assert one.headers["x-ratelimit-remaining-requests"] == "0"


async def test_chat_openai_with_response_headers_learns_the_budget_through_langchain(
    url: str,
) -> None:
    # LangChainBackend reads `response_metadata["headers"]`, which ChatOpenAI fills
    # with include_response_headers=True; the SDK's own retries are off, so that
    # every 429 would reach the server's count.
    forget_pacers()
    model = ChatOpenAI(
        model="emulated-llama-3-8b",
        base_url=url + "/v1",
        api_key="not-needed",
        include_response_headers=True,
        max_retries=0,
    )
    backend = LangChainBackend(model)
    policy = BatchPolicy(rate_limit=RateLimitPolicy(), retry=PATIENT)
    requests = [
        ChatRequest(
            model="emulated-llama-3-8b",
            messages=[{"role": "user", "content": f"sibling {i}: " + "summarise this. " * 25}],
            params={"max_tokens": MAX_TOKENS},
        )
        for i in range(SIBLINGS)
    ]
    async with Scheduler(backend, policy=policy, owns_backend=True) as scheduler:
        responses = await asyncio.gather(*(scheduler.submit(r) for r in requests))
    assert len(responses) == SIBLINGS
    pacer = existing_pacer(backend.key)
    assert pacer is not None
    assert pacer.limits() == {"requests": 6000, "tokens": TPM}
    async with httpx.AsyncClient() as client:
        stats = (await client.get(url + "/emulator/stats")).json()
    assert stats["rate_limited"] == 0
