"""The admission gate of one fan_out run: at most `max_active` siblings ACTIVE at once.

A sibling is ACTIVE while it runs model nodes; it holds no place while it
waits for the gate or runs a tool. Two FIFO waiter queues: siblings coming
back from a tool (their KV prefix is still cached on the server) are let in
before fresh siblings, so cached prefixes get reused instead of evicted by
newcomers.

KV working-set control (optional): a sibling inside a tool gives up its
ACTIVE place, but its context stays cached on the server. So the gate also
tracks the RESIDENT siblings (started and not finished, active or in a tool)
and books their estimated KV tokens in the server's `KVLedger`, which the
scheduler owns and every fan_out run on that scheduler shares. A FRESH sibling
is admitted only while everything resident on the server, plus the
newcomer's estimate, fits `capacity * kv_headroom`. A sibling counts
`max(its context_tokens, the estimate)`, both in tokens of its OWN context
(the prefix siblings share is cached once on the server and is not counted
per sibling); the estimate is learned from finished siblings (the p90 of
their final context sizes; before any finished, `sibling_tokens` less the
shared prefix once a first call has shown it). Returning siblings are never
held back by the budget (their cached KV is what we want reused), only by
`max_active`. A finished sibling leaves the resident set (`finish`), which
frees budget, and the ledger wakes the gates waiting for it (other runs'
first). When nothing is resident on the server a fresh sibling is always
admitted, however large its estimate, so the gates cannot deadlock. Without
an explicit `max_active`, the cap is `capacity // max(estimate,
sibling_tokens)` (at least 1), recomputed as the estimate moves: it can
shrink below the starting cap, never exceed it; that derived cap counts the
active siblings of every run on the ledger (an explicit `max_active` is this
run's own).

The gate implements `langgraph_batch._context.Admission`; the tool hooks
reach it through `SiblingInfo.tool_enter()` / `tool_exit()`.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import logging
import math
from dataclasses import dataclass

from langgraph_batch._context import SiblingInfo
from langgraph_batch.scheduler._capacity import KVLedger
from langgraph_batch.scheduler._config import CONTEXT_TOKENS_PRIOR

__all__ = ("DEFAULT_KV_HEADROOM", "AdmissionStats", "SiblingAdmission")

logger = logging.getLogger(__name__)

DEFAULT_KV_HEADROOM = 0.85
"""Share of the server's KV capacity the resident siblings may fill."""

_DEFAULT_SIBLING_TOKENS = CONTEXT_TOKENS_PRIOR
_ESTIMATE_QUANTILE = 0.9

_Waiter = tuple[str, "asyncio.Future[None]", SiblingInfo]


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
    resident: int = 0
    """Siblings started and not finished (active, waiting to return, or in a tool)."""
    resident_tokens: int = 0
    """Their estimated KV tokens (each `max(context_tokens, estimate)`)."""
    kv_budget: int | None = None
    """The token budget for resident siblings; None: no budget."""
    server_resident_tokens: int = 0
    """Estimated KV tokens resident on the server over every run sharing its ledger
    (this one included; equal to `resident_tokens` without a ledger or when alone)."""
    sibling_estimate: int = 0
    """The current estimate of one sibling's context tokens."""


