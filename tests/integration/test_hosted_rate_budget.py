"""A stated rate budget keeps unmodified `ChatAnthropic` under the Anthropic flavour's limits.

The emulator serves Anthropic's Messages API with an input-tokens-per-minute
limit (cache reads do not count, as Anthropic's cache-aware ITPM) and a
minute of 1 s. 16 two-call agents share a ~1.8k-token system prompt; their
demand, counted the limit's way, exceeds one minute's budget. langchain-
anthropic does not expose the response headers, so the budget is stated
(`BatchPolicy(rate_limit=RateLimitPolicy(...))`). Without it the burst draws
429s (`max_retries=0`: each is a failed call); with it, none.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from langgraph_batch._rate_budget import forget_pacers
from langgraph_batch.backends import LangChainBackend
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess
from langgraph_batch.scheduler import BatchPolicy, RateLimitPolicy

langchain_anthropic = pytest.importorskip("langchain_anthropic")

pytestmark = pytest.mark.timeout(120)

MODEL = "claude-sonnet-5"
SYSTEM = "You are a careful agent. Follow the policy. " * 200
AGENTS = 16
ITPM = 8000
TIME_SCALE = 60.0  # a minute of 1 s


@pytest.fixture(scope="module")
def limited_url() -> Iterator[str]:
    config = EmulatorConfig(port=0, hosted="anthropic", time_scale=TIME_SCALE, rate_limit_itpm=ITPM)
    with EmulatorProcess(config) as emu:
        yield emu.url


async def _stats(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url) as http:
        return dict((await http.get("/emulator/stats")).json())


async def _run(url: str, key: str, policy: BatchPolicy | None) -> tuple[int, int, float]:
    """(failed calls, 429s the emulator answered, makespan s) of the agents."""
    forget_pacers()
    async with httpx.AsyncClient(base_url=url) as http:
        (await http.post("/emulator/reset")).raise_for_status()
    before = (await _stats(url))["rate_limited"]
    claude = langchain_anthropic.ChatAnthropic(
        model=MODEL, base_url=url, api_key="emulated", max_retries=0, max_tokens=16
    )
    kwargs: dict[str, Any] = {"policy": policy} if policy is not None else {}
    llm = BatchedChatModel(
        model=MODEL, backend=LangChainBackend(claude, key=key), max_retries=0, **kwargs
    )

    async def agent(i: int) -> int:
        task = f"task {i}: " + "the details of the task. " * 200  # ~1.2k tokens of its own
        messages: list[Any] = [SystemMessage(SYSTEM), HumanMessage(task)]
        failed = 0
        for turn in range(2):
            try:
                messages.append(await llm.ainvoke(messages))
            except Exception:
                failed += 1
                break
            messages.append(HumanMessage(f"go on {turn}"))
        return failed

    t0 = time.monotonic()
    failed = sum(await asyncio.gather(*(agent(i) for i in range(AGENTS))))
    makespan = time.monotonic() - t0
    await llm.get_scheduler().aclose()
    return failed, (await _stats(url))["rate_limited"] - before, makespan


async def test_a_stated_budget_draws_no_429_where_the_burst_draws_many(limited_url: str) -> None:
    failed, limited, naive_s = await _run(limited_url, "no-budget", None)
    print(f"\nno budget: {limited} 429s, {failed} failed calls, makespan {naive_s:.2f} s")
    assert limited > 0  # the demand really exceeds the limit
    assert failed > 0
    budget = RateLimitPolicy(input_tokens_per_min=ITPM, minute_s=60.0 / TIME_SCALE)
    failed, limited, makespan = await _run(limited_url, "budget", BatchPolicy(rate_limit=budget))
    print(f"with a budget: {limited} 429s, {failed} failed calls, makespan {makespan:.2f} s")
    assert (failed, limited) == (0, 0)
