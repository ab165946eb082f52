"""The hosted Anthropic flavour through the official SDKs: `anthropic` and `ChatAnthropic`.

The emulator (`hosted="anthropic"`) serves `POST /v1/messages`; both clients
run unmodified with `base_url` pointed at it. Checked: cache writes and reads
by Anthropic's rules in `usage`, streaming, tool use, the 400s of the rules,
and LangChainBackend's breakpoints and prefix warming across siblings.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from langgraph_batch.backends import LangChainBackend
from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess
from tests.integration._hosted import assert_siblings_warm_then_read

anthropic = pytest.importorskip("anthropic")
langchain_anthropic = pytest.importorskip("langchain_anthropic")

MODEL = "claude-sonnet-5"
SYSTEM = "You are a careful agent. Follow the policy. " * 200  # ~1.8k emulator tokens
TOOL = {
    "name": "lookup",
    "description": "Look a key up.",
    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}


@pytest.fixture(scope="module")
def hosted_url() -> Iterator[str]:
    with EmulatorProcess(EmulatorConfig(port=0, hosted="anthropic", time_scale=50.0)) as emu:
        yield emu.url


@pytest.fixture
async def client(hosted_url: str) -> Any:
    async with httpx.AsyncClient(base_url=hosted_url) as http:
        (await http.post("/emulator/reset")).raise_for_status()
    async with anthropic.AsyncAnthropic(base_url=hosted_url, api_key="emulated") as c:
        yield c


def _system(ttl: str | None = None) -> list[dict[str, Any]]:
    cc: dict[str, Any] = {"type": "ephemeral"}
    if ttl:
        cc["ttl"] = ttl
    return [{"type": "text", "text": SYSTEM, "cache_control": cc}]


async def test_sdk_writes_then_reads_the_marked_prefix(client: Any) -> None:
    first = await client.messages.create(
        model=MODEL, max_tokens=64, system=_system(), messages=[{"role": "user", "content": "a"}]
    )
    assert first.usage.cache_creation_input_tokens > 1024
    assert first.usage.cache_read_input_tokens == 0
    assert first.usage.cache_creation.ephemeral_5m_input_tokens == (
        first.usage.cache_creation_input_tokens
    )
    second = await client.messages.create(
        model=MODEL, max_tokens=64, system=_system(), messages=[{"role": "user", "content": "b"}]
    )
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0
    assert second.usage.input_tokens == first.usage.input_tokens  # the user turn
    # Unmarked: nothing cached, nothing read.
    plain = await client.messages.create(
        model=MODEL, max_tokens=8, system=SYSTEM, messages=[{"role": "user", "content": "c"}]
    )
    assert plain.usage.cache_read_input_tokens == plain.usage.cache_creation_input_tokens == 0


async def test_sdk_concurrent_requests_all_write(client: Any) -> None:
    async def one(i: int) -> Any:
        return await client.messages.create(
            model=MODEL,
            max_tokens=8,
            system=_system("1h"),
            messages=[{"role": "user", "content": f"q{i}"}],
        )

    replies = await asyncio.gather(*(one(i) for i in range(4)))
    # A request sent before the first response began does not see its entry and
    # writes its own. On a loaded machine the last of the four may be sent after
    # that and read the entry; each reply does one or the other, and at least two
    # wrote (one cache, visible at once, would give one write and three reads).
    wrote = [r for r in replies if r.usage.cache_creation.ephemeral_1h_input_tokens > 1024]
    read = [r for r in replies if r.usage.cache_read_input_tokens > 1024]
    assert len(wrote) + len(read) == 4, [r.usage for r in replies]
    assert not [r for r in wrote if r.usage.cache_read_input_tokens]
    assert len(wrote) >= 2, [r.usage for r in replies]


async def test_sdk_streams_tool_use_with_usage(client: Any) -> None:
    async with client.messages.stream(
        model=MODEL,
        max_tokens=256,
        system=_system(),
        tools=[TOOL],
        messages=[{"role": "user", "content": "find key=k1"}],
    ) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "tool_use"
    call = next(b for b in final.content if b.type == "tool_use")
    assert call.name == "lookup"
    assert isinstance(call.input, dict)
    assert final.usage.cache_creation_input_tokens > 1024
    assert final.usage.output_tokens > 0
    counted = await client.messages.count_tokens(
        model=MODEL, system=SYSTEM, messages=[{"role": "user", "content": "hi"}]
    )
    assert counted.input_tokens > 1024


async def test_sdk_gets_the_rules_400s(client: Any) -> None:
    cc = {"type": "ephemeral"}
    blocks = [{"type": "text", "text": f"part {i}", "cache_control": cc} for i in range(5)]
    with pytest.raises(anthropic.BadRequestError, match="maximum of 4"):
        await client.messages.create(
            model=MODEL, max_tokens=8, system=blocks, messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(anthropic.BadRequestError, match="1h"):
        await client.messages.create(
            model=MODEL,
            max_tokens=8,
            system=_system("5m"),
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "x", "cache_control": {**cc, "ttl": "1h"}}
                    ],
                }
            ],
        )


async def test_chat_anthropic_through_langchain_backend_warms_then_reads(
    hosted_url: str, client: Any
) -> None:
    claude = langchain_anthropic.ChatAnthropic(
        model=MODEL, base_url=hosted_url, api_key="emulated", max_retries=0
    )
    backend = LangChainBackend(claude, key="hosted-it")
    await assert_siblings_warm_then_read(backend, model=MODEL, system=SYSTEM, hosted_url=hosted_url)
