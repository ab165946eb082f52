"""The admission gate of one fan_out run: at most `max_active` siblings ACTIVE at once.

A sibling is ACTIVE while it runs model nodes; it holds no place while it
waits for the gate or runs a tool. Two FIFO waiter queues: siblings coming
back from a tool (their KV prefix is still cached on the server) are let in
before fresh siblings, so cached prefixes get reused instead of evicted by
newcomers.

The gate implements `langgraph_batch._context.Admission`; the tool hooks
reach it through `SiblingInfo.tool_enter()` / `tool_exit()`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from dataclasses import dataclass

from langgraph_batch._context import SiblingInfo

__all__ = ("AdmissionStats", "SiblingAdmission")

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionStats:
    """A snapshot of the gate."""

    max_active: int | None
    """The cap; None means unlimited."""
    active: int
    """Siblings holding a place now."""
    waiting_fresh: int
    """Siblings that have not started yet, waiting for a place."""
    waiting_returning: int
    """Siblings back from a tool, waiting for a place."""
    peak_active: int
    """The most siblings that held a place at the same time."""


class SiblingAdmission:
    """A gate on ACTIVE siblings with two waiter queues (returning before fresh).

    Args:
        max_active: how many siblings may hold a place at once; None for no cap.

    Raises:
        ValueError: if `max_active` is not a positive integer or None.

    Example:
        ```python
        gate = SiblingAdmission(max_active=8)
        await gate.acquire(info, returning=False)
        try:
            ...  # run the sibling's model nodes
        finally:
            gate.release(info)
        ```
    """

    def __init__(self, *, max_active: int | None = None) -> None:
        if max_active is not None and (isinstance(max_active, bool) or max_active < 1):
            raise ValueError(f"max_active must be a positive int or None, got {max_active!r}")
        self._max_active = max_active
        self._holders: set[str] = set()
        self._fresh: collections.deque[tuple[str, asyncio.Future[None]]] = collections.deque()
        self._returning: collections.deque[tuple[str, asyncio.Future[None]]] = collections.deque()
        self._peak = 0

    @property
    def max_active(self) -> int | None:
        """The cap on active siblings (None: unlimited)."""
        return self._max_active

    @property
    def active(self) -> int:
        """How many siblings hold a place now."""
        return len(self._holders)

    def holds(self, sibling: SiblingInfo) -> bool:
        """Whether `sibling` holds a place now."""
        return sibling.sibling_id in self._holders

    def stats(self) -> AdmissionStats:
        """A snapshot of the gate's counters."""
        return AdmissionStats(
            max_active=self._max_active,
            active=len(self._holders),
            waiting_fresh=sum(1 for _, f in self._fresh if not f.done()),
            waiting_returning=sum(1 for _, f in self._returning if not f.done()),
            peak_active=self._peak,
        )

    def _has_room(self) -> bool:
        return self._max_active is None or len(self._holders) < self._max_active

    def _grant(self, sibling_id: str) -> None:
        self._holders.add(sibling_id)
        self._peak = max(self._peak, len(self._holders))

    async def acquire(self, sibling: SiblingInfo, *, returning: bool) -> None:
        """Wait for an active place.

        Returning siblings overtake fresh ones; within each queue it is first
        come, first served. Cancelling the wait withdraws it (a place granted
        at the same moment is passed on to the next waiter).

        Args:
            sibling: the sibling asking.
            returning: True when it comes back from a tool (preferred).
        """
        sid = sibling.sibling_id
        if sid in self._holders:
            return
        # A fresh sibling also queues behind returning ones, so that a free
        # place always goes to whoever comes back from a tool first.
        blocked = bool(self._returning) or (not returning and bool(self._fresh))
        if self._has_room() and not blocked:
            self._grant(sid)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._returning if returning else self._fresh
        entry = (sid, fut)
        queue.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # Granted just as we were cancelled: hand the place on.
                self.release(sibling)
            else:
                with contextlib.suppress(ValueError):
                    queue.remove(entry)
                self._wake()
            raise

    def release(self, sibling: SiblingInfo) -> None:
        """Give `sibling`'s place back (no-op if it holds none) and admit the next waiter."""
        sid = sibling.sibling_id
        if sid not in self._holders:
            return
        self._holders.discard(sid)
        self._wake()

    def _wake(self) -> None:
        while self._has_room():
            entry = self._pop_waiter()
            if entry is None:
                return
            sid, fut = entry
            self._grant(sid)
            fut.set_result(None)

    def _pop_waiter(self) -> tuple[str, asyncio.Future[None]] | None:
        for queue in (self._returning, self._fresh):
            while queue:
                entry = queue.popleft()
                if not entry[1].done():
                    return entry
        return None
