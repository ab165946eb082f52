"""Priority: which queued request goes first, as one pluggable key function.

A key maps an item (and the siblings' attained service) to a number; the
policy core orders its heaps by `(key, seq)`, lower first, so ties go in
arrival order. The same key, as an integer, is what the engine's own
scheduler receives (`engine_priority`, vLLM/SGLang `priority`): the two
orders never disagree.

- `depth_first` (default): the sibling further along (more turns done) goes
  first, so results stream out early and few siblings hold KV at once.
- `las` (least attained service): the sibling that has had the least
  inference time goes first (fair sharing between siblings).
- `fifo`: arrival order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from langgraph_batch.scheduler._config import PriorityMode
    from langgraph_batch.scheduler._item import PolicyItem

__all__ = ("PRIORITY_KEYS", "AttainedService", "PriorityKey", "engine_priority")

LAS_MEMORY = 100_000
"""Siblings whose attained service is remembered (the oldest forgotten first)."""

_LAS_ENGINE_SCALE = 1000
"""LAS seconds to the engine's integer priority: milliseconds."""


class AttainedService:
    """Seconds of inference each sibling has received (the LAS key), bounded LRU."""

    __slots__ = ("_seconds",)

    def __init__(self) -> None:
        self._seconds: dict[Hashable, float] = {}

    def get(self, sibling_id: Hashable | None) -> float:
        """Seconds so far (0 for an unknown or absent sibling)."""
        return self._seconds.get(sibling_id, 0.0) if sibling_id is not None else 0.0

    def record(self, sibling_id: Hashable, seconds: float) -> None:
        """Add `seconds` of service (the sibling becomes the most recently used)."""
        seconds_of = self._seconds
        total = seconds_of.pop(sibling_id, 0.0) + seconds
        seconds_of[sibling_id] = total  # re-inserted last: the dict is kept in LRU order
        if len(seconds_of) > LAS_MEMORY:
            del seconds_of[next(iter(seconds_of))]


PriorityKey = Callable[["PolicyItem", AttainedService], float]
"""`key(item, attained) -> float`: lower goes first."""


def _depth_first(item: PolicyItem, attained: AttainedService) -> float:
    return -item.turn


def _las(item: PolicyItem, attained: AttainedService) -> float:
    return attained.get(item.sibling_id)


def _fifo(item: PolicyItem, attained: AttainedService) -> float:
    return 0


PRIORITY_KEYS: dict[str, PriorityKey] = {
    "depth_first": _depth_first,
    "las": _las,
    "fifo": _fifo,
}
"""The key of each `BatchPolicy.priority` mode."""


def engine_priority(mode: PriorityMode, item: PolicyItem, attained: AttainedService) -> int:
    """The key as the engine's integer `priority` (lower runs first on vLLM and SGLang)."""
    if mode == "las":
        return int(attained.get(item.sibling_id) * _LAS_ENGINE_SCALE)
    return int(PRIORITY_KEYS[mode](item, attained))
