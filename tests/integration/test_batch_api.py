"""The providers' batch APIs on the emulator, through the official `openai` and `anthropic` SDKs.

The emulator's routes follow https://platform.openai.com/docs/guides/batch (files,
batches, output and error files) and
https://docs.claude.com/en/docs/build-with-claude/batch-processing (Message Batches,
JSONL results). `ProviderBatch` sends W7-shaped siblings (one call, no tools) as one
batch and returns them in input order; expired items end as typed errors.
"""

from __future__ import annotations

import asyncio
import json
import operator
from collections.abc import Iterator
from typing import Annotated, Any

import anthropic
import httpx
import openai
import pytest
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from langgraph_batch import BatchedChatModel, fan_out
from langgraph_batch.batch_api import ProviderBatch
from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess
from langgraph_batch.nodes.fan_out import SiblingError
from langgraph_batch.pricing import PriceTable, Pricing

MODEL = "emulated-llama-3-8b"
INSTRUCTION = "Extract the parties, the date and the amount as JSON. " * 40
ANSWER_TOKENS = 24


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    cfg = EmulatorConfig(port=0, time_scale=50.0, batch_delay_s=0.05, output_tokens=ANSWER_TOKENS)
    with EmulatorProcess(cfg) as emu:
        yield emu.url


def _steer(**options: Any) -> dict[str, str]:
    return {"X-Emulator-Batch": json.dumps(options)}


def _docs(n: int) -> list[str]:
    return [f"Contract {i}: " + f"clause {i} of party {i % 7}. " * 30 for i in range(n)]


def _make_input(doc: str, index: int) -> list[tuple[str, str]]:
    return [("system", INSTRUCTION), ("user", doc)]


class _State(TypedDict, total=False):
    docs: list[str]
    answers: list[Any]
    cost: dict[str, Any]
    events: Annotated[list[Any], operator.add]


def _graph(runner: Any, *, executor: Any = None, prices: PriceTable | None = None) -> Any:
    builder = StateGraph(_State)
    builder.add_node(
        "extract",
        fan_out(
            runner,
            items="docs",
            into="answers",
            make_input=_make_input,
            executor=executor,
            prices=prices,
            cost_into="cost",
        ),
    )
    builder.add_edge(START, "extract")
    builder.add_edge("extract", END)
    return builder.compile()


def _openai(url: str, **steer: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", default_headers=_steer(**steer))


def _anthropic(url: str, **steer: Any) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="x", default_headers=_steer(**steer))


async def _reset_cache(url: str) -> None:
    async with httpx.AsyncClient() as client:
        (await client.post(url + "/reset_prefix_cache")).raise_for_status()


async def test_openai_sdk_files_batches_and_error_file(url: str) -> None:
    async with _openai(url, expire=["c2"], fail=["c3"]) as client:
        await _openai_roundtrip(client)


