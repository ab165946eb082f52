"""What the server can hold: its KV-cache capacity, and who holds it now.

The scheduler is the one owner of the server's capacity: its metrics poll
keeps the latest sample, and `Scheduler.kv_capacity()` answers from it, or
asks the backend once when no sample came yet. It also owns the server's
`KVLedger`: every fan_out run on that scheduler books its resident siblings
there, so two concurrent runs share one budget instead of each budgeting the
whole cache. Admission gates ask the ledger whether a fresh sibling fits, and
the ledger wakes them when a sibling somewhere finishes (push: nothing polls).

This module is the one place a ledger is made (`make_ledger`, behind
`Scheduler.kv_ledger()` and `ledger_of`) and the one place the capacity rule
is written (`positive_tokens`: a capacity is a positive int, anything else
is unknown), as vLLM's `KVCacheManager` alone allocates blocks.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from typing import Any, Protocol

from langgraph_batch._estimates import kv_budget
from langgraph_batch.backends.base import Backend, EngineMetrics

__all__ = (
    "METRICS_TIMEOUT_S",
    "KVLedger",
    "LedgerMember",
    "ledger_of",
    "make_ledger",
    "positive_tokens",
    "read_kv_capacity",
    "read_kv_tiers",
)

logger = logging.getLogger("langgraph_batch.scheduler")

METRICS_TIMEOUT_S = 2.0
"""How long an unpolled scheduler waits for the server's metrics to learn its capacity."""


async def read_kv_capacity(latest: EngineMetrics | None, backend: Backend) -> int | None:
    """KV capacity in tokens: from `latest`, else one metrics call (None: unknown).

    An unreachable or silent server means an unknown capacity (no KV budget),
    never a failed run: errors are logged at DEBUG.
    """
    return (await read_kv_tiers(latest, backend))[0]


async def read_kv_tiers(
    latest: EngineMetrics | None, backend: Backend
) -> tuple[int | None, int | None]:
    """(KV capacity, second-tier capacity) in tokens, each None where unknown.

    The second tier is KV kept in host memory (vLLM's native CPU offload,
    `--kv-offloading-size`), `EngineMetrics.kv_offload_tokens`. Both come from
    `latest` when it states the capacity, else from one metrics call.
    """
    metrics = latest
    if metrics is None or metrics.kv_capacity_tokens is None:
        try:
            async with asyncio.timeout(METRICS_TIMEOUT_S):
                metrics = await backend.metrics()
        except Exception:
            logger.debug("could not read the server's KV capacity", exc_info=True)
            return None, None
    if metrics is None:
        return None, None
    return positive_tokens(metrics.kv_capacity_tokens), positive_tokens(metrics.kv_offload_tokens)


def positive_tokens(value: object) -> int | None:
    """The capacity rule: a token count is a positive int; anything else is unknown (None)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def make_ledger(capacity: object, *, offload_capacity: int | None = None) -> KVLedger | None:
    """A ledger for a server of `capacity` tokens (None: the capacity is unknown).

    The one constructor call of `KVLedger` in the library: `Scheduler.kv_ledger()`
    makes the server's shared one with it, `ledger_of` a run's own for a
    scheduler that only says its capacity.
    """
    tokens = positive_tokens(capacity)
    return None if tokens is None else KVLedger(tokens, offload_capacity=offload_capacity)


async def ledger_of(scheduler: Any) -> KVLedger | None:
    """The KV ledger a fan_out run books on `scheduler` (None: no KV budget).

    Every run on one `Scheduler` books the same ledger (`Scheduler.kv_ledger`),
    so concurrent runs share the server's capacity. A custom scheduler that
    only says its capacity (`kv_capacity()`) gets a ledger of the run's own;
    one that says neither gets none. An unknown capacity means no budget,
    never a failed run: errors are logged at DEBUG.
    """
    ask = getattr(scheduler, "kv_ledger", None)
    if callable(ask):
        try:
            ledger = await ask()
        except Exception:
            logger.debug("fan_out: the scheduler could not give its KV ledger", exc_info=True)
            return None
        return ledger if isinstance(ledger, KVLedger) else None
    ask = getattr(scheduler, "kv_capacity", None)
    if not callable(ask):
        return None
    try:
        capacity = await ask()
    except Exception:
        logger.debug("fan_out: the scheduler could not say its KV capacity", exc_info=True)
        return None
    return make_ledger(capacity)


class LedgerMember(Protocol):
    """One booker of the ledger: a fan_out run's admission gate."""

    @property
    def active(self) -> int:
        """Its siblings holding an ACTIVE place now."""
        ...

    def resident_tokens(self) -> int:
        """Estimated KV tokens its resident siblings hold now."""
        ...

    def wake(self) -> None:
        """Re-check its waiters (room was freed); called in the member's loop."""
        ...

    def paused_tokens(self) -> int:
        """Estimated KV tokens of its paused siblings (what the second tier may hold)."""
        ...


