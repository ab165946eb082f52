"""The adaptive in-flight limit: slow start and AIMD, like TCP's congestion window.

Between `min_inflight` and the hard cap. With engine metrics it starts at
`initial_inflight` (raised to the engine's KV capacity /
`kv_tokens_per_request` on the first sample that reports the capacity) and
grows while the server keeps no queue of its own (`num_requests_waiting ==
0`) and we were limit-bound (our queue non-empty with every slot used at some
point since the previous sample): by doubling (slow start) until the first
sign of overload, then by `increase_step` per sample (AIMD). Growth happens at
most once per metrics sample, either when the sample arrives or, when we were
not limit-bound then, at the first limit-bound event while that sample is
fresh (younger than `metrics_interval_s`). HTTP 429/503 and a rising
`num_preemptions_total` shrink the limit multiplicatively and end slow start.
Without engine metrics the limit starts at `inflight_limit` and only recovers
towards it after a decrease, never beyond.
"""

from __future__ import annotations

import math

from langgraph_batch._estimates import requests_fitting
from langgraph_batch.backends.base import EngineMetrics
from langgraph_batch.scheduler._config import BatchPolicy

__all__ = ("InflightLimit",)


class InflightLimit:
    """The limit's state and its rules; the core tells it what happened.

    Example:
        ```python
        limit = InflightLimit(BatchPolicy(inflight_limit=64), has_metrics=True)
        limit.on_bound(now)                  # every slot used, requests waiting
        limit.on_metrics(sample, now, bound_now=True)
        limit.decrease(now)                  # a 429
        ```
    """

    def __init__(self, policy: BatchPolicy, *, has_metrics: bool) -> None:
        self.policy = policy
        self._has_metrics = has_metrics
        self._base = float(policy.inflight_limit)
        self._floor = float(policy.min_inflight)
        self._cap = float(policy.hard_cap)
        self.adapting = has_metrics and policy.adaptive
        """Whether engine metrics drive the limit (and the decode cap may run)."""
        start = policy.inflight_limit
        if self.adapting and policy.initial_inflight is not None:
            start = policy.initial_inflight
        self.exact = float(start)
        """The limit before rounding down."""
        self.value = start
        """The limit in slots (at least 1)."""
        self.slow_start = self.adapting and policy.slow_start
        """Whether the limit still doubles per sample (no overload seen yet)."""
        self._sized = not self.adapting or policy.kv_tokens_per_request is None
        self._interval = policy.metrics_interval_s
        self.saturated = False
        """Limit-bound (queue non-empty, every slot used) since the last sample."""
        self._sample_unspent = False
        self._sample_t = -math.inf
        self._last_decrease = -math.inf
        self._last_preemptions: float | None = None
        self.increases = 0
        """Times the limit grew on engine metrics."""
        self.decreases = 0
        """Times the limit shrank (429/503/preemptions)."""

    def on_bound(self, now: float) -> bool:
        """We are limit-bound now: spend a fresh, unspent sample on growth.

        Returns:
            True when the limit grew (the caller may fill the new slots).
        """
        self.saturated = True
        if self._sample_unspent and now - self._sample_t < self._interval:
            self._grow()
            return True
        return False

    def on_ok(self, *, queued: bool) -> None:
        """A call succeeded: without metrics, recover towards `inflight_limit` (~+1 per window)."""
        if self.policy.adaptive and not self._has_metrics and self.exact < self._base and queued:
            self._set(min(self._base, self.exact + 1.0 / self.exact))

    def on_metrics(self, metrics: EngineMetrics, now: float, *, bound_now: bool) -> None:
        """Adapt to an engine sample (see the module docstring).

        Args:
            metrics: the engine's figures.
            now: the current time, seconds.
            bound_now: limit-bound at this moment (queue non-empty, no slot free).
        """
        self._sample_unspent = False
        saturated = self.saturated
        self.saturated = bound_now
        if not self.policy.adaptive or not self._has_metrics:
            return
        pre = metrics.num_preemptions_total
        last = self._last_preemptions
        if pre is not None:
            self._last_preemptions = pre
            if last is not None and pre > last:
                self.decrease(now)
                return
        if not self._sized and metrics.kv_capacity_tokens:
            self._sized = True
            per_request = self.policy.kv_tokens_per_request
            if self.slow_start and per_request:
                fits = min(
                    self._cap, float(requests_fitting(metrics.kv_capacity_tokens, per_request))
                )
                if fits > self.exact:
                    self._set(fits)
        waiting = metrics.num_requests_waiting
        if waiting is None or waiting > 0:
            return
        self._sample_t = now
        if saturated or self.saturated:
            self._grow()
        else:
            self._sample_unspent = True

    def decrease(self, now: float) -> None:
        """429, 503 or preemptions: shrink multiplicatively (once per cooldown), end slow start."""
        if not self.policy.adaptive or now - self._last_decrease < self.policy.adapt_cooldown_s:
            return
        self._last_decrease = now
        self.slow_start = False
        self._sample_unspent = False
        self.decreases += 1
        self._set(max(self._floor, self.exact * self.policy.decrease_factor))

    def _grow(self) -> None:
        # Spend the current metrics sample on one increase.
        self._sample_unspent = False
        self.saturated = False
        step = self.exact if self.slow_start else self.policy.increase_step
        value = min(self._cap, self.exact + step)
        if value > self.exact:
            self.increases += 1
            self._set(value)

    def _set(self, value: float) -> None:
        self.exact = value
        self.value = max(int(value), 1)
