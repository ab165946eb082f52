"""Rate-limit headers reach the key's budget: from the HTTP seam and from LangChain metadata."""

from __future__ import annotations

import time

import httpx
from langchain_core.messages import AIMessage

from langgraph_batch._rate_budget import existing_pacer, forget_pacers
from langgraph_batch.backends import LangChainBackend, OpenAICompatibleBackend
from langgraph_batch.backends.base import ChatRequest
from langgraph_batch.scheduler import BatchPolicy, RateLimitPolicy, RetryPolicy, Scheduler
from tests.fakes.chat_models import USAGE, ProviderFake
from tests.fakes.http import Recorder, completion

LIMITS = {
    "x-ratelimit-limit-requests": "100",
    "x-ratelimit-remaining-requests": "99",
    "x-ratelimit-reset-requests": "600ms",
    "x-ratelimit-limit-tokens": "10000",
    "x-ratelimit-remaining-tokens": "9000",
    "x-ratelimit-reset-tokens": "6s",
}
REQUEST = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}])


async def test_the_http_backend_feeds_its_keys_budget(recorder: Recorder) -> None:
    forget_pacers()
    recorder.handler = lambda request: httpx.Response(200, json=completion(), headers=LIMITS)
    backend = OpenAICompatibleBackend(
        "http://server.test", api_key="sk-one", transport=recorder.transport
    )
    other = OpenAICompatibleBackend("http://server.test", api_key="sk-two")
    async with Scheduler(backend, owns_backend=True) as scheduler:
        await scheduler.submit(REQUEST)
    pacer = existing_pacer(backend.key)
    assert pacer is not None
    assert pacer.limits() == {"requests": 100, "tokens": 10_000}
    assert existing_pacer(other.key) is None  # another API key: another budget
    await other.aclose()
    forget_pacers()


async def test_a_429_gives_its_booking_back_and_is_retried_as_before(recorder: Recorder) -> None:
    forget_pacers()
    answers = iter(
        [
            httpx.Response(
                429, json={"error": {"message": "slow"}}, headers={"retry-after-ms": "1"}
            ),
            httpx.Response(200, json=completion()),
        ]
    )
    recorder.handler = lambda request: next(answers)
    backend = OpenAICompatibleBackend("http://server.test", transport=recorder.transport)
    policy = BatchPolicy(
        rate_limit=RateLimitPolicy(requests_per_min=2, probe=False, headroom=1.0),
        retry=RetryPolicy(max_attempts=2, initial_interval=0.001, jitter=False),
    )
    async with Scheduler(backend, policy=policy, owns_backend=True) as scheduler:
        resp = await scheduler.submit(REQUEST)
        assert resp.content == "hello"
        assert scheduler.stats().retries == 1
        pacer = existing_pacer(backend.key)
        assert pacer is not None
        # Two attempts, one refused: one request of the two a minute is spent.
        ticket, delay = pacer.reserve({"requests": 1.0}, now=time.monotonic())
        assert ticket is not None
        assert delay == 0.0
    forget_pacers()


async def test_a_langchain_models_response_headers_feed_its_budget() -> None:
    forget_pacers()
    message = AIMessage(
        content="ok",
        usage_metadata=USAGE,
        response_metadata={"model_name": "fake", "headers": LIMITS},
    )
    model = ProviderFake(script=lambda messages, record: message)
    backend = LangChainBackend(model)
    async with Scheduler(backend, owns_backend=True) as scheduler:
        await scheduler.submit(REQUEST)
    pacer = existing_pacer(backend.key)
    assert pacer is not None
    assert pacer.limits() == {"requests": 100, "tokens": 10_000}
    forget_pacers()
