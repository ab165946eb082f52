"""Prefix warming: one request computes a shared prompt prefix, the others wait for it.

Every item may carry a `prefix` key (a hash of the shared leading part of its
prompt: system message(s) + tools). The first item with a key that is not
warm becomes its LEADER and is queued normally; later items with the same
key are HELD (out of the heaps, no slot) until the runner reports the
leader's first token (`on_first_token`) or the leader completes. Then the
key is warm and the held items rejoin the queue with their original priority
entries. A leader that fails, is cancelled or withdrawn hands the lead to
the best held item. Warm keys live in a bounded LRU and expire after
`warm_ttl_s` without use (the engine's radix cache may have evicted the
prefix by then).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from langgraph_batch.scheduler._item import HELD, PolicyItem

__all__ = ("WARM_MEMORY", "WarmingGate")

WARM_MEMORY = 4096
"""Warm prefix keys remembered (least recently used forgotten first)."""


class WarmingGate:
    """Leaders, held items and warm keys; the core queues what it hands back.

    Example:
        ```python
        gate = WarmingGate(ttl=30.0)
        if not gate.admit(item, now):
            gate.hold(item, now)                 # a leader is warming its prefix
        ...
        for released in gate.end_lead(leader, warm=True, now=now):
            core_queue(released)                 # the prefix is warm
        ```
    """

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._warm: OrderedDict[Hashable, float] = OrderedDict()
        self._leaders: dict[Hashable, PolicyItem] = {}
        self._held: dict[Hashable, list[PolicyItem]] = {}
        self.held_count = 0
        """Items held now."""
        self.warmups = 0
        """Leaders dispatched (prefix warm-ups started)."""
        self.held_total = 0
        """Items that were held behind a warming leader."""
        self.held_s = 0.0
        """Seconds items spent held behind leaders, summed."""

    def is_warm(self, prefix: Hashable, now: float) -> bool:
        """Whether a prefix key is warm now (warmed and used within the TTL)."""
        t = self._warm.get(prefix)
        return t is not None and now - t <= self._ttl

    def admit(self, item: PolicyItem, now: float) -> bool:
        """May the item be queued now (True: its prefix is warm, or it leads), or held?"""
        key = item.prefix
        leader = self._leaders.get(key)
        if leader is item:
            return True
        if leader is not None:
            item.leading = False
            return False
        warm = self._warm
        t = warm.get(key)
        if t is not None and now - t <= self._ttl:
            warm[key] = now
            warm.move_to_end(key)
            item.leading = False
            return True
        self._leaders[key] = item
        item.leading = True
        return True

    def hold(self, item: PolicyItem, now: float) -> None:
        """Hold an item that `admit` refused until its leader ends."""
        item.state = HELD
        item.held_at = now
        self._held.setdefault(item.prefix, []).append(item)
        self.held_count += 1
        self.held_total += 1

    def unhold(self, item: PolicyItem, now: float) -> None:
        """Take a held item out (its caller went away)."""
        self.held_count -= 1
        self.held_s += now - item.held_at
        held = self._held[item.prefix]
        held.remove(item)
        if not held:
            del self._held[item.prefix]

    def touch(self, key: Hashable, now: float) -> None:
        """A call with a warm prefix succeeded: the key stays warm longer."""
        warm = self._warm
        if key in warm:
            warm[key] = now
            warm.move_to_end(key)

    def end_lead(self, item: PolicyItem, *, warm: bool, now: float) -> list[PolicyItem]:
        """The leader's warm-up ended.

        Warm: it got its first token or finished. Not warm: it failed, was
        cancelled or withdrawn.

        Keeps `item.leading` as it is (the heap routing of a queued leader
        depends on it) apart from unmarking a warmed leader, which has left
        the queue already.

        Returns:
            The items to queue, in order: every held item when warm, else the
            best held one, which now leads.
        """
        key = item.prefix
        if self._leaders.get(key) is not item:
            return []
        del self._leaders[key]
        if warm:
            item.leading = False
            w = self._warm
            w[key] = now
            w.move_to_end(key)
            if len(w) > WARM_MEMORY:
                w.popitem(last=False)
            held = self._held.pop(key, None)
            if not held:
                return []
            self.held_count -= len(held)
            for it in held:
                self.held_s += now - it.held_at
            return held
        held = self._held.get(key)
        if not held:
            return []
        best = min(held, key=_entry_of)
        held.remove(best)
        if not held:
            del self._held[key]
        self.held_count -= 1
        self.held_s += now - best.held_at
        self._leaders[key] = best
        best.leading = True
        return [best]

    def drain(self) -> list[PolicyItem]:
        """Forget every leader and held item; return the held ones."""
        items = [it for held in self._held.values() for it in held]
        self._held.clear()
        self.held_count = 0
        self._leaders.clear()
        return items


def _entry_of(item: PolicyItem) -> tuple[float, int]:
    e = item.entry
    assert e is not None
    return (e[0], e[1])