class KVLedger:
    """The resident-KV budget of one server, shared by every run booking it.

    Each member (a fan_out run's gate) reports its active siblings and the
    estimated KV tokens of its resident ones; `fits` answers for a newcomer
    against the sum over all members, and `active` lets a gate whose cap was
    derived from the capacity count every run's active siblings against it.
    When nothing is resident anywhere a newcomer always fits, so the ledger
    cannot deadlock. `freed` (a member's sibling finished, or a member
    left) wakes the other members first, then the one that freed, so capacity
    a run gives back goes first to runs that were waiting for it.

    Members are held weakly: a run that vanished without `leave` stops counting.
    Members may live in different event loops (threads): the member set is
    changed and read under a lock, and each member is asked on a snapshot.

    With a second tier (`offload_capacity`: KV the server keeps in host
    memory, vLLM's `--kv-offloading-size`), the ledger also sums the members'
    paused contexts, so a gate knows whether one more paused context would
    come back by transfer (it fits the tier beside the others) or by recompute.

    Args:
        capacity: the server's KV cache size in tokens.
        offload_capacity: the server's second tier in tokens (None: none).

    Example:
        ```python
        ledger = await scheduler.kv_ledger()  # None: the server does not say
        if ledger is not None and ledger.fits(4096, headroom=0.85):
            ...
        ```
    """

    def __init__(self, capacity: int, *, offload_capacity: int | None = None) -> None:
        if positive_tokens(capacity) is None:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if offload_capacity is not None and positive_tokens(offload_capacity) is None:
            raise ValueError(
                f"offload_capacity must be a positive int or None, got {offload_capacity!r}"
            )
        self.capacity = capacity
        self.offload_capacity = offload_capacity
        self._members: weakref.WeakKeyDictionary[LedgerMember, asyncio.AbstractEventLoop | None]
        self._members = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        tier = f", offload_capacity={self.offload_capacity}" if self.offload_capacity else ""
        return f"KVLedger(capacity={self.capacity}{tier}, members={len(self._members)})"

    @property
    def members(self) -> int:
        """How many runs book this ledger now."""
        return len(self._members)

    def join(self, member: LedgerMember) -> None:
        """Book `member` here (idempotent); it is woken in the loop it joined from."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            self._members.setdefault(member, loop)

    def leave(self, member: LedgerMember) -> None:
        """`member` is done (its run ended): its tokens stop counting; others are woken."""
        with self._lock:
            self._members.pop(member, None)
        self._wake_others(member)

    def _snapshot(self) -> list[tuple[LedgerMember, asyncio.AbstractEventLoop | None]]:
        """The members now, with their loops (another loop may join or leave meanwhile)."""
        with self._lock:
            return list(self._members.items())

    def active(self) -> int:
        """Siblings holding an ACTIVE place now, over every member."""
        return sum(m.active for m, _ in self._snapshot())

    def resident_tokens(self) -> int:
        """Estimated KV tokens resident on the server, over every member."""
        return sum(m.resident_tokens() for m, _ in self._snapshot())

    def paused_tokens(self) -> int:
        """Estimated KV tokens of paused siblings, over every member."""
        return sum(m.paused_tokens() for m, _ in self._snapshot())

    def offload_room(self, headroom: float) -> int:
        """Tokens of paused contexts the second tier may still take (0: no tier).

        vLLM's tier is written through (every prompt block as it is computed)
        and evicts the least recently used, so a paused context survives in it
        only while the tier holds the booked contexts (used since) besides
        every paused one: the room is the tier's budget less both.
        """
        if self.offload_capacity is None:
            return 0
        held = self.resident_tokens() + self.paused_tokens()
        return max(0, kv_budget(self.offload_capacity, headroom) - held)

    def budget(self, headroom: float) -> int:
        """The tokens residents may fill at `headroom` (a share of the capacity)."""
        return kv_budget(self.capacity, headroom)

    def fits(self, tokens: int, *, headroom: float) -> bool:
        """Whether a newcomer of `tokens` fits beside everything resident now."""
        resident = self.resident_tokens()
        return resident == 0 or resident + tokens <= self.budget(headroom)

    def freed(self, member: LedgerMember) -> None:
        """`member` freed room (a place or tokens): wake the other members, then `member`."""
        self._wake_others(member)
        member.wake()

    def _wake_others(self, member: LedgerMember) -> None:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for other, loop in self._snapshot():
            if other is member:
                continue
            if loop is None or loop is running:
                other.wake()
            elif not loop.is_closed():
                loop.call_soon_threadsafe(other.wake)
