"""Rate budgets: pace requests and tokens under a provider's per-minute limits.

A hosted API answers 429 once a key's requests or tokens per minute run out
(and a 429 still costs a round trip, a backoff and a retry). The budget keeps
a client under the limits before that happens:

- `RateLimitPolicy` (in `BatchPolicy.rate_limit`) states the budget the user
  knows (`requests_per_min=`, `tokens_per_min=`, `input_tokens_per_min=`,
  `output_tokens_per_min=`) and whether to follow what the server's
  rate-limit headers say (`_rate_headers`).
- `RatePacer` is the pure, synchronous state of one budget (tests pass `now`):
  one token bucket per limited dimension, continuously refilled at
  limit / minute (Anthropic documents exactly this; OpenAI's "resets to its
  initial state" reads the same). `reserve(costs, now)` books a request's
  estimated cost on every bucket at once and returns how long to wait before
  sending it: a bucket may go below zero, which books its future refill, so
  requests go out in the order they asked, spaced at the refill rate (the
  GCRA form of a token bucket), with no polling. `observe(readings, now)`
  lowers a bucket to what the server says is left (less the bookings not
  yet sent, or sent after the request the reading answers) and learns
  limits and the minute's length (limit x reset / used);
  `settle(ticket, actual, now)` replaces the estimate by the usage the
  server reported (only the output's part once a reading has counted the
  request); `release(ticket, now)` gives back a booking never spent;
  `sending(ticket)` marks a booking sent, and tells a reading taken inside
  it which request it answers.
- One pacer per credentials: `pacer_for(backend.key)` keys the process-wide
  registry by a sha256 of the backend's key (endpoint and a digest of its
  credentials), so every scheduler, sibling and run on one key shares one
  budget and two tenants never share one. Neither the key nor its secret is
  ever logged.

Costs are estimated before sending (`request_costs`): input tokens on the
generous side (`_estimates.generous_tokens` over the JSON of the messages and
tools: over-estimating is the safe side of a limit), output tokens at the
request's `max_tokens` (else `output_tokens_prior`), as the providers charge
them on admission.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from langgraph_batch._estimates import generous_tokens
from langgraph_batch._rate_headers import RateReading, has_rate_headers, parse_rate_headers

__all__ = (
    "Costs",
    "RateLimitPolicy",
    "RatePacer",
    "RateTicket",
    "existing_pacer",
    "forget_pacers",
    "observe_headers",
    "observe_response",
    "pacer_for",
    "request_costs",
    "sending",
)

logger = logging.getLogger(__name__)

Costs = dict[str, float]
"""A request's cost per dimension: `requests`, `tokens`, `input_tokens`, `output_tokens`."""

_PROBE_POLL_S = 0.02
_RATIOS_KEPT = 64  # input counted / estimated, of the latest answers
_MIN_USED_SHARE = 0.05  # a reading that used less of the limit says too little about the rate


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimitPolicy:
    """A per-minute budget of requests and tokens, shared by everything on one key.

    Limits given here are always kept; with `follow_headers`, limits the
    server states in its rate-limit headers (OpenAI's `x-ratelimit-*`,
    Anthropic's `anthropic-ratelimit-*`) are kept too, and its `remaining`
    corrects the estimate. A 429 that still comes is retried as before
    (`RetryPolicy`, `Retry-After` honoured).

    Example:
        ```python
        from langgraph_batch.scheduler import BatchPolicy, RateLimitPolicy

        policy = BatchPolicy(
            rate_limit=RateLimitPolicy(requests_per_min=500, tokens_per_min=200_000)
        )
        ```

    Raises:
        ValueError: a limit or option out of range (the message names it).

    !!! version-added "Added in version 0.2.0"
    """

    requests_per_min: float | None = None
    """Requests per minute (None: only what the headers say)."""
    tokens_per_min: float | None = None
    """Input + output tokens per minute (OpenAI's TPM)."""
    input_tokens_per_min: float | None = None
    """Input tokens per minute (Anthropic's ITPM)."""
    output_tokens_per_min: float | None = None
    """Output tokens per minute (Anthropic's OTPM)."""
    minute_s: float = 60.0
    """Seconds of the limits' minute (what the headers' resets show wins when
    following them). Tests against a time-scaled emulator set it shorter."""
    follow_headers: bool = True
    """Learn limits and what is left from the server's rate-limit headers."""
    probe: bool = True
    """Until a key's first answer: send one request alone and hold the rest
    until it tells the limits (or that there are none) and how the server
    counts tokens (estimates are calibrated on its usage), so that a first
    burst of siblings neither overruns a budget nobody knew nor books it
    at generous estimates."""
    headroom: float = 0.95
    """Share of each limit to use (0 < h <= 1): margin for estimates, clocks and requests
    that reach the server late (its full bucket cannot bank that refill): `1 - headroom`
    of the minute (at 0.95, 3 s of a real one; lower it for a time-scaled emulator)."""
    output_tokens_prior: int = 256
    """Output tokens booked for a request without `max_tokens` (settled to the
    real count when it answers)."""

    def __post_init__(self) -> None:
        for name in self.limits_given():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name}={value!r} must be > 0 (or None)")
        if not self.minute_s > 0:
            raise ValueError(f"minute_s={self.minute_s!r} must be > 0")
        if not 0 < self.headroom <= 1:
            raise ValueError(f"headroom={self.headroom!r} must be in (0, 1]")
        if isinstance(self.output_tokens_prior, bool) or self.output_tokens_prior < 0:
            raise ValueError(f"output_tokens_prior={self.output_tokens_prior!r} must be >= 0")

    def limits_given(self) -> list[str]:
        """The fields of the limits set (`requests_per_min`, ...)."""
        return [
            name
            for name in (
                "requests_per_min",
                "tokens_per_min",
                "input_tokens_per_min",
                "output_tokens_per_min",
            )
            if getattr(self, name) is not None
        ]


