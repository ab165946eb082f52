"""The admission gate of one fan_out run: which siblings run, and whose context the server keeps.

Two things are admitted here. An ACTIVE place (a sibling running model
nodes; at most `max_active` when given): a sibling gives it up while it runs
a tool (`release`) and asks for it again when it comes back (`acquire(...,
returning=True)`), before any fresh sibling. And a KV booking, which is
program-level admission: a sibling's context stays cached on the server for
its whole life, tool waits included, only if nothing else needs the room.
So every RESIDENT sibling (started, not finished) that is BOOKED counts, in
the server's `KVLedger` (shared with every run on that scheduler), the KV it
will hold during its next model call: its context now plus what one more
turn adds (`ContextForecast.booking`, learned from the run). Then:

- A fresh sibling is admitted only while everything booked on the server
  plus its first-call estimate fits `capacity * kv_headroom` (always when
  nothing is booked, so the gate cannot deadlock).
- Contexts grow. When the booked tokens outgrow the budget, the gate pauses
  siblings that hold no place (they are inside a tool, or waiting to come
  back): their booking is given up, so their KV is what the engine evicts
  first. Long waits go first (a wait that outlasted 90% of its tool's calls:
  its KV would sit idle longest; Continuum's TTL, learned per tool), then
  the most recently admitted (the least progress, the smallest context to
  prefill again). Measured on W8 (64 agents of 6-24 turns whose contexts
  reach ~2.8x the cache): pausing keeps the prefill the server computes
  within ~1.15x the minimum where booking without pausing admits siblings
  whose growth later evicts the others' contexts (1.3x-4x, depending on how
  many decode at once).
- A paused sibling coming back from its tool RESUMES only when its booking
  fits again, ahead of fresh siblings; a returning sibling that kept its
  booking is never held back by the budget (its KV is what we want reused),
  only by `max_active`.

The order in which admitted siblings' requests reach the engine is the
scheduler's (`BatchPolicy.priority`, depth-first by default); the engine's
concurrency is its decode cap. The gate implements
`langgraph_batch._context.Admission`; the tool hooks reach it through
`SiblingInfo.tool_enter()` / `tool_exit()`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from langgraph_batch._context import SiblingInfo
from langgraph_batch._estimates import CONTEXT_TOKENS_PRIOR, KV_HEADROOM
from langgraph_batch._heartbeat import held
from langgraph_batch.nodes._forecast import ContextForecast
from langgraph_batch.scheduler import KVLedger

__all__ = ("AdmissionStats", "SiblingAdmission")

logger = logging.getLogger(__name__)

_Waiter = tuple[str, "asyncio.Future[None]", SiblingInfo]


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionStats:
    """A snapshot of the gate."""

    max_active: int | None
    """The cap on active siblings; None means unlimited."""
    active: int
    """Siblings holding a place now."""
    waiting_fresh: int
    """Siblings that have not started yet, waiting for a place or for KV room."""
    waiting_returning: int
    """Siblings back from a tool, waiting for a place (or, paused, for KV room)."""
    peak_active: int
    """The most siblings that held a place at the same time."""
    resident: int = 0
    """Siblings started and not finished (active, in a tool, or waiting to come back)."""
    resident_tokens: int = 0
    """KV tokens booked by this run's siblings (each: its context plus one turn's growth)."""
    kv_budget: int | None = None
    """The token budget for booked siblings on the server; None: no budget."""
    server_resident_tokens: int = 0
    """KV tokens booked on the server over every run sharing its ledger (this one
    included; equal to `resident_tokens` without a ledger or when alone)."""
    sibling_estimate: int = 0
    """What a fresh sibling is expected to hold during its first call (tokens)."""
    paused: int = 0
    """Resident siblings whose booking was given up (their KV may be evicted)."""
    pauses: int = 0
    """Bookings given up so far in this run."""


class SiblingAdmission:
    """Active places (returning before fresh) and KV bookings for one fan_out run.

    Args:
        max_active: how many siblings may hold a place at once; None for no cap.
        kv_ledger: the server's ledger (`Scheduler.kv_ledger()`): the budget is
            shared with every other run booking it; None: no KV budget.
        kv_headroom: share of the capacity the booked siblings may fill.
        sibling_tokens: the prior for one sibling's first-call context (its
            prompt and answer), until the run has shown real ones.
        clock: seconds, for tool waits (default: `time.monotonic`).

    The options are checked once, where they are given (`_spec.check_gate_options`,
    called by `FanOutSpec` and the distributed workers), not again here.

    Example:
        ```python
        gate = SiblingAdmission(kv_ledger=await scheduler.kv_ledger())
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
        kv_ledger: KVLedger | None = None,
        kv_headroom: float = KV_HEADROOM,
        sibling_tokens: int = CONTEXT_TOKENS_PRIOR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sizing = False
        self._max_active = max_active
        self._headroom = kv_headroom
        self._ledger: KVLedger | None = kv_ledger
        self._clock = clock
        self.forecast = ContextForecast(sibling_tokens=sibling_tokens)
        """What the run has taught about its siblings' contexts and tool waits."""
        self._holders: set[str] = set()
        self._booked: dict[str, SiblingInfo] = {}
        self._counted: dict[str, int] = {}
        """The context each booked sibling is counted with in the sums below."""
        self._ctx_sum = 0  # their contexts (those > 0)
        self._ctx_n = 0  # booked siblings with a context
        self._new_n = 0  # booked siblings with none yet (a fresh booking each)
        self._paused: dict[str, SiblingInfo] = {}
        self._paused_ctx: dict[str, int] = {}
        """The context each paused sibling had when paused (what the tier may keep)."""
        self._paused_sum = 0
        self._admitted: dict[str, int] = {}
        self._seq = 0
        self._waits: dict[str, float] = {}
        """When each sibling without a place entered its tool (the gate's clock)."""
        self._fresh: collections.deque[_Waiter] = collections.deque()
        self._returning: collections.deque[_Waiter] = collections.deque()
        self._resuming: collections.deque[_Waiter] = collections.deque()
        self._peak = 0
        self._pauses = 0
        self.first_resident = asyncio.Event()
        """Set when the first sibling becomes resident (the run has started work)."""
        if kv_ledger is not None:
            kv_ledger.join(self)

    @property
    def max_active(self) -> int | None:
        """The cap on active siblings (None: unlimited)."""
        return self._max_active

    @property
    def active(self) -> int:
        """How many siblings hold a place now."""
        return len(self._holders)

    @property
    def sibling_estimate(self) -> int:
        """What a fresh sibling is expected to hold during its first call (tokens)."""
        return self.forecast.fresh_booking()

    @property
    def kv_budget(self) -> int | None:
        """The token budget for booked siblings, on the whole server (None: no budget)."""
        return None if self._ledger is None else self._ledger.budget(self._headroom)

    @property
    def kv_ledger(self) -> KVLedger | None:
        """The ledger this gate books (None: no KV budget)."""
        return self._ledger

    @property
    def sizing(self) -> bool:
        """Whether the gate still waits for the server's capacity."""
        return self._sizing

    def holds(self, sibling: SiblingInfo) -> bool:
        """Whether `sibling` holds a place now."""
        return sibling.sibling_id in self._holders

    def is_resident(self, sibling: SiblingInfo) -> bool:
        """Whether `sibling` started and has not finished."""
        sid = sibling.sibling_id
        return sid in self._booked or sid in self._paused

    def is_paused(self, sibling: SiblingInfo) -> bool:
        """Whether `sibling`'s booking was given up (it resumes when room is back)."""
        return sibling.sibling_id in self._paused

    def resident_tokens(self) -> int:
        """KV tokens booked by this run's siblings: the sum of `forecast.booking` over them.

        O(1): kept as sums that every booking and context change updates (the
        gate asks on every admission decision, with thousands of siblings
        booked). Also asked from other event loops, through their shared
        `KVLedger`.
        """
        f = self.forecast
        return self._ctx_sum + f.growth * self._ctx_n + f.fresh_booking() * self._new_n

    def paused_tokens(self) -> int:
        """The contexts of this run's paused siblings, in tokens (O(1))."""
        return self._paused_sum

    def context_changed(self, sibling: SiblingInfo) -> None:
        """`sibling`'s context moved (a call completed): its booking follows (no-op if none)."""
        sid = sibling.sibling_id
        if sid in self._counted:
            self._uncount(sid)
            self._count(sid, sibling.context_tokens)

    def _count(self, sid: str, context: int) -> None:
        self._counted[sid] = context
        if context > 0:
            self._ctx_sum += context
            self._ctx_n += 1
        else:
            self._new_n += 1

    def _uncount(self, sid: str) -> int | None:
        context = self._counted.pop(sid, None)
        if context is not None:
            if context > 0:
                self._ctx_sum -= context
                self._ctx_n -= 1
            else:
                self._new_n -= 1
        return context

    def _book(self, sid: str, sibling: SiblingInfo) -> None:
        self._booked[sid] = sibling
        self._count(sid, sibling.context_tokens)

    def _unbook(self, sid: str) -> SiblingInfo | None:
        self._uncount(sid)
        return self._booked.pop(sid, None)

    def stats(self) -> AdmissionStats:
        """A snapshot of the gate's counters."""
        own = self.resident_tokens()
        return AdmissionStats(
            max_active=self._max_active,
            active=len(self._holders),
            waiting_fresh=sum(1 for _, f, _s in self._fresh if not f.done()),
            waiting_returning=sum(
                1 for q in (self._returning, self._resuming) for _, f, _s in q if not f.done()
            ),
            peak_active=self._peak,
            resident=len(self._booked) + len(self._paused),
            resident_tokens=own,
            kv_budget=self.kv_budget,
            sibling_estimate=self.sibling_estimate,
            server_resident_tokens=own if self._ledger is None else self._ledger.resident_tokens(),
            paused=len(self._paused),
            pauses=self._pauses,
        )

    # -- the server's capacity -------------------------------------------------

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
            if self._ledger is not None and self._ledger is not kv_ledger:
                self._ledger.leave(self)
            self._ledger = kv_ledger
            kv_ledger.join(self)
        self._wake()

    def close(self) -> None:
        """The run is over: stop booking the ledger (its residents stop counting)."""
        if self._ledger is not None:
            self._ledger.leave(self)

    def wake(self) -> None:
        """Re-check the waiters: the ledger calls it when room was freed elsewhere."""
        self._wake()

    # -- places and bookings ------------------------------------------------------

    def _has_room(self) -> bool:
        return self._max_active is None or len(self._holders) < self._max_active

    def _fits(self, tokens: int) -> bool:
        """Whether `tokens` more fit the server's budget beside everything booked."""
        if self._ledger is None:
            return True
        return self._ledger.fits(tokens, headroom=self._headroom)

    def _fits_fresh(self) -> bool:
        if self._sizing and (self._booked or self._paused):
            return False  # unsized: one sibling at a time until the capacity is known
        return self._fits(self.forecast.fresh_booking())

    def _fits_resuming(self, sibling: SiblingInfo) -> bool:
        return self._fits(self.forecast.booking(sibling.context_tokens))

    def _grant(self, sid: str, sibling: SiblingInfo) -> None:
        self._holders.add(sid)
        if sid in self._paused:
            self._unpause(sid)
            self._book(sid, self._paused.pop(sid))
        elif sid not in self._booked:
            self._book(sid, sibling)
            self._admitted[sid] = self._seq
            self._seq += 1
            self.first_resident.set()
        else:
            self.context_changed(sibling)
        self._peak = max(self._peak, len(self._holders))

    async def acquire(self, sibling: SiblingInfo, *, returning: bool) -> None:
        """Wait for an active place (and, for a fresh or paused sibling, KV room).

        Returning siblings overtake resuming (paused) ones, which overtake fresh
        ones; within each queue it is first come, first served. Cancelling the
        wait withdraws it (a place granted at the same moment is passed on).

        Args:
            sibling: the sibling asking.
            returning: True when it comes back from a tool.
        """
        sid = sibling.sibling_id
        if sid in self._holders:
            return
        if returning:
            self._observe_wait(sibling)
        paused = sid in self._paused
        fresh = not returning and not paused and sid not in self._booked
        ahead: tuple[collections.deque[_Waiter], ...]
        if fresh:
            queue, ahead = self._fresh, (self._returning, self._resuming, self._fresh)
        elif paused:
            queue, ahead = self._resuming, (self._returning, self._resuming)
        else:
            queue, ahead = self._returning, (self._returning,)
        blocked = any(ahead)
        fits = self._fits_fresh() if fresh else self._fits_resuming(sibling) if paused else True
        if self._has_room() and not blocked and fits:
            self._grant(sid, sibling)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry: _Waiter = (sid, fut, sibling)
        queue.append(entry)
        try:
            with held():  # waiting its turn is not idling (LangGraph's idle_timeout)
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

        The sibling stays resident (its KV is still cached, booked): call
        `finish` when it is done for good. Its context just grew (a model call
        completed): the gate learns from it and, when the server's budget is
        exceeded, pauses siblings that hold no place.
        """
        sid = sibling.sibling_id
        if sid not in self._holders:
            return
        self._holders.discard(sid)
        self._waits[sid] = self._clock()
        self.context_changed(sibling)
        self.forecast.observe_context(sid, sibling.context_tokens, shared=sibling.shared_tokens)
        self._shed()
        self._freed()

    def finish(self, sibling: SiblingInfo) -> None:
        """`sibling` is done (finished or failed): free its place and its booking."""
        sid = sibling.sibling_id
        self._holders.discard(sid)
        self._unpause(sid)
        if self._unbook(sid) is not None or self._paused.pop(sid, None) is not None:
            self.forecast.observe_context(sid, sibling.context_tokens, shared=sibling.shared_tokens)
        self.forecast.forget(sid)
        self._admitted.pop(sid, None)
        self._waits.pop(sid, None)
        # A sibling finished before the capacity was known: stop waiting for it.
        self._sizing = False
        self._freed()

    def lend(self, sibling: SiblingInfo) -> bool:
        """`sibling` now waits on a fan_out run of its own: its place and booking go to that run.

        A sibling waiting on its nested run's siblings would otherwise keep
        its booking while they wait for room that only its finishing frees
        (a deadlock once the outer siblings' bookings fill the budget). Like a
        tool wait, it gives its place back; its booking is given up (paused),
        so the nested siblings are budgeted beside the server's other
        residents only. It resumes, ahead of fresh siblings, when its booking
        fits again.

        Returns:
            Whether it held a place: it then asks for it again
            (`acquire(..., returning=True)`) when the nested run is over; a
            sibling inside a tool does so when it leaves the tool.
        """
        sid = sibling.sibling_id
        held = sid in self._holders
        self._holders.discard(sid)
        if sid in self._booked:
            self._pause(sid, self._booked[sid])
        self._freed()
        return held

    def _freed(self) -> None:
        if self._ledger is not None:
            self._ledger.freed(self)  # other runs' gates first, then this one
        else:
            self._wake()

    def _observe_wait(self, sibling: SiblingInfo) -> None:
        started = self._waits.pop(sibling.sibling_id, None)
        if started is not None:
            self.forecast.observe_tool(sibling.tool_name or "", self._clock() - started)

    def _shed(self) -> None:
        """Pause siblings without a place while the server's booked tokens exceed its budget."""
        ledger = self._ledger
        if ledger is None:
            return
        over = ledger.resident_tokens() - ledger.budget(self._headroom)
        if over <= 0:
            return
        now = self._clock()
        forecast = self.forecast
        waits = self._waits

        def order(s: SiblingInfo) -> tuple[int, float]:
            # Long waits first, the longest first (their KV would idle longest);
            # then the latest admitted (least progress, least to prefill again).
            elapsed = now - waits.get(s.sibling_id, now)
            if forecast.long_wait(s.tool_name, elapsed):
                return (0, -elapsed)
            return (1, -self._admitted.get(s.sibling_id, 0))

        idle = sorted((s for sid, s in self._booked.items() if sid not in self._holders), key=order)
        room = ledger.offload_room(self._headroom)
        if room > 0:
            idle = self._tier_first(idle, room, order)
        for s in idle:
            if over <= 0:
                break
            sid = s.sibling_id
            over -= forecast.booking(self._counted.get(sid, s.context_tokens))
            self._pause(sid, s)
            logger.debug("fan_out: sibling %s paused (its KV booking given up)", sid)

    def _tier_first(
        self,
        idle: list[SiblingInfo],
        room: int,
        order: Callable[[SiblingInfo], tuple[int, float]],
    ) -> list[SiblingInfo]:
        """`idle` with the siblings whose context the server's second tier can take first.

        Their context comes back by a transfer from host memory, not a
        recompute, so its size no longer argues for pausing the least
        progressed: among them the largest go first (the most GPU room for
        one pause, so fewer siblings wait to resume), long waits still ahead.
        The others follow in `order`.
        """
        counted = self._counted

        def ctx(s: SiblingInfo) -> int:
            return counted.get(s.sibling_id, s.context_tokens)

        first: list[SiblingInfo] = []
        for s in sorted(idle, key=lambda s: (order(s)[0], -ctx(s))):
            if 0 < ctx(s) <= room:
                first.append(s)
                room -= ctx(s)
        chosen = {s.sibling_id for s in first}
        return first + [s for s in idle if s.sibling_id not in chosen]

    def _pause(self, sid: str, sibling: SiblingInfo) -> None:
        """Give up `sibling`'s booking; it resumes when its booking fits again."""
        context = self._counted.get(sid, sibling.context_tokens)
        self._paused[sid] = sibling
        self._paused_ctx[sid] = context
        self._paused_sum += context
        self._unbook(sid)
        self._pauses += 1
        self._move_to_resuming(sid)

    def _unpause(self, sid: str) -> None:
        self._paused_sum -= self._paused_ctx.pop(sid, 0)

    def _move_to_resuming(self, sid: str) -> None:
        """A sibling paused while it waits to come back now waits for room, not just a place."""
        for entry in self._returning:
            if entry[0] == sid:
                self._returning.remove(entry)
                self._resuming.append(entry)
                return

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
        for queue, fits in ((self._resuming, self._fits_resuming), (self._fresh, None)):
            while queue:
                entry = queue[0]
                if entry[1].done():
                    queue.popleft()
                    continue
                if not (self._fits_fresh() if fits is None else fits(entry[2])):
                    return None  # first come, first served: nothing behind it overtakes
                queue.popleft()
                return entry
        return None
