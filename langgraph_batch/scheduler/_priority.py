"""Priority: which queued request goes first, one object per mode (`Priority`).

`Priority(mode)` parses a `BatchPolicy.priority` mode once (as vLLM's
`create_request_queue(policy)` picks its queue once) and answers everything
that depends on it: the heap key, the engine's integer priority, whether it
keeps conversation recency, and whether it records attained service (LAS).
A key maps an item (and the siblings' attained service) to a number; the
policy core orders its heaps by `(key, seq)`, lower first, so ties go in
arrival order. The same key, as an integer, is what the engine's own
scheduler receives (`Priority.for_engine`, vLLM/SGLang `priority`): the two
orders never disagree.

- `depth_first` (default): the sibling further along (more turns done) goes
  first, so results stream out early and few siblings hold KV at once. Among
  equals, the conversation served most recently goes first (its context is
  the likeliest to be still cached: the engine evicts the least recently
  used). That matters when the live contexts outgrow the cache: agents in a
  simulation loop all call once per tick, and sending them in a fixed order
  every tick defeats LRU (each tick evicts exactly what the next needs
  first); most-recent-first recomputes only what does not fit (measured on
  W9: 16.5M prefill tokens in index order, 6.7-7.4M most-recent-first, the
  minimum 6.4M).
- `las` (least attained service): the sibling that has had the least
  inference time goes first (fair sharing between siblings).
- `fifo`: arrival order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from langgraph_batch.scheduler._item import PolicyItem

__all__ = (
    "PRIORITY_KEYS",
    "PRIORITY_MODES",
    "AttainedService",
    "Priority",
    "PriorityKey",
    "PriorityMode",
    "Recency",
)

PriorityMode = Literal["depth_first", "las", "fifo"]
"""The modes of `BatchPolicy.priority`."""

PRIORITY_MODES: tuple[str, ...] = get_args(PriorityMode)
"""The modes, as `BatchPolicy` checks them."""

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


class Recency:
    """When each conversation last had a call complete (a counter), bounded LRU.

    A conversation is named by its model, system and first user messages
    (`backends.base.conversation_key`), which every later turn repeats.
    """

    __slots__ = ("_clock", "_last")

    def __init__(self) -> None:
        self._last: dict[Hashable, int] = {}
        self._clock = 0

    def get(self, conversation: Hashable | None) -> int:
        """The conversation's last completion (0: never, or forgotten)."""
        return self._last.get(conversation, 0) if conversation is not None else 0

    def record(self, conversation: Hashable) -> None:
        """A call of `conversation` completed now."""
        self._clock += 1
        last = self._last
        last.pop(conversation, None)
        last[conversation] = self._clock  # re-inserted last: the dict is kept in LRU order
        if len(last) > RECENCY_MEMORY:
            del last[next(iter(last))]


RECENCY_MEMORY = 10_000
"""Conversations whose last completion is remembered (the oldest forgotten first):
more than a server's KV cache holds the contexts of (an H100 serving an 8B model
holds ~460k tokens: a few hundred agents' contexts), so a forgotten one is one
whose context the server has evicted anyway."""

_RECENCY_SCALE = 2.0**-40
"""Recency counts to a fraction of a turn: it orders equal turns, never overrides one."""


PriorityKey = Callable[["PolicyItem", AttainedService], float]
"""`key(item, attained) -> float`: lower goes first."""


def _depth_first(item: PolicyItem, attained: AttainedService) -> float:
    return -item.turn - item.recency * _RECENCY_SCALE


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


class Priority:
    """One priority mode, parsed once: the heap key, the engine's priority, recency, LAS.

    Args:
        mode: a `BatchPolicy.priority` mode.

    Raises:
        ValueError: `mode` is not one of `PRIORITY_MODES`.

    Example:
        ```python
        priority = Priority("las")
        priority.served("g/0", 2.5)
        item = PolicyItem(turn=1, sibling_id="g/0")
        assert priority.key(item) == 2.5 and priority.for_engine(item) == 2500
        ```
    """

    __slots__ = ("_key", "attained", "mode", "recency", "records_service")

    def __init__(self, mode: PriorityMode) -> None:
        if mode not in PRIORITY_KEYS:
            raise ValueError(f"priority={mode!r} is not one of {', '.join(PRIORITY_MODES)}")
        self.mode: PriorityMode = mode
        self._key = PRIORITY_KEYS[mode]
        self.records_service = mode == "las"
        """Whether completed calls add to their sibling's attained service (LAS)."""
        self.attained = AttainedService()
        """Inference seconds per sibling (recorded in `las` mode only)."""
        self.recency: Recency | None = Recency() if mode == "depth_first" else None
        """When each conversation last completed a call (`depth_first` only)."""

    def key(self, item: PolicyItem) -> float:
        """The heap key of `item` (lower first); reads its conversation's recency first."""
        if self.recency is not None:
            item.recency = self.recency.get(item.conversation)
        return self._key(item, self.attained)

    def for_engine(self, item: PolicyItem) -> int:
        """The key as the engine's integer `priority` (lower runs first).

        vLLM runs lower values first; SGLang's sign is the backend's
        (`SGLangBackend.engine_priority`), so both orders agree with the queue's.
        """
        if self.mode == "las":
            return int(self.attained.get(item.sibling_id) * _LAS_ENGINE_SCALE)
        if self.mode == "depth_first":
            return -item.turn  # recency orders equal turns here only: the engine's is an int
        return int(self._key(item, self.attained))

    def served(self, sibling_id: Hashable, seconds: float) -> None:
        """A call of `sibling_id` held a slot for `seconds` (counted in `las` mode)."""
        if self.records_service:
            self.attained.record(sibling_id, seconds)

    def completed(self, conversation: Hashable | None) -> None:
        """A call of `conversation` completed (remembered in `depth_first` mode)."""
        if self.recency is not None and conversation is not None:
            self.recency.record(conversation)