_HEADERS_ONLY = RateLimitPolicy(probe=False)
"""The default without a `RateLimitPolicy`: follow headers, never hold a first burst."""


@dataclass(slots=True)
class _Bucket:
    limit: float
    """The server's per-minute limit (headroom not applied)."""
    window_s: float
    level: float
    stamp: float
    explicit: bool
    headroom: float

    @property
    def capacity(self) -> float:
        return self.limit * self.headroom

    @property
    def per_s(self) -> float:
        return self.capacity / self.window_s

    def refill(self, now: float) -> float:
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.per_s)
            self.stamp = now
        return self.level

    def wait_s(self, cost: float, now: float) -> float:
        # A request larger than the bucket waits for a full bucket, then goes.
        need = min(cost, self.capacity)
        return max(0.0, (need - self.refill(now)) / self.per_s)


@dataclass(slots=True, eq=False)
class RateTicket:
    """One booking: what was reserved and when it may be sent."""

    costs: Costs
    send_at: float
    probe: bool = False
    done: bool = False
    sent_at: float | None = None
    """When it went to the server (`sending`); None: not yet."""
    synced: bool = False
    """A reading taken after it was sent already counts what the server charged."""
    raw_input: float = 0.0
    """The input estimate before calibration (`RatePacer.input_scale`)."""
    shape: int = 0
    """Its calibration class: the number of messages."""


@dataclass(slots=True)
class _ProbeState:
    ticket: RateTicket | None = None
    learned: bool = False
    """A response has answered (with or without headers): no more probing."""


