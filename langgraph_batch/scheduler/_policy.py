"""The scheduler's decision logic: a pure, synchronous object with an explicit clock.

`BatchPolicy` is the user-facing configuration (a frozen value object).
`Planner` holds the queue and the slot accounting and decides, each
time it is asked (`plan(now)`), which queued requests go on the wire now,
which of them go together as one batch, and when it wants to be asked again
(the end of an open batch window). It never awaits, never reads a clock and
never touches a future: the async runner (`_runner.py`) feeds it events
(`enqueue`, `withdraw`, `on_complete`, `on_metrics`) with `now` and carries
out its plans. That keeps every scheduling decision unit-testable with
explicit clocks.

Each concern has its own module and object, which the core composes (as
vLLM's v1 core composes its request queue and managers):

- `_item`: `RequestStatus`, `PolicyItem`, `Outcome`, `Plan`, `PolicyStats`;
- `_priority`: the priority key (depth_first, las, fifo), also the engine's;
- `_limit`: the adaptive in-flight limit (slow start, AIMD);
- `_decode_gate`: the learned decode cap on agent requests;
- `_warming`: prefix warming (leaders and held items).

Priority order is a heap of `(key, seq, item)` tuples, so comparisons run in
C; withdrawn items are deleted lazily (skipped when they reach the top, and
the heap is compacted when dead entries dominate). The effective bound on
agent requests is the smaller of the limit and the decode cap.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable

from langgraph_batch.backends.base import EngineMetrics
from langgraph_batch.scheduler._config import BatchPolicy, PriorityMode
from langgraph_batch.scheduler._decode_cap import DecodeCap
from langgraph_batch.scheduler._decode_gate import DecodeGate
from langgraph_batch.scheduler._gather import GatherGate
from langgraph_batch.scheduler._item import (
    DONE,
    HELD,
    QUEUED,
    RUNNING,
    WITHDRAWN,
    Outcome,
    Plan,
    PolicyItem,
    PolicyStats,
    RequestStatus,
)
from langgraph_batch.scheduler._limit import InflightLimit
from langgraph_batch.scheduler._priority import Priority
from langgraph_batch.scheduler._warming import WarmingGate

__all__ = (
    "BatchPolicy",
    "Outcome",
    "Plan",
    "Planner",
    "PolicyItem",
    "PolicyStats",
    "PriorityMode",
    "RequestStatus",
)


class Planner:
    """The pure scheduling state machine behind `Scheduler`.

    Args:
        policy: the configuration.
        batching: whether batchable items may be collected into batches (the
            backend supports `complete_batch` and the policy enables it).
        has_metrics: whether engine metrics will arrive (`on_metrics`); without
            them the limit starts at `inflight_limit` and never grows beyond it;
            with them it starts at `initial_inflight` and adapts up to the cap.
        warming: hold items whose `prefix` is being warmed (see `_warming`);
            usually `policy.warms_prefixes(flavor)`.

    Example:
        ```python
        core = Planner(BatchPolicy(inflight_limit=2))
        a, b, c = PolicyItem(turn=0), PolicyItem(turn=2), PolicyItem(turn=1)
        for it in (a, b, c):
            core.enqueue(it, now=0.0)
        plan = core.plan(now=0.0)
        assert plan.dispatch == [b, c]      # further along first
        core.on_complete(b, Outcome.OK, now=1.0)
        assert core.plan(now=1.0).dispatch == [a]
        ```
    """

    def __init__(
        self,
        policy: BatchPolicy,
        *,
        batching: bool = False,
        has_metrics: bool = False,
        warming: bool = False,
    ) -> None:
        self.policy = policy
        self.priority = Priority(policy.priority)
        """The priority mode: heap key, engine priority, recency and attained service."""
        self._recency = self.priority.recency
        self._gather = GatherGate(policy.gather_window_s if self._recency is not None else 0.0)
        self._batching = batching and policy.max_batch_size > 1 and policy.batch_window_s > 0
        self._window = policy.batch_window_s
        self._max_batch = policy.max_batch_size
        self._limit = InflightLimit(policy, has_metrics=has_metrics)
        self._gate = DecodeGate(policy, adapting=self._limit.adapting)
        self._warming = WarmingGate(policy.warm_ttl_s) if warming else None
        self._seq = 0
        self._heap: list[tuple[float, int, PolicyItem]] = []
        self._bheap: list[tuple[float, int, PolicyItem]] = []
        self._queued = 0
        self._bqueued = 0
        self._dead = 0
        self._window_open: float | None = None
        self._in_flight = 0
        self._by_sibling: dict[Hashable, int] = {}
        self._util_area = 0.0
        self._util_t: float | None = None
        self._util_t0: float | None = None
        self.latest_metrics: EngineMetrics | None = None

    # ------------------------------------------------------------------ views
    # What the runner reads on every event; everything else is in `stats()`.

    @property
    def queued(self) -> int:
        """Items waiting for a slot, held ones included (withdrawn ones excluded)."""
        held = self._warming.held_count if self._warming is not None else 0
        return self._queued + self._bqueued + held

    @property
    def ready(self) -> int:
        """Items waiting for a slot that `plan` may grant (held ones excluded)."""
        return self._queued + self._bqueued

    @property
    def in_flight(self) -> int:
        """Slots held now."""
        return self._in_flight

    @property
    def limit(self) -> int:
        """The current (adaptive) in-flight limit."""
        return self._limit.value

    @property
    def slots_free(self) -> int:
        """Slots that may be granted now (never negative)."""
        free = self._limit.value - self._in_flight
        return free if free > 0 else 0

    @property
    def decode_limit(self) -> int | None:
        """The decode cap on agent requests in flight now (None: not capping).

        With engine metrics it holds from the first request (at its start
        until the engine's first sample) and stands down when the engine does
        not count generated tokens; see `BatchPolicy.decode_cap`.
        """
        cap = self._gate.cap
        return cap.limit if cap is not None else None

    @property
    def decode_cap(self) -> DecodeCap | None:
        """The decode cap's learner (None: off, or no engine metrics)."""
        return self._gate.cap

    def is_warm(self, prefix: Hashable, now: float) -> bool:
        """Whether a prefix key is warm now (warmed and used within `warm_ttl_s`)."""
        return self._warming is not None and self._warming.is_warm(prefix, now)

    def stats(self) -> PolicyStats:
        """A snapshot of the core's counters, as vLLM's `make_stats()` (`core.stats().held`)."""
        warming, limit = self._warming, self._limit
        held = warming.held_count if warming is not None else 0
        return PolicyStats(
            queued=self._queued + self._bqueued + held,
            ready=self._queued + self._bqueued,
            held=held,
            in_flight=self._in_flight,
            limit=limit.value,
            limit_exact=limit.exact,
            slow_start=limit.slow_start,
            increases=limit.increases,
            decreases=limit.decreases,
            decode_limit=self.decode_limit,
            warmups=warming.warmups if warming is not None else 0,
            held_total=warming.held_total if warming is not None else 0,
            held_s=warming.held_s if warming is not None else 0.0,
        )

    def inflight_by_sibling(self) -> dict[Hashable, int]:
        """Slots held per sibling id (siblings with none are absent)."""
        return dict(self._by_sibling)

    def utilisation(self, now: float) -> float:
        """Time-weighted mean of in_flight / limit since the first event (0..1)."""
        self._account(now)
        t0 = self._util_t0
        if t0 is None or now <= t0:
            return 0.0
        return min(1.0, self._util_area / (now - t0))

    # ----------------------------------------------------------------- events

    def enqueue(self, item: PolicyItem, now: float) -> None:
        """Queue an item (a retry keeps its first sequence number, so it keeps its place).

        With prefix warming on, an item whose prefix is being warmed by
        another item is held (out of the queue) until that leader's first
        token; the first item of a cold prefix becomes its leader.

        Args:
            item: a new item, or one that finished an attempt and is retried.
            now: the current time, seconds.

        Raises:
            ValueError: the item is already queued or running.
        """
        if item.state == QUEUED or item.state == RUNNING or item.state == HELD:
            raise ValueError(f"{item!r} is already queued or running")
        if item.seq < 0:
            item.seq = self._seq
            self._seq += 1
        entry = (self.priority.key(item), item.seq, item)
        item.entry = entry
        item.enqueued_at = now
        item.in_batch = False
        if not item.batchable:
            self._gate.track(item, 1)
        warming = self._warming
        if warming is not None and item.prefix is not None and not warming.admit(item, now):
            warming.hold(item, now)
            return
        self._push(item, now)
        if self._in_flight >= self._limit.value:
            self._limit.on_bound(now)

    def _push(self, item: PolicyItem, now: float) -> None:
        entry = item.entry
        assert entry is not None
        item.state = QUEUED
        if self._batching and item.batchable and not item.leading:
            heapq.heappush(self._bheap, entry)
            if self._bqueued == 0:
                self._window_open = now
            self._bqueued += 1
        else:
            heapq.heappush(self._heap, entry)
            self._queued += 1

    def try_acquire(self, item: PolicyItem, now: float) -> bool:
        """Grant a slot at once when nothing is queued and a slot is free.

        The uncontended fast path: the item never enters the heap. Batchable
        items (when batching is on) always go through `enqueue` and `plan`.

        Args:
            item: a new or retried item.
            now: the current time, seconds.

        Returns:
            True when the item now holds a slot (state running).
        """
        if (
            self._queued
            or self._bqueued
            or self._in_flight >= self._limit.value
            or (item.batchable and self._batching)
        ):
            return False
        recency = self._recency
        if recency is not None and self._gather.opens(
            known=bool(recency.get(item.conversation)), in_flight=self._in_flight, now=now
        ):
            return False
        if not item.batchable and self._gate.cap is not None:
            room = self._gate.room(now)
            if room is not None and room <= 0:
                return False
        warming = self._warming
        if warming is not None and item.prefix is not None and not warming.admit(item, now):
            return False
        if item.seq < 0:
            item.seq = self._seq
            self._seq += 1
        item.enqueued_at = now
        item.in_batch = False
        if not item.batchable:
            self._gate.track(item, 1)
        self._grant(item, now)
        return True

    def withdraw(self, item: PolicyItem, now: float = 0.0) -> bool:
        """Remove a queued or held item (its caller went away). Lazy: O(1).

        The time it waited counts into `item.queued_s`. A withdrawn prefix
        leader hands the lead to the best held item.

        Args:
            item: the item.
            now: the current time, seconds.

        Returns:
            True when the item was queued; False when it was not (already
            granted, finished or withdrawn), which is not an error.
        """
        if item.state != QUEUED and item.state != HELD:
            return False
        item.queued_s += max(0.0, now - item.enqueued_at)
        if not item.batchable:
            self._gate.track(item, -1)
        if item.state == HELD:
            item.state = WITHDRAWN
            assert self._warming is not None
            self._warming.unhold(item, now)
            return True
        item.state = WITHDRAWN
        self._dead += 1
        in_bheap = self._batching and item.batchable and not item.leading
        if item.leading:
            self._end_lead(item, warm=False, now=now)
        if in_bheap:
            self._bqueued -= 1
            if self._bqueued == 0:
                self._window_open = None
        else:
            self._queued -= 1
        if self._dead > 64 and self._dead > 2 * (self._queued + self._bqueued):
            self._compact()
        return True

    def plan(self, now: float) -> Plan:
        """Decide what goes on the wire now.

        Fills free slots in priority order from the plain queue and, when the
        batch window has closed (or a full batch is waiting), from the
        batchable queue, whose head competes on the same priority key.

        Args:
            now: the current time, seconds.

        Returns:
            The items to dispatch (their state is now running), the batches,
            and when to ask again if a batch window is still open.
        """
        plan = Plan()
        plan.wake_at = self._gather.holding(in_flight=self._in_flight, now=now)
        if plan.wake_at is not None:
            return plan  # a burst is gathering: it goes out in priority order after
        self._fill(plan, now)
        if (
            (self._queued or self._bqueued)
            and self._in_flight >= self._limit.value
            and self._limit.on_bound(now)
        ):
            self._fill(plan, now)
        return plan

    def _fill(self, plan: Plan, now: float) -> None:
        free = self._limit.value - self._in_flight
        ready = self._batch_ready(now, plan)
        heap = self._heap
        room = self._gate.room(now) if self._gate.cap is not None else None
        while free > 0:
            e = self._peek(heap) if self._queued else None
            if e is not None and room is not None and room <= 0 and not e[2].batchable:
                # The decode cap holds the plain queue (in priority order) back.
                self._gate.bound = True
                e = None
            be = self._peek(self._bheap) if ready else None
            if e is None:
                if be is None:
                    break
            elif be is None or e < be:
                heapq.heappop(heap)
                self._queued -= 1
                item = e[2]
                self._grant(item, now)
                plan.dispatch.append(item)
                free -= 1
                if room is not None and not item.batchable:
                    room -= 1
                continue
            batch = self._take_batch(min(free, self._max_batch), now)
            plan.batches.append(batch)
            free -= len(batch)
            ready = self._batch_ready(now, plan)

    def on_complete(self, item: PolicyItem, outcome: Outcome, now: float) -> None:
        """Release the slot of a running item and learn from how its call ended.

        Args:
            item: an item `plan` or `try_acquire` granted.
            outcome: how the call ended (429/503 shrink the limit).
            now: the current time, seconds.

        Raises:
            ValueError: the item holds no slot.
        """
        if item.state != RUNNING:
            raise ValueError(f"{item!r} holds no slot")
        self._account(now)
        item.state = DONE
        self._in_flight -= 1
        if not item.batchable:
            self._gate.capped -= 1
            self._gate.track(item, -1)
        if not self._in_flight:
            self._gate.idle = True
        sid = item.sibling_id
        if sid is not None:
            n = self._by_sibling[sid] - 1
            if n:
                self._by_sibling[sid] = n
            else:
                del self._by_sibling[sid]
            self.priority.served(sid, now - item.dispatched_at)
        if item.leading:
            self._end_lead(item, warm=outcome is Outcome.OK, now=now)
        elif self._warming is not None and item.prefix is not None and outcome is Outcome.OK:
            self._warming.touch(item.prefix, now)
        if outcome is Outcome.OK:
            self._limit.on_ok(queued=bool(self._queued or self._bqueued))
            self.priority.completed(item.conversation)
        elif outcome is Outcome.RATE_LIMITED or outcome is Outcome.OVERLOADED:
            self._limit.decrease(now)

    def on_first_token(self, item: PolicyItem, now: float) -> bool:
        """The runner saw the first streamed token of a running item.

        For a prefix leader this means the server has computed (and cached)
        the shared prefix: the prefix becomes warm and the items held behind
        it rejoin the queue in their priority order.

        Args:
            item: a running item.
            now: the current time, seconds.

        Returns:
            True when held items were released (the runner should plan again).
        """
        if not item.leading:
            return False
        warming = self._warming
        assert warming is not None  # only warming marks an item as leading
        before = warming.held_count
        self._end_lead(item, warm=True, now=now)
        return warming.held_count < before

    def on_metrics(self, metrics: EngineMetrics, now: float) -> None:
        """Adapt the limit and the decode cap to what the engine reports about its load.

        See `_limit.InflightLimit.on_metrics` and `_decode_gate.DecodeGate.observe`.

        Args:
            metrics: the engine's figures.
            now: the current time, seconds.
        """
        self.latest_metrics = metrics
        bound_now = bool(self._queued or self._bqueued) and self._in_flight >= self._limit.value
        gate = self._gate
        if gate.cap is not None:
            if metrics.generation_tokens_total is not None:
                self._account(now)
            gate.observe(metrics, now, in_flight=self._in_flight, queued=self._queued)
        self._limit.on_metrics(metrics, now, bound_now=bound_now)

    def drain(self) -> list[PolicyItem]:
        """Remove and return every queued item (the scheduler is closing or dead)."""
        items = [e[2] for e in self._heap if e[2].state == QUEUED]
        items += [e[2] for e in self._bheap if e[2].state == QUEUED]
        if self._warming is not None:
            items += self._warming.drain()
        items.sort(key=_seq_of)
        for it in items:
            it.state = WITHDRAWN
        self._heap.clear()
        self._bheap.clear()
        self._queued = self._bqueued = self._dead = 0
        self._window_open = None
        for it in items:
            if not it.batchable:
                self._gate.track(it, -1)
        return items

    # -------------------------------------------------------------- internals

    def _end_lead(self, item: PolicyItem, *, warm: bool, now: float) -> None:
        assert self._warming is not None
        for released in self._warming.end_lead(item, warm=warm, now=now):
            self._push(released, now)

    def _batch_ready(self, now: float, plan: Plan) -> bool:
        if not self._bqueued:
            plan.wake_at = None
            return False
        assert self._window_open is not None
        close = self._window_open + self._window
        if self._bqueued >= self._max_batch or now >= close:
            plan.wake_at = None
            return True
        plan.wake_at = close
        return False

    def _take_batch(self, n: int, now: float) -> list[PolicyItem]:
        batch: list[PolicyItem] = []
        bheap = self._bheap
        while len(batch) < n and self._bqueued:
            item = self._peek(bheap)[2]
            heapq.heappop(bheap)
            self._bqueued -= 1
            item.in_batch = True
            self._grant(item, now)
            batch.append(item)
        if not self._bqueued:
            self._window_open = None
        return batch

    def _grant(self, item: PolicyItem, now: float) -> None:
        self._account(now)
        item.state = RUNNING
        item.dispatched_at = now
        item.queued_s += now - item.enqueued_at
        self._in_flight += 1
        if not item.batchable:
            self._gate.capped += 1
        if item.leading:
            assert self._warming is not None
            self._warming.warmups += 1
        sid = item.sibling_id
        if sid is not None:
            by = self._by_sibling
            by[sid] = by.get(sid, 0) + 1

    def _peek(self, heap: list[tuple[float, int, PolicyItem]]) -> tuple[float, int, PolicyItem]:
        # Callers only peek a heap whose live count is > 0, so a live entry exists.
        while True:
            e = heap[0]
            if e[2].state == QUEUED and e[2].entry is e:
                return e
            heapq.heappop(heap)
            self._dead -= 1

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if e[2].state == QUEUED and e[2].entry is e]
        self._bheap = [e for e in self._bheap if e[2].state == QUEUED and e[2].entry is e]
        heapq.heapify(self._heap)
        heapq.heapify(self._bheap)
        self._dead = 0

    def _account(self, now: float) -> None:
        t = self._util_t
        if t is None:
            self._util_t = self._util_t0 = now
            return
        if now > t:
            self._util_area += (now - t) * min(1.0, self._in_flight / self._limit.value)
            self._gate.account(now - t, self._in_flight)
            self._util_t = now


def _seq_of(item: PolicyItem) -> int:
    return item.seq