async def _openai_roundtrip(client: openai.AsyncOpenAI) -> None:
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"doc {i}"}]},
        }
        for i in range(5)
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    upload = await client.files.create(
        file=("in.jsonl", data, "application/jsonl"), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "validating"
    while batch.status not in ("completed", "expired", "failed", "cancelled"):
        await asyncio.sleep(0.05)
        batch = await client.batches.retrieve(batch.id)
    # An item left unrun when the window closes makes the batch `expired`; the rest stay.
    assert batch.status == "expired"
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (5, 3)
    assert batch.output_file_id
    assert batch.error_file_id
    out = [
        json.loads(x) for x in (await client.files.content(batch.output_file_id)).text.splitlines()
    ]
    assert sorted(o["custom_id"] for o in out) == ["c0", "c1", "c4"]
    assert all(o["response"]["status_code"] == 200 for o in out)
    errors = {
        e["custom_id"]: e
        for e in map(
            json.loads, (await client.files.content(batch.error_file_id)).text.splitlines()
        )
    }
    assert errors["c2"]["error"]["code"] == "batch_expired"
    assert errors["c3"]["response"]["status_code"] == 500


async def test_openai_batch_with_a_bad_input_file_fails_validation(url: str) -> None:
    async with _openai(url) as client:
        await _bad_file(client)


async def _bad_file(client: openai.AsyncOpenAI) -> None:
    line = {"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {}}
    data = (json.dumps(line) + "\n") * 2
    upload = await client.files.create(
        file=("in.jsonl", data.encode(), "application/jsonl"), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "failed"
    assert batch.errors is not None
    assert batch.errors.data
    assert batch.errors.data[0].code == "duplicate_custom_id"


async def test_anthropic_sdk_message_batch_results(url: str) -> None:
    async with _anthropic(url, expire=["c1"]) as client:
        await _anthropic_roundtrip(client)


async def _anthropic_roundtrip(client: anthropic.AsyncAnthropic) -> None:
    requests: Any = [
        {
            "custom_id": f"c{i}",
            "params": {
                "model": "claude-emulated",
                "max_tokens": 16,
                "messages": [{"role": "user", "content": f"doc {i}"}],
            },
        }
        for i in range(3)
    ]
    batch = await client.messages.batches.create(requests=requests)
    assert batch.processing_status == "in_progress"
    while batch.processing_status != "ended":
        await asyncio.sleep(0.05)
        batch = await client.messages.batches.retrieve(batch.id)
    assert batch.request_counts.succeeded == 2
    assert batch.request_counts.expired == 1
    results = {r.custom_id: r.result async for r in await client.messages.batches.results(batch.id)}
    assert results["c1"].type == "expired"
    ok = results["c0"]
    assert ok.type == "succeeded"
    assert ok.message.model == "claude-emulated"
    assert ok.message.usage.output_tokens > 0


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_w7_through_the_batch_api_in_order_at_half_price(url: str, provider: str) -> None:
    n = 12
    docs = _docs(n)
    # No cache discount in this table: both paths pay the same per token, so the batch
    # path is exactly 0.5x whenever the token counts match (they do: same prompts).
    table = PriceTable({MODEL: Pricing(input=3.0, output=15.0, batch_discount=0.5)})
    client = _openai(url) if provider == "openai" else _anthropic(url)
    executor = ProviderBatch(
        provider=provider,  # type: ignore[arg-type]
        model=MODEL,
        client=client,
        poll_interval=0.05,
        params={"max_tokens": 256},
    )
    llm = BatchedChatModel(model=MODEL, base_url=url, max_tokens=256)
    async with client:
        batched = await _graph(llm, executor=executor, prices=table).ainvoke({"docs": docs})
    sync = await _graph(llm, prices=table).ainvoke({"docs": docs})

    answers = batched["answers"]
    assert len(answers) == n
    for i, answer in enumerate(answers):
        assert not isinstance(answer, SiblingError), answer
        assert answer.response_metadata["custom_id"] == f"s{i}"  # input order
        assert answer.content == sync["answers"][i].content
    b_usage, s_usage = batched["cost"]["usage"], sync["cost"]["usage"]
    assert b_usage["input_tokens"] == s_usage["input_tokens"] > n * 300
    assert b_usage["output_tokens"] == s_usage["output_tokens"] > 0
    ratio = batched["cost"]["cost"]["total"] / sync["cost"]["cost"]["total"]
    assert ratio == pytest.approx(0.5, rel=1e-9)


async def test_w7_with_cached_input_prices_stays_at_half_or_below(url: str) -> None:
    # OpenAI-style cached input: the sync path's cache hits are cheaper, and the batch
    # path's items get the same engine's prefix cache; both are priced from usage.
    table = PriceTable({MODEL: Pricing.openai(input=2.0, output=8.0, cached_input=0.5)})
    docs = _docs(8)
    llm = BatchedChatModel(model=MODEL, base_url=url, max_tokens=256)
    await _reset_cache(url)
    async with _openai(url) as client:
        executor = ProviderBatch(provider="openai", model=MODEL, client=client, poll_interval=0.05)
        batched = await _graph(llm, executor=executor, prices=table).ainvoke({"docs": docs})
    await _reset_cache(url)
    sync = await _graph(llm, prices=table).ainvoke({"docs": docs})
    b, s = batched["cost"], sync["cost"]
    assert b["usage"]["cache_read"] > 0
    assert s["usage"]["cache_read"] > 0
    # Same cache hits: exactly half; otherwise off by the hits' price difference only.
    gap = abs(b["usage"]["cache_read"] - s["usage"]["cache_read"]) * (2.0 - 0.5) / 1e6
    assert b["cost"]["total"] == pytest.approx(0.5 * s["cost"]["total"], abs=0.5 * gap + 1e-12)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_expired_and_failed_items_are_typed_errors_at_their_sibling(
    url: str, provider: str
) -> None:
    steer = {"expire": ["s1", "s4"], "fail": ["s2"]}
    client = _openai(url, **steer) if provider == "openai" else _anthropic(url, **steer)
    executor = ProviderBatch(
        provider=provider,  # type: ignore[arg-type]
        model=MODEL,
        client=client,
        poll_interval=0.05,
    )
    llm = BatchedChatModel(model=MODEL, base_url=url)
    async with client:
        out = await _graph(llm, executor=executor).ainvoke({"docs": _docs(6)})
    answers = out["answers"]
    kinds = [a.error_type if isinstance(a, SiblingError) else "ok" for a in answers]
    assert kinds == [
        "ok",
        "BatchItemExpiredError",
        "BatchItemFailedError",
        "ok",
        "BatchItemExpiredError",
        "ok",
    ]
    assert answers[1].retryable is True  # send it again
    assert answers[2].retryable is True  # a 500 / api_error
    assert "did not run before" in answers[1].message


async def test_a_deadline_cancels_the_batch_and_expires_what_did_not_run(url: str) -> None:
    llm = BatchedChatModel(model=MODEL, base_url=url)
    async with _openai(url, delay_s=30.0) as client:
        executor = ProviderBatch(
            provider="openai", model=MODEL, client=client, poll_interval=0.05, deadline=0.3
        )
        out = await _graph(llm, executor=executor).ainvoke({"docs": _docs(3)})
    assert [a.error_type for a in out["answers"]] == ["BatchItemExpiredError"] * 3
    assert "its deadline" in out["answers"][0].message


async def test_the_batch_window_expires_items_still_running(url: str) -> None:
    # window_s: the completion window closes while the items run (one engine step each
    # at least): whatever finished is kept, the rest expire.
    llm = BatchedChatModel(model=MODEL, base_url=url)
    async with _anthropic(url, window_s=0.0) as client:
        executor = ProviderBatch(
            provider="anthropic", model=MODEL, client=client, poll_interval=0.05
        )
        out = await _graph(llm, executor=executor).ainvoke({"docs": _docs(4)})
    assert {a.error_type for a in out["answers"]} == {"BatchItemExpiredError"}


def test_provider_batch_checks_its_options() -> None:
    with pytest.raises(ValueError, match="provider"):
        ProviderBatch(provider="azure", model="m")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="deadline"):
        ProviderBatch(provider="openai", model="m", api_key="x", deadline=0)
    with pytest.raises(ValueError, match="poll_interval"):
        ProviderBatch(provider="openai", model="m", api_key="x", poll_interval=0)