class RatePacer:
    """The budget of one key: a token bucket per limited dimension (see the module doc).

    Thread-safe: every method takes the pacer's lock. Times are `time.monotonic` seconds.

    Args:
        digest: a short digest of the key, for logs.

    Example:
        ```python
        pacer = RatePacer("demo")
        pacer.configure(RateLimitPolicy(requests_per_min=60, probe=False), now=0.0)
        ticket, delay = pacer.reserve({"requests": 1}, now=0.0)
        assert delay == 0.0
        ```
    """

    def __init__(self, digest: str) -> None:
        self.digest = digest
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}
        self._policy = _HEADERS_ONLY
        self._probe = _ProbeState()
        self._pending: set[RateTicket] = set()
        # Counted / estimated input, by shape (messages per request): a chat
        # template adds tokens per message that the bytes do not show.
        self._input_ratios: dict[int, collections.deque[float]] = {}
        self._minute_s: float | None = None
        """The limits' minute as the headers show it (None: not seen yet)."""

    def __repr__(self) -> str:
        return f"RatePacer({self.digest!r}, {sorted(self._buckets)})"

    # ---------------------------------------------------------------- configuration

    def configure(self, policy: RateLimitPolicy | None, now: float) -> None:
        """Apply a scheduler's policy: its explicit limits become buckets (lower ones win)."""
        with self._lock:
            policy = policy or _HEADERS_ONLY
            if policy != _HEADERS_ONLY or self._policy == _HEADERS_ONLY:
                self._policy = policy
            for name in policy.limits_given():
                dim = name.removesuffix("_per_min")
                limit = float(getattr(policy, name))
                old = self._buckets.get(dim)
                if old is None or not old.explicit or limit < old.limit:
                    cap = limit * policy.headroom
                    level = cap if old is None else min(old.refill(now), cap)
                    self._buckets[dim] = _Bucket(
                        limit, policy.minute_s, level, now, explicit=True, headroom=policy.headroom
                    )

    @property
    def policy(self) -> RateLimitPolicy:
        """The policy in force."""
        return self._policy

    def limits(self) -> dict[str, float]:
        """The per-minute limit of every paced dimension."""
        with self._lock:
            return {dim: b.limit for dim, b in self._buckets.items()}

    @property
    def paces_tokens(self) -> bool:
        """Whether a request's token estimate is needed (a token bucket or a probe)."""
        return any(d != "requests" for d in self._buckets) or self._probing_possible()

    def _probing_possible(self) -> bool:
        policy = self._policy
        return (
            policy.probe
            and not self._probe.learned
            and (policy.follow_headers or bool(self._buckets))
        )

    @property
    def idle(self) -> bool:
        """Nothing to pace: no bucket, no probe (callers skip estimating costs)."""
        return not self._buckets and not self._probing_possible()

    # ---------------------------------------------------------------- requests

    def reserve(
        self, costs: Costs, now: float, *, shape: int = 0
    ) -> tuple[RateTicket | None, float]:
        """Book a request's costs; return its ticket and how long to wait before sending.

        Args:
            costs: the estimated costs (`request_costs`).
            now: `time.monotonic()`.
            shape: the request's calibration class (its number of messages).

        Returns:
            `(ticket, delay)`; `(None, delay)` while another request probes an
            unknown key: ask again after `delay`.
        """
        with self._lock:
            probe = False
            if self._probing_possible():
                if self._probe.ticket is not None:
                    return None, _PROBE_POLL_S
                probe = True
            raw_input = costs.get("input_tokens", 0.0)
            scale = self.input_scale(shape)
            if raw_input and scale < 1.0:
                costs = dict(costs)
                costs["input_tokens"] = raw_input * scale
                costs["tokens"] = costs["input_tokens"] + costs.get("output_tokens", 0.0)
            wait = 0.0
            for dim, bucket in self._buckets.items():
                wait = max(wait, bucket.wait_s(costs.get(dim, 0.0), now))
            for dim, bucket in self._buckets.items():
                bucket.level -= costs.get(dim, 0.0)  # refilled to `now` by wait_s
            booked = {d: costs.get(d, 0.0) for d in self._buckets}
            ticket = RateTicket(booked, now + wait, probe=probe, raw_input=raw_input, shape=shape)
            if probe:
                self._probe.ticket = ticket
            self._pending.add(ticket)
            return ticket, wait

    def input_scale(self, shape: int = 0) -> float:
        """What input estimates of a shape are multiplied by (at most 1).

        The largest counted / estimated ratio among the latest answers of that
        shape (of any shape while it has none): estimates start generous and
        only come down to what the server counts.
        """
        ratios = self._input_ratios.get(shape)
        if ratios:
            return min(1.0, max(ratios))
        seen = [max(r) for r in self._input_ratios.values() if r]
        return min(1.0, max(seen)) if seen else 1.0

    def release(self, ticket: RateTicket, now: float) -> None:
        """Give back a booking the server never charged (never sent, or refused with 429)."""
        with self._lock:
            if ticket.done:
                return
            ticket.done = True
            self._pending.discard(ticket)
            self._end_probe(ticket, learned=False)
            for dim, cost in ticket.costs.items():
                bucket = self._buckets.get(dim)
                if bucket is not None:
                    bucket.refill(now)
                    bucket.level = min(bucket.capacity, bucket.level + cost)

    def settle(
        self, ticket: RateTicket, actual: Costs | None, now: float, *, calibrate: bool = True
    ) -> None:
        """Replace a booking's estimate by what the server reported using (None: keep it).

        `calibrate=False`: the figures are a share of a batched call's usage,
        right in sum but not per request: they settle, they do not calibrate.
        """
        with self._lock:
            if ticket.done:
                return
            ticket.done = True
            self._pending.discard(ticket)
            self._end_probe(ticket, learned=True)
            if actual is None:
                return
            counted = actual.get("input_tokens")
            if calibrate and counted is not None and ticket.raw_input > 0:
                ratios = self._input_ratios.get(ticket.shape)
                if ratios is None:
                    ratios = self._input_ratios[ticket.shape] = collections.deque(
                        maxlen=_RATIOS_KEPT
                    )
                ratios.append(counted / ticket.raw_input)
            out_extra = actual.get("output_tokens", 0.0) - ticket.costs.get("output_tokens", 0.0)
            for dim, bucket in self._buckets.items():
                if dim not in actual:
                    continue
                if ticket.synced:
                    # A reading already showed the server's charge on admission;
                    # only its settling of the output is still to come.
                    extra = out_extra if dim in ("tokens", "output_tokens") else 0.0
                else:
                    extra = actual[dim] - ticket.costs.get(dim, 0.0)
                bucket.refill(now)
                bucket.level = min(bucket.capacity, bucket.level - extra)

    def _end_probe(self, ticket: RateTicket, *, learned: bool) -> None:
        if ticket.probe and self._probe.ticket is ticket:
            self._probe.ticket = None
            self._probe.learned = self._probe.learned or learned

    # ---------------------------------------------------------------- what the server said

    def observe(self, readings: Mapping[str, RateReading], now: float) -> None:
        """Take in a response's rate-limit headers (`parse_rate_headers`).

        An empty `readings` (a response without headers) ends the probe.
        """
        answered = _ANSWERING.get()
        with self._lock:
            self._probe.learned = True
            if not readings or not self._policy.follow_headers:
                return
            # The server took the reading when it admitted the request answered:
            # what was sent after that is not in it. Without knowing which request
            # it answers, every booking no reading has counted yet is left out of
            # it (the safe side: one in flight is counted twice until it settles).
            as_of = answered.sent_at if answered in self._pending else None
            uncounted = []
            for ticket in self._pending:
                if as_of is None:
                    counted = ticket.synced
                else:
                    counted = ticket.sent_at is not None and ticket.sent_at <= as_of
                    ticket.synced = ticket.synced or counted
                if not counted:
                    uncounted.append(ticket)
            for reading in readings.values():
                self._learn_minute(reading)
            for dim, reading in readings.items():
                self._observe_one(dim, reading, now, uncounted)

    def mark_sent(self, ticket: RateTicket, now: float) -> None:
        """Record that a booking's request went to the server (see `sending`)."""
        with self._lock:
            if ticket.sent_at is None:
                ticket.sent_at = now

    def _learn_minute(self, reading: RateReading) -> None:
        # A bucket refills at limit / minute: full again in reset = used x minute / limit.
        # Every limit of a provider shares the minute; the one used most tells it best.
        used = reading.limit - reading.remaining
        if reading.reset_s is None or not reading.reset_s > 0:
            return
        if used < _MIN_USED_SHARE * reading.limit:
            return
        seen = reading.reset_s * reading.limit / used
        self._minute_s = seen if self._minute_s is None else 0.5 * self._minute_s + 0.5 * seen

    def _observe_one(
        self, dim: str, reading: RateReading, now: float, uncounted: list[RateTicket]
    ) -> None:
        policy = self._policy
        bucket = self._buckets.get(dim)
        window = self._minute_s if self._minute_s is not None else policy.minute_s
        if bucket is None:
            cap = reading.limit * policy.headroom
            bucket = _Bucket(
                reading.limit, window, cap, now, explicit=False, headroom=policy.headroom
            )
            self._buckets[dim] = bucket
            logger.debug(
                "rate budget %s: %s limited to %s per %.3g s",
                self.digest,
                dim,
                reading.limit,
                window,
                extra={"rate_key": self.digest, "dimension": dim, "limit": reading.limit},
            )
        elif not bucket.explicit:
            bucket.refill(now)
            bucket.limit, bucket.window_s = reading.limit, window
        # What the server has left, less the headroom and what is booked here
        # that the reading does not count (not yet sent, or sent after it was
        # taken), can only lower the bucket (a raise could overbook requests on
        # their way), and estimates are calibrated on the server's counts
        # (`input_scale`).
        missed = sum(t.costs.get(dim, 0.0) for t in uncounted)
        server_left = reading.remaining - reading.limit * (1 - bucket.headroom) - missed
        bucket.level = min(bucket.refill(now), server_left)


