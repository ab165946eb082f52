"""One request stream, sent identically to a real vLLM server or to the emulator.

The engine tier's rule tests (`tests/engine/test_rules_*.py`) hold the
emulator to vLLM by sending both the same stream and comparing what each
reports. This module owns that stream and what is recorded of it:

- `Call`: one `/v1/completions` request, a token-id prompt and a forced
  output length (`max_tokens` with `ignore_eos`).
- `run_stream(url, model, phases)`: the phases in order, with a barrier
  between them (every call of a phase answered before the next phase starts);
  within a phase the calls are sent in order, `gap_s` apart, and run
  concurrently. With `hold=True` a phase of several calls is sent while the
  server is paused (vLLM's dev-mode `POST /pause?mode=keep`, which the
  emulator serves too) and resumed `settle_s` after the last request body
  went out, so the first step sees them all whatever the host's load: the
  scheduling that follows is the engine's alone, not the client's timing.
  (vLLM publishes `num_requests_waiting` only after a step, and a paused
  engine takes none, so the barrier cannot count the queue; the settle time
  covers the API server handing the requests to the engine core.)
  Per call it records the HTTP status, `cached_tokens`, prompt and
  completion tokens, finish reason or error text, and its send and answer
  order; per stream the `/metrics` deltas (preemptions, prefix-cache queries
  and hits, cached prompt tokens) and `num_requests_waiting`/`running`
  sampled every `sample_s` (peaks; `sample_s=None` samples nothing, which
  leaves the client's event loop free to read answers in the order they come).
  Each call goes with `X-Request-Id: <stream tag>-<name>` (`Outcome.request_id`),
  the id vLLM (`--enable-request-id-headers`) and the emulator give it.
- `Tokens`: fresh token ids, so that prompts share only what a test makes
  them share.

Nothing here knows which server it talks to: the same code measures both.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field

import httpx

from langgraph_batch.backends import parse_prometheus

__all__ = (
    "COUNTERS",
    "Call",
    "Outcome",
    "StreamResult",
    "Tokens",
    "run_stream",
)

COUNTERS = {
    "preemptions": "vllm:num_preemptions_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "prompt_tokens_cached": "vllm:prompt_tokens_cached_total",
}
"""Counters whose change over a stream is recorded, by short name."""
_GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running")
VOCAB = 4096
"""Token ids stay below this (the tiny model's vocabulary)."""


@dataclass(frozen=True, slots=True)
class Call:
    """One completion request: `prompt` token ids, exactly `max_tokens` generated."""

    name: str
    prompt: tuple[int, ...]
    max_tokens: int = 1


@dataclass(slots=True)
class Outcome:
    """What one call got back."""

    name: str
    request_id: str = ""
    """The `X-Request-Id` it was sent with."""
    status: int = 0
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    """The error message of a non-200 answer."""
    error_param: str | None = None
    sent: int = -1
    """Send order within the stream (0 first)."""
    finished: int = -1
    """Answer order within the stream (0 first)."""


@dataclass(slots=True)
class StreamResult:
    """Everything one stream recorded."""

    outcomes: dict[str, Outcome]
    counters: dict[str, float]
    """Change of each of `COUNTERS` over the stream."""
    samples: list[tuple[float, float, float]] = field(default_factory=list)
    """(seconds since start, running, waiting)."""
    resumed: list[float] = field(default_factory=list)
    """Seconds since start at which each held phase was resumed."""

    @property
    def peak_waiting(self) -> float:
        """Largest `num_requests_waiting` sampled."""
        return max((w for _, _, w in self.samples), default=0.0)

    def peak_waiting_while_running(self) -> float:
        """Largest `num_requests_waiting` sampled while requests run, after the first resume.

        A paused server queues a held phase whole; this is the queue the
        scheduler leaves once it runs (vLLM updates both gauges after a step).
        """
        start = self.resumed[0] if self.resumed else 0.0
        return max((w for at, r, w in self.samples if at > start and r > 0), default=0.0)

    @property
    def peak_running(self) -> float:
        """Largest `num_requests_running` sampled."""
        return max((r for _, r, _ in self.samples), default=0.0)

    def cached(self, name: str) -> int | None:
        """`cached_tokens` of the call named `name`."""
        return self.outcomes[name].cached_tokens

    def finish_order(self) -> list[str]:
        """Call names in the order their answers came back."""
        done = [o for o in self.outcomes.values() if o.finished >= 0]
        return [o.name for o in sorted(done, key=lambda o: o.finished)]


class Tokens:
    """Fresh token ids from a seeded generator: prompts share only what a test makes them share."""

    def __init__(self, seed: int | str) -> None:
        self._rng = random.Random(f"engine-rules:{seed}")

    def take(self, n: int) -> tuple[int, ...]:
        """`n` random token ids in 1..VOCAB-1."""
        return tuple(self._rng.randrange(1, VOCAB) for _ in range(n))


def _counters(text: str) -> dict[str, float]:
    m = parse_prometheus(text, names=set(COUNTERS.values()))
    return {short: m.sum(name) or 0.0 for short, name in COUNTERS.items()}


async def _post(
    client: httpx.AsyncClient, url: str, model: str, call: Call, rid: str, sent: asyncio.Event
) -> httpx.Response:
    body = {
        "model": model,
        "prompt": list(call.prompt),
        "max_tokens": call.max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }

    async def trace(name: str, info: dict[str, object]) -> None:
        if name == "http11.send_request_body.complete":
            sent.set()

    return await client.post(
        f"{url}/v1/completions",
        json=body,
        headers={"X-Request-Id": rid},
        extensions={"trace": trace},
    )


def _record(out: Outcome, resp: httpx.Response) -> None:
    out.status = resp.status_code
    data = resp.json()
    if resp.status_code != 200:
        err = data.get("error", {}) if isinstance(data, dict) else {}
        out.error = str(err.get("message", data))
        out.error_param = err.get("param")
        return
    usage = data["usage"]
    out.prompt_tokens = usage["prompt_tokens"]
    out.completion_tokens = usage["completion_tokens"]
    details = usage.get("prompt_tokens_details") or {}
    out.cached_tokens = details.get("cached_tokens")
    out.finish_reason = data["choices"][0]["finish_reason"]


async def _checked(request: Awaitable[httpx.Response]) -> None:
    resp = await request
    resp.raise_for_status()


_HELD_GAP_S = 0.1
"""Least seconds between two sends of a held phase (the paused server takes them in order)."""


async def run_stream(
    url: str,
    model: str,
    phases: Sequence[Sequence[Call]],
    *,
    gap_s: float = 0.02,
    sample_s: float | None = 0.05,
    timeout_s: float = 240.0,
    hold: bool = False,
    settle_s: float = 2.0,
) -> StreamResult:
    """Send `phases` to the server at `url` and record what it answers.

    Args:
        url: Server root (no `/v1`).
        model: Served model name.
        phases: Calls per phase; a phase starts when the previous one is answered.
        gap_s: Seconds between two sends within a phase (fixes the arrival order).
        sample_s: Seconds between two `/metrics` samples (None: no sampling).
        timeout_s: Per-call HTTP timeout.
        hold: Queue each phase of several calls while the server is paused.
        settle_s: Seconds between the last body sent and the resume of a held phase.

    Returns:
        The outcomes by call name, counter deltas and gauge samples.
    """
    outcomes: dict[str, Outcome] = {}
    order = {"sent": 0, "finished": 0}
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        before = _counters((await client.get(f"{url}/metrics")).text)
        samples: list[tuple[float, float, float]] = []
        resumed: list[float] = []
        t0 = time.monotonic()
        stop = asyncio.Event()

        async def sample(interval: float) -> None:
            while not stop.is_set():
                text = (await client.get(f"{url}/metrics")).text
                m = parse_prometheus(text, names=_GAUGES)
                running, waiting = (m.sum(name) or 0.0 for name in reversed(_GAUGES))
                samples.append((time.monotonic() - t0, running, waiting))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)

        async def one(call: Call, sent: asyncio.Event) -> None:
            rid = f"{tag}-{call.name}"
            out = outcomes[call.name] = Outcome(call.name, request_id=rid, sent=order["sent"])
            order["sent"] += 1
            resp = await _post(client, url, model, call, rid, sent)
            out.finished = order["finished"]
            order["finished"] += 1
            _record(out, resp)

        tag = uuid.uuid4().hex[:12]
        sampler = asyncio.create_task(sample(sample_s)) if sample_s is not None else None
        try:
            for phase in phases:
                held = hold and len(phase) > 1
                if held:
                    await _checked(client.post(f"{url}/pause", params={"mode": "keep"}))
                tasks = []
                sent = [asyncio.Event() for _ in phase]
                for i, call in enumerate(phase):
                    if call.name in outcomes:
                        raise ValueError(f"call name {call.name!r} used twice")
                    if i and gap_s > 0:
                        await asyncio.sleep(max(gap_s, _HELD_GAP_S) if held else gap_s)
                    tasks.append(asyncio.create_task(one(call, sent[i])))
                    if held:
                        # The next call goes once this one's body is on the wire, so
                        # a held phase is admitted in its written order (concurrent
                        # sends on new connections arrived out of order in CI).
                        await asyncio.wait_for(sent[i].wait(), timeout_s)
                if held:
                    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in sent)), timeout_s)
                    await asyncio.sleep(settle_s)
                    await _checked(client.post(f"{url}/resume"))
                    resumed.append(time.monotonic() - t0)
                await asyncio.gather(*tasks)
        finally:
            stop.set()
            if sampler is not None:
                await sampler
        # The engine publishes its counters after the step: let them settle.
        await asyncio.sleep(0.05)
        after = _counters((await client.get(f"{url}/metrics")).text)
    deltas = {k: after[k] - before[k] for k in COUNTERS}
    return StreamResult(outcomes=outcomes, counters=deltas, samples=samples, resumed=resumed)
