"""The hosted OpenAI flavour: `cached_tokens` by OpenAI's prompt-caching rules.

`openai` (AsyncOpenAI) and `ChatOpenAI` against the emulator with
`hosted="openai"`: nothing cached below 1024 tokens, hits in 128-token steps,
`prompt_cache_key` routing, `prompt_cache_retention` checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess

MODEL = "emulated-llama-3-8b"
LONG = "Follow the house rules carefully. " * 300  # ~2.4k tokens


@pytest.fixture(scope="module")
def hosted_url() -> Iterator[str]:
    with EmulatorProcess(EmulatorConfig(port=0, hosted="openai", time_scale=50.0)) as emu:
        yield emu.url


@pytest.fixture
async def client(hosted_url: str) -> Any:
    async with httpx.AsyncClient(base_url=hosted_url) as http:
        (await http.post("/emulator/reset")).raise_for_status()
    async with openai.AsyncOpenAI(base_url=f"{hosted_url}/v1", api_key="emulated") as c:
        yield c


async def _ask(client: Any, system: str, user: str, **extra: Any) -> Any:
    reply = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        max_tokens=8,
        **extra,
    )
    return reply.usage


async def test_cached_tokens_follow_openai_rules(client: Any) -> None:
    first = await _ask(client, LONG, "a", extra_body={"prompt_cache_key": "k"})
    assert first.prompt_tokens_details.cached_tokens == 0
    again = await _ask(client, LONG, "b", extra_body={"prompt_cache_key": "k"})
    cached = again.prompt_tokens_details.cached_tokens
    assert cached >= 1024
    assert (cached - 1024) % 128 == 0
    assert cached <= again.prompt_tokens
    short = await _ask(client, "short", "a")
    short2 = await _ask(client, "short", "a")
    assert short.prompt_tokens_details.cached_tokens == 0
    assert short2.prompt_tokens_details.cached_tokens == 0


async def test_retention_is_checked(client: Any) -> None:
    usage = await _ask(client, LONG, "a", extra_body={"prompt_cache_retention": "24h"})
    assert usage.prompt_tokens_details.cached_tokens == 0
    with pytest.raises(openai.BadRequestError, match="prompt_cache_retention"):
        await _ask(client, LONG, "a", extra_body={"prompt_cache_retention": "forever"})


async def test_chat_openai_sees_cache_reads(hosted_url: str, client: Any) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=MODEL, base_url=f"{hosted_url}/v1", api_key="emulated", max_retries=0, max_tokens=8
    )
    messages = [("system", LONG), ("user", "hello")]
    await llm.ainvoke(messages, prompt_cache_key="lc")
    reply = await llm.ainvoke(messages, prompt_cache_key="lc")
    assert reply.usage_metadata["input_token_details"]["cache_read"] >= 1024


async def test_langchain_backend_sends_prompt_cache_key(hosted_url: str, client: Any) -> None:
    from langchain_openai import ChatOpenAI

    from langgraph_batch import BatchedChatModel
    from langgraph_batch.backends import LangChainBackend
    from langgraph_batch.backends.base import ChatRequest

    # Its own timeout: langchain-openai caches one async client per (base URL, timeout),
    # and the previous test's is bound to that test's (closed) event loop.
    inner = ChatOpenAI(
        model=MODEL,
        base_url=f"{hosted_url}/v1",
        api_key="emulated",
        max_retries=0,
        max_tokens=8,
        timeout=31.0,
    )
    backend = LangChainBackend(inner, key="hosted-openai-it", prompt_caching=True)
    call = backend._prepare(
        ChatRequest(model=MODEL, messages=[{"role": "system", "content": LONG}])
    )
    assert call.kwargs["prompt_cache_key"].startswith("lgb-")
    llm = BatchedChatModel(model=MODEL, backend=backend)
    messages = [("system", LONG), ("user", "hello")]
    await llm.ainvoke(messages)
    reply = await llm.ainvoke(messages)
    assert reply.usage_metadata["input_token_details"]["cache_read"] >= 1024
