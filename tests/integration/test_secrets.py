"""Secrets never appear in logs, reprs or errors (issue 10, item 7).

A recognisable API key and a secret header value go through every path that
logs or builds a message: successful calls (plain, streamed, batched),
retried faults, an authentication error, a malformed tool call, a refused
connection, the scheduler and backend reprs and the model's `str`/`repr`.
Every log record of every logger at DEBUG (httpx and httpcore included), with
its `extra=` fields, is searched for the secrets.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from langchain_core.tools import tool

from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.errors import (
    BackendAuthenticationError,
    BackendConnectionError,
    MalformedToolCallError,
)
from langgraph_batch.scheduler import BatchPolicy, RetryPolicy
from tests.faultproxy import FaultProxy, Seen

MODEL = "emulated-llama-3-8b"
KEY = "sk-LGB-SECRET-KEY-7f3a9c"
HEADER = "hdr-LGB-SECRET-VALUE-41d2"
SECRETS = (KEY, HEADER, "SECRET-KEY", "SECRET-VALUE")


@tool
def lookup(city: str) -> str:
    """Look up facts about a city."""
    return city


def _texts(exc: BaseException) -> list[str]:
    """Everything an error says: message, repr, attributes, causes."""
    out = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out += [str(e), repr(e), *(str(v) for v in vars(e).values())]
        e = e.__cause__ or e.__context__
    return out


async def test_secrets_stay_out_of_logs_reprs_and_errors(
    emulator_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, httpx and httpcore included

    def decide(seen: Seen) -> str | None:
        if "please refuse" in seen.body.decode():
            return "html401"
        return None

    async with FaultProxy(emulator_url, decide=decide) as proxy:
        proxy.extra_faults["html401"] = (
            b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
            b'Content-Length: 26\r\nConnection: close\r\n\r\n{"error": "Unauthorized!"}'
        )
        llm = BatchedChatModel(
            model=MODEL,
            base_url=proxy.url.replace("http://", "vllm://"),
            api_key=KEY,
            default_headers={"X-Api-Key": HEADER},
            max_tokens=16,
            extra_body={"emulator": {"output_tokens": 6}},
            policy=BatchPolicy(retry=RetryPolicy(initial_interval=0.001, max_interval=0.001)),
            max_retries=1,
        )
        texts: list[str] = [str(llm), repr(llm), llm.model_dump_json(), str(llm.model_dump())]
        await asyncio.gather(*(llm.ainvoke(f"hello {i}") for i in range(6)))  # batched too
        async for _ in llm.astream("stream please"):
            pass
        errors: list[BaseException] = []
        faulty = llm.model_copy(
            update={"extra_body": {"emulator": {"output_tokens": 6, "fault": "500"}}}
        )
        dropped = llm.model_copy(
            update={"extra_body": {"emulator": {"output_tokens": 6, "fault": "drop"}}}
        )
        bad_args = llm.model_copy(
            update={
                "max_tokens": 256,
                "extra_body": {"emulator": {"turns": 2, "fault": "bad_tool_args"}},
            }
        )
        calls: list[Any] = [
            faulty.ainvoke("x"),
            dropped.ainvoke("y"),
            bad_args.bind_tools([lookup]).ainvoke("Tell me about key=Oslo"),
            llm.ainvoke("please refuse"),
        ]
        for call in calls:
            try:
                await call
            except Exception as exc:
                errors.append(exc)
        assert len(errors) == 4
        assert isinstance(errors[2], MalformedToolCallError)
        assert isinstance(errors[3], BackendAuthenticationError)
        # The proxy saw the secrets: they were sent, just never shown.
        assert any(s.headers.get("authorization") == f"Bearer {KEY}" for s in proxy.seen)
        scheduler = llm.get_scheduler()
        texts += [repr(scheduler), str(scheduler.stats()), repr(scheduler.backend)]
        texts.append(scheduler.backend.key)
        await scheduler.aclose()

    refused = BatchedChatModel(
        model=MODEL, base_url="vllm://127.0.0.1:9", api_key=KEY, max_retries=0
    )
    with pytest.raises(BackendConnectionError) as info:
        await refused.ainvoke("x")
    errors.append(info.value)
    await refused.get_scheduler().aclose()

    for exc in errors:
        texts += _texts(exc)
    for record in caplog.records:
        texts.append(record.getMessage())
        texts += [str(v) for v in vars(record).values()]
        if record.exc_info and record.exc_info[1] is not None:
            texts += _texts(record.exc_info[1])
    assert len(caplog.records) > 20  # the paths above did log
    assert any(r.levelname == "WARNING" for r in caplog.records)
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, text[:500]
