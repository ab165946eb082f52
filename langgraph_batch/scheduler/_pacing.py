"""`RateGate`: a request waits here for rate budget before it asks for a slot.

The async face of the key's `RatePacer` (`langgraph_batch._rate_budget`):
estimate the request's costs, book them, sleep the delay the pacer gives (a
cancelled caller gives its booking back), and after the call settle the
booking with the usage the server reported, or give it back when the server
refused it with a 429 (which charged nothing; the retry books again).

The wait comes before the slot: a request waiting for budget holds no slot,
so the in-flight limit and the budget never block each other.
"""

from __future__ import annotations

import asyncio
import time

from langgraph_batch._heartbeat import held
from langgraph_batch._rate_budget import RatePacer, RateTicket, request_costs
from langgraph_batch.backends.base import ChatRequest, ChatResponse
from langgraph_batch.errors import BackendRateLimitError

__all__ = ("RateGate",)


class RateGate:
    """Books each attempt's costs on a pacer and waits for them.

    Args:
        pacer: the budget of the scheduler's key.
    """

    def __init__(self, pacer: RatePacer) -> None:
        self.pacer = pacer
        self.waits = 0
        """Attempts that waited for budget."""
        self.wait_s = 0.0
        """Seconds they waited, summed."""

    async def wait(self, request: ChatRequest) -> RateTicket | None:
        """Book the request's costs and sleep until they may be spent.

        Returns:
            The booking to `done` (None when nothing is paced).
        """
        pacer = self.pacer
        if pacer.idle:
            return None
        if pacer.paces_tokens:
            params = request.params
            costs = request_costs(
                request.messages,
                params.get("tools"),
                params,
                output_prior=pacer.policy.output_tokens_prior,
            )
        else:
            costs = {"requests": 1.0}
        clock = time.monotonic
        while True:
            ticket, delay = pacer.reserve(costs, clock(), shape=len(request.messages))
            if ticket is not None:
                break
            with held():  # another request probes the key's limits
                await asyncio.sleep(delay)
        if delay > 0:
            self.waits += 1
            self.wait_s += delay
            try:
                with held():
                    await asyncio.sleep(delay)
            except BaseException:
                pacer.release(ticket, clock())
                raise
        return ticket

    def done(
        self, ticket: RateTicket | None, resp: ChatResponse | None, exc: BaseException | None
    ) -> None:
        """Settle a booking with what the call used (or give it back after a 429)."""
        if ticket is None:
            return
        now = time.monotonic()
        if exc is not None:
            if isinstance(exc, BackendRateLimitError):
                self.pacer.release(ticket, now)
            else:  # the server may have charged it (a cancelled call too): keep the estimate
                self.pacer.settle(ticket, None, now)
            return
        usage = resp.usage if resp is not None else None
        if usage is None:
            self.pacer.settle(ticket, None, now)
            return
        inp, out = float(usage.prompt_tokens), float(usage.completion_tokens)
        if usage.cache_creation_tokens is not None and usage.cached_tokens:
            # A hosted cache that reports writes (Anthropic's, Bedrock's) does not count
            # cache reads towards the input-tokens limit ("cache-aware ITPM",
            # docs.claude.com/en/api/rate-limits); OpenAI's counts them.
            inp -= float(usage.cached_tokens)
        actual = {"requests": 1.0, "input_tokens": inp, "output_tokens": out, "tokens": inp + out}
        # A batched call's usage is split among its members: right in sum only.
        self.pacer.settle(ticket, actual, now, calibrate=not usage.estimated)
