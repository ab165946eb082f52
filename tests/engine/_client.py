"""Helpers of the client tests against the real engine: URLs, `/metrics`, polling.

Tests coordinate through the engine's own state: `wait_metric` polls
`/metrics` until a condition holds, with a deadline (never a bare sleep).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx

from benchmarks.vllm_cpu import VLLMCPUServer
from langgraph_batch.backends import parse_prometheus
from langgraph_batch.backends.base import EngineMetrics
from langgraph_batch.backends.vllm import parse_vllm_metrics

GREEDY_NOISE = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
"""Call options for answers of exactly `max_tokens` tokens, the same every time."""


def vllm_url(server: VLLMCPUServer) -> str:
    """The server as `BatchedChatModel(base_url=...)` takes it: `vllm://127.0.0.1:PORT`."""
    return "vllm://" + server.url.removeprefix("http://")


async def metrics_text(server: VLLMCPUServer, client: httpx.AsyncClient | None = None) -> str:
    """The engine's `/metrics` text (through `client`, else a new connection)."""
    if client is None:
        async with httpx.AsyncClient(timeout=60) as own:
            return await metrics_text(server, own)
    response = await client.get(f"{server.url}/metrics")
    response.raise_for_status()
    return response.text


async def engine_metrics(
    server: VLLMCPUServer, client: httpx.AsyncClient | None = None
) -> EngineMetrics:
    """The engine's `/metrics` as the library reads them."""
    return parse_vllm_metrics(await metrics_text(server, client))


async def counter(server: VLLMCPUServer, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels` (0 when absent)."""
    samples = parse_prometheus(await metrics_text(server)).get(name)
    return sum(v for lab, v in samples if all(lab.get(k) == x for k, x in labels.items()))


async def wait_metric(
    server: VLLMCPUServer,
    condition: Callable[[EngineMetrics], bool],
    *,
    deadline_s: float = 60.0,
    what: str = "condition",
    task: asyncio.Task[Any] | None = None,
) -> tuple[EngineMetrics, float]:
    """Poll `/metrics` until `condition(metrics)` holds; return them and the seconds it took.

    Args:
        task: The call the condition waits on: if it ends first, its outcome is raised.

    Raises:
        AssertionError: the deadline passed (the last metrics in the message), the
            server died (its exit code and log tail in the message), or `task` ended.
    """
    start = time.monotonic()
    last: EngineMetrics | None = None
    async with httpx.AsyncClient(timeout=60) as client:  # one connection for the polls
        while True:
            polled_at = time.monotonic()
            try:
                last = await engine_metrics(server, client)
            except httpx.TransportError as exc:
                # A kept-alive connection the server closed: poll again, after a pause
                # (a refused connect fails without yielding: never spin on it).
                check_alive(server, f"while waiting for {what}: {exc!r}")
            else:
                if condition(last):
                    return last, time.monotonic() - start
            if task is not None and task.done():
                outcome = "cancelled" if task.cancelled() else repr(task.exception())
                raise AssertionError(f"the call ended before {what}: {outcome}")
            if polled_at - start >= deadline_s:
                # The last poll began after the deadline: a host that stalled this
                # loop past the deadline still had the state read once after it.
                break
            await asyncio.sleep(0.05)
    check_alive(server, f"while waiting for {what}")
    raise AssertionError(f"{what} not reached in {deadline_s} s; last metrics: {last}")


def check_alive(server: VLLMCPUServer, when: str) -> None:
    """Raise `AssertionError` with the exit code and the log's tail if the server died."""
    if not server.running:
        server.keep_log()
        raise AssertionError(
            f"the vLLM server died {when} (exit code {server.exit_code}); "
            f"log {server.log_path}, last lines:\n{server.log_tail()}"
        )


async def tokens_totals(server: VLLMCPUServer) -> tuple[float, float]:
    """The engine's (prompt, generation) token counters."""
    m = await engine_metrics(server)
    assert m.prompt_tokens_total is not None
    assert m.generation_tokens_total is not None
    return m.prompt_tokens_total, m.generation_tokens_total


async def wait_totals(
    server: VLLMCPUServer, before: tuple[float, float], prompt: int, generated: int
) -> tuple[float, float]:
    """Wait until the counters moved by (prompt, generated) since `before`; return the deltas.

    vLLM updates its counters from the engine's output stream, which may trail the
    HTTP answer by a step: the deltas are polled for a few seconds, then returned
    as they are (so a wrong figure fails the caller's assertion with the numbers).
    """
    deadline = time.monotonic() + 10
    while True:
        now = await tokens_totals(server)
        delta = (now[0] - before[0], now[1] - before[1])
        if delta == (prompt, generated) or time.monotonic() > deadline:
            return delta
        await asyncio.sleep(0.05)
