"""Counters and latency reservoirs behind `Scheduler.stats()`.

The recorder is written on the hot path (a few integer additions and two
deque appends per request) and summarised only when `stats()` is called.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass

from langgraph_batch._observe import sinks
from langgraph_batch.backends.base import Usage

__all__ = ("SchedulerStats", "StatsRecorder")


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerStats:
    """A snapshot of a scheduler's load and history.

    Latencies are in seconds, over the last `BatchPolicy.stats_window`
    finished requests (0.0 when there are none yet).

    Example:
        ```python
        s = scheduler.stats()
        print(f"{s.in_flight}/{s.inflight_limit} on the wire, {s.queued} queued, "
              f"p95 queue wait {s.queue_wait_p95 * 1000:.1f} ms")
        ```
    """

    queued: int
    """Requests waiting for a slot now (those held behind a prefix warm-up included)."""
    in_flight: int
    """Requests on the wire now (a batch counts once per member)."""
    inflight_limit: int
    """The current adaptive in-flight limit (was `max_inflight`, a deprecated alias)."""
    completed: int
    """Requests that returned a response."""
    failed: int
    """Requests that raised (after their retries), timeouts included."""
    retries: int
    """Retry attempts made (malformed tool calls included)."""
    cancelled: int
    """Requests whose caller was cancelled (queued or in flight)."""
    timed_out: int
    """Requests that hit their `timeout` (also counted in `failed`)."""
    slot_utilisation: float
    """Time-weighted mean of in_flight / limit since the first request (0..1)."""
    batches: int
    """`complete_batch` calls made."""
    batch_size_mean: float
    """Mean requests per `complete_batch` call (0.0 when none)."""
    batch_size_max: int
    """Largest batch sent."""
    prompt_tokens: int
    """Prompt tokens the server reported, summed."""
    completion_tokens: int
    """Completion tokens the server reported, summed."""
    cached_tokens: int
    """Prompt tokens served from the server's prefix cache, where reported."""
    queue_wait_p50: float
    """Median time from submit to slot grant, seconds (all attempts)."""
    queue_wait_p95: float
    """95th percentile of the queue wait, seconds."""
    queue_wait_p99: float
    """99th percentile of the queue wait, seconds."""
    latency_p50: float
    """Median time from submit to response (retries and backoff included), seconds."""
    latency_p95: float
    """95th percentile of the total latency, seconds."""
    latency_p99: float
    """99th percentile of the total latency, seconds."""
    warmups: int = 0
    """Prefix warm-ups started: requests sent alone to warm a new shared prefix."""
    warm_held: int = 0
    """Requests held until a sibling warmed their shared prefix."""
    warm_held_s: float = 0.0
    """Seconds requests spent held behind prefix warm-ups, summed."""
    malformed_tool_calls: int = 0
    """Responses rejected because a tool call was malformed (retried or raised as
    `MalformedToolCallError`)."""
    decode_cap: int | None = None
    """Agent requests the decode cap lets decode at once now, learned from the
    engine's metrics (None: not capping; see `BatchPolicy.decode_cap`)."""
    rate_waits: int = 0
    """Attempts that waited for rate budget (`BatchPolicy.rate_limit`)."""
    rate_wait_s: float = 0.0
    """Seconds attempts waited for rate budget, summed."""

    @property
    def max_inflight(self) -> int:
        """Deprecated: `inflight_limit`."""
        warnings.warn(
            "SchedulerStats.max_inflight is deprecated: read inflight_limit",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.inflight_limit


class StatsRecorder:
    """Mutable counters the scheduler updates; `snapshot` parts go into `SchedulerStats`.

    Example:
        ```python
        rec = StatsRecorder(window=1000)
        rec.record_success(queue_wait=0.01, latency=0.2, usage=None)
        assert rec.completed == 1
        ```
    """

    __slots__ = (
        "batch_items",
        "batch_max",
        "batches",
        "cached_tokens",
        "cancelled",
        "completed",
        "completion_tokens",
        "failed",
        "latency",
        "malformed_tool_calls",
        "name",
        "prompt_tokens",
        "queue_wait",
        "retries",
        "timed_out",
    )

    def __init__(self, *, window: int, name: str = "") -> None:
        self.name = name
        """The scheduler's name, for the observation sinks (`_observe`)."""
        self.completed = 0
        self.failed = 0
        self.retries = 0
        self.cancelled = 0
        self.timed_out = 0
        self.malformed_tool_calls = 0
        self.batches = 0
        self.batch_items = 0
        self.batch_max = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.queue_wait: deque[float] = deque(maxlen=window)
        self.latency: deque[float] = deque(maxlen=window)

    def record_success(self, *, queue_wait: float, latency: float, usage: Usage | None) -> None:
        """Count one answered request."""
        self.completed += 1
        self.queue_wait.append(queue_wait)
        self.latency.append(latency)
        if usage is not None:
            self.prompt_tokens += usage.prompt_tokens
            self.completion_tokens += usage.completion_tokens
            if usage.cached_tokens:
                self.cached_tokens += usage.cached_tokens
        sinks.call(self.name, queue_wait, latency, usage)

    def record_dispatch(self) -> None:
        """One attempt goes on the wire (retries and batch members count each)."""
        sinks.dispatch(self.name)

    def record_failure(self, exc: BaseException) -> None:
        """Count one request that raised to its caller (after its retries)."""
        self.failed += 1
        sinks.failure(self.name, exc)

    def record_retry(self, exc: BaseException) -> None:
        """Count one retry attempt of a failed request."""
        self.retries += 1
        sinks.retry(self.name, exc)

    def record_batch(self, size: int) -> None:
        """Count one `complete_batch` call of `size` requests."""
        self.batches += 1
        self.batch_items += size
        if size > self.batch_max:
            self.batch_max = size
        sinks.batch(self.name, size)

    @staticmethod
    def percentiles(samples: deque[float]) -> tuple[float, float, float]:
        """p50, p95 and p99 (nearest rank) of the samples; zeros when empty."""
        if not samples:
            return (0.0, 0.0, 0.0)
        ordered = sorted(samples)
        n = len(ordered)

        def rank(q: float) -> float:
            return ordered[min(n - 1, max(0, math.ceil(q * n) - 1))]

        return (rank(0.50), rank(0.95), rank(0.99))