_ANSWERING: contextvars.ContextVar[RateTicket | None] = contextvars.ContextVar(
    "langgraph_batch_rate_ticket", default=None
)
"""The booking of the request this task is sending: the one a reading answers."""


@contextlib.contextmanager
def sending(pacer: RatePacer, ticket: RateTicket | None) -> Iterator[None]:
    """Around one request's call: mark its booking sent, and name it to readings.

    A response's rate-limit headers are read inside the call (the HTTP
    transport's hook, a LangChain model's response metadata), in this task or
    a copy of its context: `observe` then knows which request the reading
    answers and so which bookings it cannot count.
    """
    if ticket is None:
        yield
        return
    pacer.mark_sent(ticket, time.monotonic())
    token = _ANSWERING.set(ticket)
    try:
        yield
    finally:
        _ANSWERING.reset(token)


def request_costs(
    messages: Any, tools: Any, params: Mapping[str, Any], *, output_prior: int
) -> Costs:
    """A request's estimated cost per dimension, before sending it.

    Args:
        messages: the OpenAI-format messages.
        tools: the tools bound (their schemas count as input), or None.
        params: the body's other fields (`max_tokens`, `max_completion_tokens`).
        output_prior: output tokens to book when the request sets no maximum.

    Returns:
        `requests` 1, `input_tokens` (generous), `output_tokens` and their sum `tokens`.
    """
    try:
        nbytes = len(json.dumps([messages, tools], ensure_ascii=False, default=str).encode())
    except (TypeError, ValueError):
        nbytes = len(str(messages).encode()) + len(str(tools).encode())
    count = len(messages) if isinstance(messages, list) else 1
    inp = float(generous_tokens(nbytes, messages=count))
    raw = params.get("max_completion_tokens", params.get("max_tokens"))
    out = float(raw) if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else 0.0
    if raw is None:
        out = float(output_prior)
    return {"requests": 1.0, "input_tokens": inp, "output_tokens": out, "tokens": inp + out}


