"""Which idle siblings of a fan_out run give up their KV bookings first.

When the server's booked tokens outgrow its budget, the admission gate
(`_admission.SiblingAdmission._shed`) pauses siblings that hold no place (in
a tool, or waiting to come back) in the order `pause_order` gives:

- long waits first, the longest first: a wait that outlasted 90% of its
  tool's calls (`ContextForecast.long_wait`), whose KV would idle longest;
- then the most recently admitted: the least progress, the smallest context
  to prefill again;
- the run's last cohort last: the run's end waits on it.

With a second KV tier on the server (`tier_room` > 0) the siblings whose
context the tier can take go first (`_tier_first`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from langgraph_batch._context import SiblingInfo
from langgraph_batch.nodes._forecast import ContextForecast

__all__ = ("pause_order",)

_Key = Callable[[SiblingInfo], tuple[int, float]]


def pause_order(
    idle: Iterable[SiblingInfo],
    *,
    now: float,
    waits: Mapping[str, float],
    admitted: Mapping[str, int],
    contexts: Mapping[str, int],
    forecast: ContextForecast,
    tier_room: int = 0,
) -> list[SiblingInfo]:
    """`idle` in the order their bookings are given up.

    Args:
        idle: booked siblings that hold no place.
        now: the gate's clock.
        waits: when each sibling entered its tool (the gate's clock).
        admitted: each sibling's admission sequence number.
        contexts: the context each sibling is booked with.
        forecast: the run's learned tool waits.
        tier_room: tokens of paused contexts the server's second tier may still take.

    Example:
        ```python
        order = pause_order(idle, now=clock(), waits={}, admitted={}, contexts={},
                            forecast=gate.forecast)
        ```
    """

    def order(s: SiblingInfo) -> tuple[int, float]:
        elapsed = now - waits.get(s.sibling_id, now)
        if s.last_cohort:
            return (2, -elapsed)
        if forecast.long_wait(s.tool_name, elapsed):
            return (0, -elapsed)
        return (1, -admitted.get(s.sibling_id, 0))

    ordered = sorted(idle, key=order)
    if tier_room > 0:
        ordered = _tier_first(ordered, tier_room, order, contexts)
    return ordered


def _tier_first(
    idle: list[SiblingInfo], room: int, order: _Key, contexts: Mapping[str, int]
) -> list[SiblingInfo]:
    """`idle` with the siblings whose context the server's second tier can take first.

    Their context comes back by a transfer from host memory, not a
    recompute, so its size no longer argues for pausing the least
    progressed: among them the largest go first (the most GPU room for
    one pause, so fewer siblings wait to resume), long waits still ahead.
    The others follow in `order`.
    """

    def ctx(s: SiblingInfo) -> int:
        return contexts.get(s.sibling_id, s.context_tokens)

    first: list[SiblingInfo] = []
    for s in sorted(idle, key=lambda s: (order(s)[0], -ctx(s))):
        if 0 < ctx(s) <= room:
            first.append(s)
            room -= ctx(s)
    chosen = {s.sibling_id for s in first}
    return first + [s for s in idle if s.sibling_id not in chosen]
