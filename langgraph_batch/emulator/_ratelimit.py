"""Provider-style rate limits for the emulator: token buckets, 429s and limit headers.

What hosted APIs do, emulated so that a client's pacing can be tested
without an account:

- **OpenAI** (https://platform.openai.com/docs/guides/rate-limits, "Rate
  limits in headers"): every response carries `x-ratelimit-limit-requests`,
  `x-ratelimit-limit-tokens`, `x-ratelimit-remaining-requests`,
  `x-ratelimit-remaining-tokens`, `x-ratelimit-reset-requests` and
  `x-ratelimit-reset-tokens`; a reset is "the time until the rate limit
  resets to its initial state", written as a Go duration (`1s`, `6m0s`,
  `20ms`). Tokens count the prompt plus `max_tokens` ("your rate limit is
  calculated as the maximum of max_tokens and the estimated number of
  tokens"); one combined tokens-per-minute limit.
- **Anthropic** (https://docs.anthropic.com/en/api/rate-limits, "Response
  headers"): `anthropic-ratelimit-requests-{limit,remaining,reset}`,
  `anthropic-ratelimit-input-tokens-*`, `anthropic-ratelimit-output-tokens-*`
  and `anthropic-ratelimit-tokens-*` (the most restrictive token limit in
  effect); a reset is an RFC 3339 time, and a 429 carries `retry-after`
  (seconds). The limits are "token bucket" limits: "capacity is continuously
  replenished up to your maximum limit, rather than being reset at fixed
  intervals". Input and output tokens per minute are separate; "OTPM rate
  limits are estimated based on max_tokens at the beginning of each request
  and adjusted at the end of the request to reflect the actual number of
  output tokens used".

One algorithm serves both (the emulator's reading of OpenAI's "resets to its
initial state" is the same continuously refilled bucket): a bucket per
limited dimension holds at most a minute's worth and refills at limit/minute;
a request is admitted only when every bucket holds its cost (else 429 and
nothing is charged); output is charged at `max_tokens` (0 when absent) on
admission and settled to the real count at the end, so a bucket may go
negative, which later requests wait out.

`RateLimiter` is the state, `openai_headers` / `anthropic_headers` write a
`RateSnapshot` in each provider's spelling. The minute is `minute_s` wall
seconds (`60 / time_scale` in the emulator), and resets are in wall time:
what a client must actually wait.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = (
    "DIMENSIONS",
    "Admission",
    "RateLimited",
    "RateLimiter",
    "RateSnapshot",
    "TokenBucket",
    "anthropic_headers",
    "go_duration",
    "openai_headers",
    "rfc3339",
)

DIMENSIONS = ("requests", "tokens", "input_tokens", "output_tokens")
"""What can be limited: requests, input + output tokens (OpenAI's TPM), input
tokens (Anthropic's ITPM), output tokens (Anthropic's OTPM)."""


class TokenBucket:
    """A bucket of `capacity` that refills continuously over `window_s`.

    Args:
        capacity: the most it holds (the per-window limit); it starts full.
        window_s: seconds to refill from empty to full.
        now: the clock's time at creation.

    Example:
        ```python
        bucket = TokenBucket(60, window_s=60.0, now=0.0)
        bucket.take(60, 0.0)
        assert bucket.wait_s(1, 0.0) == 1.0
        ```
    """

    __slots__ = ("capacity", "level", "per_s", "stamp")

    def __init__(self, capacity: float, *, window_s: float, now: float) -> None:
        if not capacity > 0 or not window_s > 0:
            raise ValueError(f"capacity={capacity!r} and window_s={window_s!r} must be > 0")
        self.capacity = float(capacity)
        self.per_s = self.capacity / window_s
        self.level = self.capacity
        self.stamp = now

    def refill(self, now: float) -> float:
        """The level at `now` (the bucket's clock never goes back)."""
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.per_s)
            self.stamp = now
        return self.level

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds until the bucket holds `amount` (inf when it never can)."""
        if amount > self.capacity:
            return math.inf
        return max(0.0, (amount - self.refill(now)) / self.per_s)

    def take(self, amount: float, now: float) -> None:
        """Remove `amount` (a negative amount gives back, up to the capacity)."""
        self.level = min(self.capacity, self.refill(now) - amount)

    def reset_s(self, now: float) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, (self.capacity - self.refill(now)) / self.per_s)


@dataclass(frozen=True, slots=True)
class RateSnapshot:
    """One dimension's state as the headers state it."""

    limit: int
    """The per-minute limit."""
    remaining: int
    """What the bucket holds now (never below 0)."""
    reset_s: float
    """Seconds until the bucket is full."""


@dataclass(slots=True)
class Admission:
    """What an admitted request was charged, for `RateLimiter.settle`."""

    output_charged: int
    """Output tokens charged on admission (its `max_tokens`, or 0)."""
    settled: bool = False


class RateLimited(Exception):
    """A request over a limit: the 429 to send."""

    def __init__(self, dimension: str, retry_after_s: float) -> None:
        super().__init__(f"Rate limit reached for {dimension} per minute.")
        self.dimension = dimension
        self.retry_after_s = retry_after_s


class RateLimiter:
    """Per-minute limits on requests and tokens, as token buckets.

    Args:
        requests_per_min: requests per minute (None: unlimited).
        tokens_per_min: input + output tokens per minute (OpenAI's TPM).
        input_tokens_per_min: input tokens per minute (Anthropic's ITPM).
        output_tokens_per_min: output tokens per minute (Anthropic's OTPM).
        minute_s: wall seconds of one "minute" (shorter under a time scale).
        clock: the time source (tests pass their own).

    Raises:
        ValueError: a limit below 1, or `minute_s <= 0`.

    Example:
        ```python
        limiter = RateLimiter(requests_per_min=60, tokens_per_min=1000)
        ticket = limiter.admit(input_tokens=100, output_tokens=50)  # or RateLimited
        limiter.settle(ticket, output_tokens=20)
        headers = openai_headers(limiter.snapshot())
        ```
    """

    def __init__(
        self,
        *,
        requests_per_min: int | None = None,
        tokens_per_min: int | None = None,
        input_tokens_per_min: int | None = None,
        output_tokens_per_min: int | None = None,
        minute_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not minute_s > 0:
            raise ValueError(f"minute_s={minute_s!r} must be > 0")
        limits = dict(
            zip(
                DIMENSIONS,
                (requests_per_min, tokens_per_min, input_tokens_per_min, output_tokens_per_min),
                strict=True,
            )
        )
        now = clock()
        self._clock = clock
        self.minute_s = minute_s
        self.buckets: dict[str, TokenBucket] = {}
        for name, limit in limits.items():
            if limit is None:
                continue
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError(f"{name} per minute must be an integer >= 1, got {limit!r}")
            self.buckets[name] = TokenBucket(limit, window_s=minute_s, now=now)

    def refill_all(self) -> None:
        """Fill every bucket (`POST /emulator/reset`: a fresh minute)."""
        now = self._clock()
        for bucket in self.buckets.values():
            bucket.level, bucket.stamp = bucket.capacity, now

    @property
    def active(self) -> bool:
        """Whether any limit is set."""
        return bool(self.buckets)

    def _costs(self, input_tokens: int, output_tokens: int, requests: int) -> dict[str, int]:
        costs = {
            "requests": requests,
            "tokens": input_tokens + output_tokens,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
        }
        return {name: costs[name] for name in self.buckets}

    def admit(
        self,
        *,
        input_tokens: int,
        output_tokens: int = 0,
        requests: int = 1,
        now: float | None = None,
    ) -> Admission:
        """Charge one request, or refuse it without charging anything.

        Args:
            input_tokens: the prompt's tokens.
            output_tokens: the output charged up front (the request's `max_tokens`, or 0).
            requests: requests it counts for (a batch call: one per prompt).
            now: the clock's time (default: now).

        Returns:
            The admission, to `settle` when the request ends.

        Raises:
            RateLimited: some bucket cannot pay; its `retry_after_s` is the
                longest wait among them (a minute when a cost exceeds a limit).
        """
        now = self._clock() if now is None else now
        costs = self._costs(input_tokens, output_tokens, requests)
        worst, wait = "", 0.0
        for name, cost in costs.items():
            w = self.buckets[name].wait_s(cost, now)
            if w > wait:
                worst, wait = name, w
        if wait > 0:
            raise RateLimited(worst, min(wait, self.minute_s))
        for name, cost in costs.items():
            self.buckets[name].take(cost, now)
        return Admission(output_charged=output_tokens)

    def settle(self, admission: Admission, *, output_tokens: int, now: float | None = None) -> None:
        """Charge the difference between the output generated and the output charged."""
        if admission.settled:
            return
        admission.settled = True
        now = self._clock() if now is None else now
        extra = output_tokens - admission.output_charged
        for name in ("tokens", "output_tokens"):
            if name in self.buckets:
                self.buckets[name].take(extra, now)

    def snapshot(self, now: float | None = None) -> dict[str, RateSnapshot]:
        """Every limited dimension's limit, what it holds and when it is full."""
        now = self._clock() if now is None else now
        return {
            name: RateSnapshot(
                limit=int(b.capacity),
                remaining=max(0, math.floor(b.refill(now))),
                reset_s=b.reset_s(now),
            )
            for name, b in self.buckets.items()
        }


def go_duration(seconds: float) -> str:
    """A duration as Go's `time.Duration.String` writes it (OpenAI's reset headers).

    Example:
        ```python
        assert go_duration(360) == "6m0s"
        assert go_duration(0.02) == "20ms"
        assert go_duration(1.5) == "1.5s"
        ```
    """
    ms = round(max(0.0, seconds) * 1000)
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    out = f"{hours}h" if hours else ""
    if hours or minutes:
        out += f"{minutes}m"
    return f"{out}{secs}s"


def openai_headers(
    snapshot: dict[str, RateSnapshot], *, retry_after_s: float | None = None
) -> dict[str, str]:
    """OpenAI's `x-ratelimit-*` headers (requests and tokens), plus `retry-after` on a 429.

    Anthropic-only dimensions (input or output tokens alone) have no OpenAI header.
    """
    headers: dict[str, str] = {}
    for name in ("requests", "tokens"):
        snap = snapshot.get(name)
        if snap is None:
            continue
        headers[f"x-ratelimit-limit-{name}"] = str(snap.limit)
        headers[f"x-ratelimit-remaining-{name}"] = str(snap.remaining)
        headers[f"x-ratelimit-reset-{name}"] = go_duration(snap.reset_s)
    if retry_after_s is not None:
        headers["retry-after"] = str(max(1, math.ceil(retry_after_s)))
        headers["retry-after-ms"] = str(max(1, math.ceil(retry_after_s * 1000)))
    return headers


def rfc3339(wall: float) -> str:
    """A wall-clock time as RFC 3339 in UTC, to the millisecond (`...T12:00:00.250Z`)."""
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def anthropic_headers(
    snapshot: dict[str, RateSnapshot],
    *,
    retry_after_s: float | None = None,
    wall_now: float | None = None,
) -> dict[str, str]:
    """Anthropic's `anthropic-ratelimit-*` headers, plus `retry-after` (seconds) on a 429.

    `anthropic-ratelimit-tokens-*` states the most restrictive token limit: the
    token dimension with the least left, relative to its limit.
    """
    wall = time.time() if wall_now is None else wall_now
    headers: dict[str, str] = {}

    def put(prefix: str, snap: RateSnapshot) -> None:
        headers[f"anthropic-ratelimit-{prefix}-limit"] = str(snap.limit)
        headers[f"anthropic-ratelimit-{prefix}-remaining"] = str(snap.remaining)
        headers[f"anthropic-ratelimit-{prefix}-reset"] = rfc3339(wall + snap.reset_s)

    if "requests" in snapshot:
        put("requests", snapshot["requests"])
    for name in ("input_tokens", "output_tokens"):
        if name in snapshot:
            put(name.replace("_", "-"), snapshot[name])
    tokens = [snapshot[n] for n in ("tokens", "input_tokens", "output_tokens") if n in snapshot]
    if tokens:
        put("tokens", min(tokens, key=lambda s: s.remaining / s.limit))
    if retry_after_s is not None:
        headers["retry-after"] = str(max(1, math.ceil(retry_after_s)))
    return headers