@dataclass(slots=True)
class _Registry:
    pacers: dict[str, RatePacer] = field(default_factory=dict)
    """By digest: the budget's identity."""
    by_key: dict[str, RatePacer] = field(default_factory=dict)
    """By backend key (no secret: keys hold digests): one lookup per response."""
    lock: threading.Lock = field(default_factory=threading.Lock)


_REGISTRY = _Registry()


def pacer_for(key: str) -> RatePacer:
    """The process's one pacer for a backend key (created on first use).

    Keyed by a sha256 of `key`: equal endpoints and credentials share it,
    different ones never do, and the map holds no secret.
    """
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    with _REGISTRY.lock:
        pacer = _REGISTRY.pacers.get(digest)
        if pacer is None:
            pacer = _REGISTRY.pacers[digest] = RatePacer(digest)
        _REGISTRY.by_key[key] = pacer
        return pacer


def existing_pacer(key: str) -> RatePacer | None:
    """The pacer of a key if some scheduler made one (backends only feed existing ones)."""
    return _REGISTRY.by_key.get(key)


def forget_pacers() -> None:
    """Drop every pacer (tests)."""
    with _REGISTRY.lock:
        _REGISTRY.pacers.clear()
        _REGISTRY.by_key.clear()


def observe_response(key: str, request: Any, response: Any) -> None:
    """Feed one HTTP response's rate-limit headers to the key's pacer, if it has one.

    Only answers to POSTs (inference calls) count: a `GET /metrics` without
    headers must not end a probe. `request` and `response` are httpx's.
    """
    pacer = existing_pacer(key)
    if pacer is None or request.method != "POST":
        return
    headers = response.headers
    readings = parse_rate_headers(headers) if has_rate_headers(headers) else {}
    pacer.observe(readings, time.monotonic())


def observe_headers(key: str, headers: Mapping[str, str] | None) -> None:
    """Feed headers a chat model's response metadata carried (LangChain models)."""
    pacer = existing_pacer(key)
    if pacer is None:
        return
    readings = parse_rate_headers(headers) if headers and has_rate_headers(headers) else {}
    pacer.observe(readings, time.monotonic())