class SiblingAdmission:
    """A gate on ACTIVE siblings with two waiter queues (returning before fresh).

    Args:
        max_active: how many siblings may hold a place at once; None for no
            explicit cap (then `kv_capacity // estimate` when the capacity is
            known, else unlimited).
        kv_capacity: the server's KV cache size in tokens, for a gate that
            budgets alone (a private ledger); None disables the resident-token
            budget unless `kv_ledger` is given.
        kv_ledger: the server's shared ledger (`Scheduler.kv_ledger()`): the
            budget is then shared with every other run booking it.
        kv_headroom: share of the capacity the resident siblings may fill.
        sibling_tokens: the context estimate of one sibling before any has
            finished.

    Raises:
        ValueError: for a `max_active`, `kv_capacity` or `sibling_tokens` that
            is not a positive integer (or None where allowed), or a
            `kv_headroom` outside (0, 1].

    Example:
        ```python
        gate = SiblingAdmission(max_active=8, kv_capacity=440_000)
        await gate.acquire(info, returning=False)
        try:
            ...  # run the sibling's model nodes (tools release/re-acquire)
        finally:
            gate.finish(info)
        ```
    """

    def __init__(
        self,
        *,
        max_active: int | None = None,
        kv_capacity: int | None = None,
        kv_ledger: KVLedger | None = None,
        kv_headroom: float = DEFAULT_KV_HEADROOM,
        sibling_tokens: int = _DEFAULT_SIBLING_TOKENS,
    ) -> None:
        if max_active is not None and (isinstance(max_active, bool) or max_active < 1):
            raise ValueError(f"max_active must be a positive int or None, got {max_active!r}")
        if kv_capacity is not None and (isinstance(kv_capacity, bool) or kv_capacity < 1):
            raise ValueError(f"kv_capacity must be a positive int or None, got {kv_capacity!r}")
        if not 0.0 < kv_headroom <= 1.0:
            raise ValueError(f"kv_headroom must be in (0, 1], got {kv_headroom!r}")
        if isinstance(sibling_tokens, bool) or sibling_tokens < 1:
            raise ValueError(f"sibling_tokens must be a positive int, got {sibling_tokens!r}")
        if kv_ledger is None and kv_capacity is not None:
            kv_ledger = KVLedger(kv_capacity)
        self._sizing = False
        self._fixed_max = max_active
        self._headroom = kv_headroom
        self._ledger: KVLedger | None = kv_ledger
        self._base_estimate = sibling_tokens
        self._observed: list[int] = []
        self._estimate = sibling_tokens
        self._max_active = self._derive_max_active()
        self._holders: set[str] = set()
        self._resident: dict[str, SiblingInfo] = {}
        self._fresh: collections.deque[_Waiter] = collections.deque()
        self._returning: collections.deque[_Waiter] = collections.deque()
        self._peak = 0
        self.first_resident = asyncio.Event()
        """Set when the first sibling becomes resident (the run has started work)."""
        if kv_ledger is not None:
            kv_ledger.join(self)

    @property
    def max_active(self) -> int | None:
        """The cap on active siblings now (None: unlimited)."""
        return self._max_active

    @property
    def active(self) -> int:
        """How many siblings hold a place now."""
        return len(self._holders)

    @property
    def sibling_estimate(self) -> int:
        """The current estimate of one sibling's own context tokens.

        Learned from finished siblings; before any has finished,
        `sibling_tokens` less the prefix the siblings share (once a call has
        shown it), since the server holds that shared KV only once.
        """
        if self._observed:
            return self._estimate
        shared = max((s.shared_tokens for s in self._resident.values()), default=0)
        return max(1, self._base_estimate - shared)

    @property
    def kv_budget(self) -> int | None:
        """The token budget for resident siblings, on the whole server (None: no budget)."""
        return None if self._ledger is None else self._ledger.budget(self._headroom)

    @property
    def kv_ledger(self) -> KVLedger | None:
        """The ledger this gate books (None: no KV budget)."""
        return self._ledger

    def holds(self, sibling: SiblingInfo) -> bool:
        """Whether `sibling` holds a place now."""
        return sibling.sibling_id in self._holders

    def is_resident(self, sibling: SiblingInfo) -> bool:
        """Whether `sibling` started and has not finished."""
        return sibling.sibling_id in self._resident

    def resident_tokens(self) -> int:
        """Estimated KV tokens of the resident siblings."""
        est = self.sibling_estimate
        return sum(max(s.context_tokens, est) for s in self._resident.values())

    def observe(self, context_tokens: int) -> None:
        """Learn from one finished sibling's final context size (0 or less is ignored)."""
        if context_tokens <= 0:
            return
        bisect.insort(self._observed, context_tokens)
        rank = max(0, math.ceil(_ESTIMATE_QUANTILE * len(self._observed)) - 1)
        self._estimate = max(1, self._observed[rank])
        self._max_active = self._derive_max_active()

    def stats(self) -> AdmissionStats:
        """A snapshot of the gate's counters."""
        own = self.resident_tokens()
        return AdmissionStats(
            max_active=self._max_active,
            active=len(self._holders),
            waiting_fresh=sum(1 for _, f, _s in self._fresh if not f.done()),
            waiting_returning=sum(1 for _, f, _s in self._returning if not f.done()),
            peak_active=self._peak,
            resident=len(self._resident),
            resident_tokens=own,
            kv_budget=self.kv_budget,
            sibling_estimate=self.sibling_estimate,
            server_resident_tokens=own if self._ledger is None else self._ledger.resident_tokens(),
        )

    def start_sizing(self) -> None:
        """Admit fresh siblings one at a time until `set_kv_ledger` is called.

        For a run that learns the server's capacity only once its first
        sibling has reached the scheduler (which then exists).
        """
        self._sizing = True

    def set_kv_ledger(self, kv_ledger: KVLedger | None) -> None:
        """Size the gate now from the server's ledger (None: capacity unknown, no budget).

        Ends sizing and lets waiters in as the budget allows.
        """
        self._sizing = False
        if kv_ledger is not None:
            self._book(kv_ledger)
            self._max_active = self._derive_max_active()
        self._wake()

    def _book(self, ledger: KVLedger) -> None:
        if self._ledger is not None and self._ledger is not ledger:
            self._ledger.leave(self)
        self._ledger = ledger
        ledger.join(self)

    def close(self) -> None:
        """The run is over: stop booking the ledger (its residents stop counting)."""
        if self._ledger is not None:
            self._ledger.leave(self)

    def wake(self) -> None:
        """Re-check the waiters: the ledger calls it when room was freed elsewhere."""
        self._wake()

    @property
    def sizing(self) -> bool:
        """Whether the gate still waits for the server's capacity."""
        return self._sizing

    def _derive_max_active(self) -> int | None:
        if self._fixed_max is not None:
            return self._fixed_max
        if self._ledger is None:
            return None
        # `sibling_tokens` is a floor here: a learned estimate may lower the
        # cap (contexts grew larger than assumed) but never raise it above the
        # one announced when the run started; the token budget already lets
        # more small siblings be resident, up to that cap.
        return max(1, self._ledger.capacity // max(self._estimate, self._base_estimate))

    def _has_room(self) -> bool:
        if self._max_active is None:
            return True
        if self._fixed_max is None and self._ledger is not None:
            # A cap derived from the server's capacity bounds every run on it.
            return self._ledger.active() < self._max_active
        return len(self._holders) < self._max_active

    def _fits_fresh(self) -> bool:
        """Whether one more fresh sibling fits the server's resident-token budget."""
        if self._sizing and self._resident:
            return False  # unsized: one sibling at a time until the capacity is known
        if self._ledger is None:
            return True
        return self._ledger.fits(self.sibling_estimate, headroom=self._headroom)

    def _grant(self, sibling_id: str, sibling: SiblingInfo | None) -> None:
        self._holders.add(sibling_id)
        if sibling is not None:
            self._resident[sibling_id] = sibling
            self.first_resident.set()
        self._peak = max(self._peak, len(self._holders))

    async def acquire(self, sibling: SiblingInfo, *, returning: bool) -> None:
        """Wait for an active place.

        Returning siblings overtake fresh ones; within each queue it is first
        come, first served. A fresh sibling also waits for room in the
        resident-token budget. Cancelling the wait withdraws it (a place
        granted at the same moment is passed on to the next waiter).

        Args:
            sibling: the sibling asking.
            returning: True when it comes back from a tool (preferred).
        """
        sid = sibling.sibling_id
        if sid in self._holders:
            return
        fresh = not returning and sid not in self._resident
        # A fresh sibling also queues behind returning ones, so that a free
        # place always goes to whoever comes back from a tool first.
        blocked = bool(self._returning) or (not returning and bool(self._fresh))
        if self._has_room() and not blocked and (not fresh or self._fits_fresh()):
            self._grant(sid, sibling)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._returning if returning else self._fresh
        entry: _Waiter = (sid, fut, sibling)
        queue.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # Granted just as we were cancelled: hand the place on.
                if fresh:
                    self.finish(sibling)
                else:
                    self.release(sibling)
            else:
                with contextlib.suppress(ValueError):
                    queue.remove(entry)
                self._wake()
            raise

    def release(self, sibling: SiblingInfo) -> None:
        """Give `sibling`'s place back (no-op if it holds none) and admit the next waiter.

        The sibling stays resident (its KV is still cached): call `finish`
        when it is done for good.
        """
        sid = sibling.sibling_id
        if sid not in self._holders:
            return
        self._holders.discard(sid)
        if self._ledger is not None:
            self._ledger.freed(self)  # other runs' gates first, then this one
        else:
            self._wake()

    def finish(self, sibling: SiblingInfo) -> None:
        """`sibling` is done (finished or failed): free its place and its resident tokens.

        Its final context size teaches the estimate.
        """
        sid = sibling.sibling_id
        self._holders.discard(sid)
        if self._resident.pop(sid, None) is not None:
            self.observe(sibling.context_tokens)
        # A sibling finished before the capacity was known: stop waiting for it.
        self._sizing = False
        if self._ledger is not None:
            self._ledger.freed(self)  # other runs' gates first, then this one
        else:
            self._wake()

    def _wake(self) -> None:
        while self._has_room():
            entry = self._pop_waiter()
            if entry is None:
                return
            sid, fut, sibling = entry
            self._grant(sid, sibling)
            fut.set_result(None)

    def _pop_waiter(self) -> _Waiter | None:
        while self._returning:
            entry = self._returning.popleft()
            if not entry[1].done():
                return entry
        while self._fresh:
            entry = self._fresh[0]
            if entry[1].done():
                self._fresh.popleft()
                continue
            if not self._fits_fresh():
                return None
            self._fresh.popleft()
            return entry
        return None
