"""What one fan_out run teaches about its siblings: context growth and tool waits.

The admission gate books, for every resident sibling, the KV it will hold on
the server during its next model call: its context now plus what a turn adds
(the tool result and the next answer). Both come from the run itself:

- a sibling's context after its first call (the task and its first answer,
  less the prefix the siblings share), learned as the mean over siblings
  that made one; before any did, `sibling_tokens` less the shared prefix;
- the growth of one turn: the median of the siblings' observed context
  deltas between consecutive calls; before any, the first-call context
  (a turn adds about as much as the task, a guess that the first deltas
  replace within a few turns);
- per tool, the latencies of its calls, so a wait that has outlasted 90% of
  that tool's calls is known to be a long one (`long_wait`): its sibling's
  KV would sit idle longest, so it is the first whose booking the gate
  gives up when the server's cache is needed (Continuum's TTL idea, learned
  per tool instead of set by hand).

Everything is bounded (the last `MEMORY` observations) and O(1) or O(log n)
per event: the gate calls it on every tool entry and exit.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Hashable

__all__ = ("LONG_WAIT_QUANTILE", "MEMORY", "MIN_TOOL_SAMPLES", "ContextForecast")

MEMORY = 256
"""Observations kept per statistic (the oldest are forgotten): the run's recent behaviour."""

MIN_TOOL_SAMPLES = 8
"""Calls of a tool seen before its latency distribution says what a long wait is."""

LONG_WAIT_QUANTILE = 0.9
"""A wait longer than this quantile of its tool's latencies is a long one."""


class _Window:
    """The last `MEMORY` values, sorted, for quantiles; and their sum, for the mean."""

    __slots__ = ("_order", "_sorted", "_sum")

    def __init__(self) -> None:
        self._order: collections.deque[float] = collections.deque()
        self._sorted: list[float] = []
        self._sum = 0.0

    def __len__(self) -> int:
        return len(self._order)

    def add(self, value: float) -> None:
        if len(self._order) == MEMORY:
            old = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
            self._sum -= old
        self._order.append(value)
        bisect.insort(self._sorted, value)
        self._sum += value

    def mean(self) -> float:
        return self._sum / len(self._order)

    def quantile(self, q: float) -> float:
        s = self._sorted
        return s[min(len(s) - 1, max(0, int(q * len(s))))]


class ContextForecast:
    """A run's learned sizes: first-call context, growth per turn, tool latencies.

    Args:
        sibling_tokens: the prior for one sibling's first-call context (its
            prompt and answer, the shared prefix included), until siblings
            have shown theirs.

    Example:
        ```python
        forecast = ContextForecast(sibling_tokens=4096)
        forecast.observe_context("run/0", 1800, shared=3000)  # after its first call
        forecast.observe_context("run/0", 3100, shared=3000)  # after its second: +1300
        forecast.booking(3100)  # 3100 + 1300: what it holds during its next call
        ```
    """

    def __init__(self, *, sibling_tokens: int) -> None:
        self._prior = sibling_tokens
        self._shared = 0
        self._first = _Window()
        self._growth = _Window()
        self._last: dict[Hashable, int] = {}
        self._tools: dict[str, _Window] = {}
        self._all_tools = _Window()

    @property
    def first_context(self) -> int:
        """Estimated own context of a sibling after its first call (tokens)."""
        if len(self._first):
            return max(1, round(self._first.mean()))
        return max(1, self._prior - self._shared)

    @property
    def growth(self) -> int:
        """Estimated tokens one more turn adds to a sibling's context."""
        if len(self._growth):
            return max(0, round(self._growth.quantile(0.5)))
        return self.first_context

    def fresh_booking(self) -> int:
        """What a sibling that has not started will hold during its first call."""
        return self.first_context

    def booking(self, context_tokens: int) -> int:
        """What a sibling with `context_tokens` of its own will hold during its next call."""
        if context_tokens <= 0:
            return self.fresh_booking()
        return context_tokens + self.growth

    def observe_context(self, sibling_id: Hashable, context_tokens: int, *, shared: int) -> None:
        """Learn from a sibling's context after a completed call (0 or less: nothing known).

        The first value of a sibling teaches the first-call size, each later
        one the growth of a turn (a shrinking context, after trimming, counts
        as no growth).
        """
        if context_tokens <= 0:
            return
        self._shared = max(self._shared, shared)
        previous = self._last.get(sibling_id)
        if previous is None:
            self._first.add(context_tokens)
        elif context_tokens != previous:
            self._growth.add(max(0, context_tokens - previous))
        self._last[sibling_id] = context_tokens

    def forget(self, sibling_id: Hashable) -> None:
        """The sibling finished: drop its last context (its observations stay)."""
        self._last.pop(sibling_id, None)

    def observe_tool(self, name: str, seconds: float) -> None:
        """Learn one completed tool wait of `name`."""
        if seconds < 0:
            return
        window = self._tools.get(name)
        if window is None:
            window = self._tools[name] = _Window()
        window.add(seconds)
        self._all_tools.add(seconds)

    def expected_wait(self, name: str | None) -> float | None:
        """How long a wait on `name` lasts at most, 9 times in 10 (seconds; None: unknown).

        The `LONG_WAIT_QUANTILE` of the tool's waits once it has
        `MIN_TOOL_SAMPLES`; for a tool not seen that often (or no name), the
        same quantile over every tool's waits; None before the run has that
        many. A retention hint kept this long covers the waits that are not
        long ones, and the long ones are the gate's first to give up.
        """
        window = self._tools.get(name or "")
        if window is None or len(window) < MIN_TOOL_SAMPLES:
            window = self._all_tools
        if len(window) < MIN_TOOL_SAMPLES:
            return None
        return window.quantile(LONG_WAIT_QUANTILE)

    def long_wait(self, name: str | None, elapsed: float) -> bool:
        """Whether a wait on `name` that has lasted `elapsed` s is a long one.

        False until the tool has `MIN_TOOL_SAMPLES` calls behind it.
        """
        window = self._tools.get(name or "")
        if window is None or len(window) < MIN_TOOL_SAMPLES:
            return False
        return elapsed > window.quantile(LONG_WAIT_QUANTILE)
