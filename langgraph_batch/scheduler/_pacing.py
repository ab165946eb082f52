"""`RateGate`: a request waits here for rate budget before it asks for a slot.

The async face of the key's `RatePacer` (`langgraph_batch._rate_budget`):
estimate the request's costs, book them, sleep the delay the pacer gives (a
cancelled caller gives its booking back), and after the call settle the
booking with the usage the server reported, or give it back when the server
refused it with a 429 (which charged nothing; the retry books again).

The wait comes before the slot: a request waiting for budget holds no slot,
so the in-flight limit and the budget never block each other.

A provider whose cache reads do not count towards its input limit
(Anthropic's cache-aware ITPM; known here from usage that reports cache
writes) is booked what it will count: once a request with a shared prefix
(the tools and the leading system messages) has been answered, later
requests with that prefix are booked without it, in calibration classes of
their own. One that turns out to count far more (the entry expired) makes
the prefix cold again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import time
from collections.abc import Mapping
from typing import Any

from langgraph_batch._heartbeat import held
from langgraph_batch._rate_budget import Costs, RatePacer, RateTicket, request_costs, sending
from langgraph_batch.backends.base import ChatRequest, ChatResponse
from langgraph_batch.errors import BackendRateLimitError

__all__ = ("RateGate",)

_WARM_KEPT = 1024
"""Shared prefixes a gate remembers as written to the provider's cache."""


def split_prefix(messages: Any, tools: Any) -> tuple[str | None, Any]:
    """`(digest of the shared prefix, the messages after it)`; `(None, messages)` without one.

    The shared prefix is what a hosted cache's first breakpoint holds: the
    tools and the leading system messages (OpenAI-format dicts or LangChain
    messages).
    """
    if not isinstance(messages, list):
        return None, messages
    n = 0
    for m in messages:
        role = m.get("role") if isinstance(m, Mapping) else getattr(m, "type", None)
        if role != "system":
            break
        n += 1
    if n == 0 and not tools:
        return None, messages
    blob = json.dumps([messages[:n], tools], default=str, sort_keys=True)
    return hashlib.blake2b(blob.encode(), digest_size=12).hexdigest(), messages[n:]


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
        self.cache_aware = False
        """The provider's usage reports cache writes: its input limit leaves reads out."""
        self._warm: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._prefix_of: dict[int, tuple[str, bool]] = {}

    async def wait(self, request: ChatRequest) -> RateTicket | None:
        """Book the request's costs and sleep until they may be spent.

        Returns:
            The booking to `done` (None when nothing is paced).
        """
        pacer = self.pacer
        if pacer.idle:
            return None
        clock = time.monotonic
        while True:
            # Costed again on each try: the probe's answer may have shown the
            # provider's cache rules meanwhile.
            costs, shape, prefix, warm = self._costs(request)
            ticket, delay = pacer.reserve(costs, clock(), shape=shape)
            if ticket is not None:
                break
            with held():  # another request probes the key's limits
                await asyncio.sleep(delay)
        if prefix is not None:
            self._prefix_of[id(ticket)] = (prefix, warm)
        if delay > 0:
            self.waits += 1
            self.wait_s += delay
            try:
                with held():
                    await asyncio.sleep(delay)
            except BaseException:
                pacer.release(ticket, clock())
                self._prefix_of.pop(id(ticket), None)
                raise
        return ticket

    def sending(self, ticket: RateTicket | None) -> contextlib.AbstractContextManager[None]:
        """Around the call: mark the booking sent and name it to the readings it brings."""
        return sending(self.pacer, ticket)

    def _costs(self, request: ChatRequest) -> tuple[Costs, int, str | None, bool]:
        """(costs, calibration shape, shared-prefix digest, whether it is booked warm)."""
        pacer = self.pacer
        shape = len(request.messages)
        if not pacer.paces_tokens:
            return {"requests": 1.0}, shape, None, False
        params = request.params
        messages, tools = request.messages, params.get("tools")
        prefix, rest = split_prefix(messages, tools)
        warm = self.cache_aware and prefix is not None and prefix in self._warm
        if warm:  # its prefix will be a cache read, which the limit leaves out
            messages, tools, shape = rest, None, -shape
        costs = request_costs(
            messages, tools, params, output_prior=pacer.policy.output_tokens_prior
        )
        return costs, shape, prefix, warm

    def done(
        self, ticket: RateTicket | None, resp: ChatResponse | None, exc: BaseException | None
    ) -> None:
        """Settle a booking with what the call used (or give it back after a 429)."""
        if ticket is None:
            return
        now = time.monotonic()
        prefix = self._prefix_of.pop(id(ticket), None)
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
        if usage.cache_creation_tokens is not None:
            self.cache_aware = True
        if prefix is not None:
            self._learn_prefix(prefix, inp, ticket)
        actual = {"requests": 1.0, "input_tokens": inp, "output_tokens": out, "tokens": inp + out}
        # A batched call's usage is split among its members: right in sum only.
        self.pacer.settle(ticket, actual, now, calibrate=not usage.estimated)

    def _learn_prefix(self, prefix: tuple[str, bool], counted: float, ticket: RateTicket) -> None:
        digest, warm = prefix
        if warm and counted > 2.0 * max(1.0, ticket.raw_input):
            self._warm.pop(digest, None)  # counted far beyond the booking: the entry expired
            return
        self._warm[digest] = None
        self._warm.move_to_end(digest)
        while len(self._warm) > _WARM_KEPT:
            self._warm.popitem(last=False)
