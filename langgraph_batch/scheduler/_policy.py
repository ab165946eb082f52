"""The scheduler's decision logic: a pure, synchronous object with an explicit clock.

`BatchPolicy` is the user-facing configuration (a frozen value object).
`BatchPolicyCore` holds the queue and the slot accounting and decides, each
time it is asked (`plan(now)`), which queued requests go on the wire now,
which of them go together as one batch, and when it wants to be asked again
(the end of an open batch window). It never awaits, never reads a clock and
never touches a future: the async runner (`_runner.py`) feeds it events
(`enqueue`, `withdraw`, `on_complete`, `on_metrics`) with `now` and carries
out its plans. That keeps every scheduling decision unit-testable with
explicit clocks.

Priority order is a heap of `(primary, seq, item)` tuples, so comparisons
run in C; withdrawn items are deleted lazily (skipped when they reach the
top, and the heap is compacted when dead entries dominate).

The in-flight limit adapts like TCP's congestion window between
`min_inflight` and the hard cap. With engine metrics it starts at
`initial_inflight` (raised to the engine's KV capacity / `kv_tokens_per_request`
on the first sample that reports the capacity) and grows while the server
keeps no queue of its own (`num_requests_waiting == 0`) and we were limit-bound
(our queue non-empty with every slot used at some point since the previous
sample): by doubling (slow start) until the first sign of overload, then by
`increase_step` per sample (AIMD). Growth happens at most once per metrics
sample, either when the sample arrives or, when we were not limit-bound then,
at the first limit-bound event while that sample is fresh (younger than
`metrics_interval_s`). HTTP 429/503 and a rising `num_preemptions_total`
shrink the limit multiplicatively and end slow start. Without engine metrics
the limit starts at `max_inflight` and only recovers towards it after a
decrease, never beyond.

The decode cap (`_decode_cap.py`, `BatchPolicy.decode_cap`): with engine
metrics, agent requests (anything but one-shot, batchable ones) are also
held to a cap learned from the engine's generated-token counter: the
concurrency past which decode throughput stops growing (long-context decode
is bandwidth-bound). It holds at its start (16) from the first request until
the engine's first sample, and stands down for good when the engine does not
count generated tokens (or no sample comes within a grace period). When every
agent request belongs to a fan_out run, the cap is rounded so that what the
runs have left goes in equal waves (`PolicyItem.left` reads the run's
counter). The effective bound on agent requests is the smaller of the two.

Prefix warming (when enabled): every item may carry a `prefix` key (a hash
of the shared leading part of its prompt: system message(s) + tools). The
first item with a key that is not warm becomes its LEADER and is queued
normally; later items with the same key are HELD (out of the heaps, no slot)
until the runner reports the leader's first token (`on_first_token`) or the
leader completes. Then the key is warm and the held items rejoin the queue
with their original priority entries. A leader that fails, is cancelled or
withdrawn hands the lead to the best held item. Warm keys live in a bounded
LRU and expire after `warm_ttl_s` without use (the engine's radix cache may
have evicted the prefix by then).
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from langgraph_batch.backends.base import EngineMetrics
from langgraph_batch.scheduler._config import BatchPolicy, PriorityMode
from langgraph_batch.scheduler._decode_cap import DecodeCap, RunDemand

__all__ = (
    "BatchPolicy",
    "BatchPolicyCore",
    "Outcome",
    "Plan",
    "PolicyItem",
    "PriorityMode",
)


# Item states (plain ints: compared on the hot path).
QUEUED = 0
RUNNING = 1
DONE = 2
WITHDRAWN = 3
NEW = 4
HELD = 5


# Remember this many warm prefix keys (least recently used forgotten first).
_WARM_MEMORY = 4096

# Remember attained service for this many siblings (oldest forgotten first).
_LAS_MEMORY = 100_000

# Where the decode cap's search starts (like TCP's initial window, in
# requests): it steps up from here while decode throughput keeps up, and
# probes after (`_decode_cap.py`).
_DECODE_START = 16

# How long the decode cap waits for a first metrics sample before it stands
# down (at least; 4 metrics intervals when that is longer).
_DECODE_GRACE_S = 2.0


class Outcome(enum.Enum):
    """How an inference call ended, as far as slot adaptation cares.

    Example:
        ```python
        core.on_complete(item, Outcome.RATE_LIMITED, now)  # HTTP 429: shrink the limit
        ```
    """

    OK = "ok"
    """The call returned a response."""
    RATE_LIMITED = "rate_limited"
    """HTTP 429: shrink the limit."""
    OVERLOADED = "overloaded"
    """HTTP 503: shrink the limit."""
    ERROR = "error"
    """Any other failure (no effect on the limit)."""
    CANCELLED = "cancelled"
    """The caller went away (no effect on the limit)."""


class PolicyItem:
    """One queued request as the policy sees it (the runner hangs its future on it).

    Example:
        ```python
        item = PolicyItem(turn=3, sibling_id="run1/7")
        core.enqueue(item, now=0.0)
        ```
    """

    __slots__ = (
        "batchable",
        "dispatched_at",
        "enqueued_at",
        "entry",
        "future",
        "group",
        "held_at",
        "in_batch",
        "leading",
        "left",
        "payload",
        "prefix",
        "queued_s",
        "seq",
        "sibling_id",
        "state",
        "turn",
    )

    def __init__(
        self,
        *,
        turn: int = 0,
        sibling_id: Hashable | None = None,
        group: str | None = None,
        batchable: bool = False,
        payload: Any = None,
        prefix: Hashable | None = None,
        left: Callable[[], int] | None = None,
    ) -> None:
        self.turn = turn
        """Turns (LLM calls) the caller has completed; more goes first in depth_first."""
        self.sibling_id = sibling_id
        """The sibling (program) this request belongs to, when known."""
        self.group = group
        """The fan_out run of the sibling, when known."""
        self.batchable = batchable
        """May go out in one `complete_batch` call with others."""
        self.payload = payload
        """Whatever the runner attaches (the ChatRequest)."""
        self.prefix = prefix
        """Key of the shared prompt prefix (None: no prefix warming for this item)."""
        self.left = left
        """How many siblings of its fan_out run are not finished (read when the
        decode cap is applied; None: not in a fan_out run)."""
        self.leading = False
        """This item is warming its prefix (the runner reports its first token)."""
        self.held_at = 0.0
        self.seq = -1
        self.state = NEW
        self.entry: tuple[float, int, PolicyItem] | None = None
        self.enqueued_at = 0.0
        self.dispatched_at = 0.0
        self.queued_s = 0.0
        """Total time spent queued over all attempts."""
        self.in_batch = False
        self.future: Any = None

    def __repr__(self) -> str:
        return (
            f"PolicyItem(seq={self.seq}, turn={self.turn}, sibling_id={self.sibling_id!r}, "
            f"state={self.state})"
        )


@dataclass(slots=True)
class Plan:
    """What to do now: the answer of `BatchPolicyCore.plan(now)`.

    Example:
        ```python
        plan = core.plan(now)
        for item in plan.dispatch: ...      # each runs alone, one slot each
        for batch in plan.batches: ...      # each goes out as one complete_batch
        if plan.wake_at is not None: ...    # ask again at this time at the latest
        ```
    """

    dispatch: list[PolicyItem] = field(default_factory=list)
    """Items granted a slot, to run one by one, best first."""
    batches: list[list[PolicyItem]] = field(default_factory=list)
    """Groups of batchable items, each to go out in one call (one slot per member)."""
    wake_at: float | None = None
    """When an open batch window closes (None: nothing is waiting on the clock)."""


class BatchPolicyCore:
    """The pure scheduling state machine behind `Scheduler`.

    Args:
        policy: the configuration.
        batching: whether batchable items may be collected into batches (the
            backend supports `complete_batch` and the policy enables it).
        has_metrics: whether engine metrics will arrive (`on_metrics`); without
            them the limit starts at `max_inflight` and never grows beyond it;
            with them it starts at `initial_inflight` and adapts up to the cap.
        warming: hold items whose `prefix` is being warmed (see the module
            docstring); usually `policy.warms_prefixes(flavor)`.

    Example:
        ```python
        core = BatchPolicyCore(BatchPolicy(max_inflight=2))
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
        self._mode = policy.priority
        self._batching = batching and policy.max_batch_size > 1 and policy.batch_window_s > 0
        self._has_metrics = has_metrics
        self._window = policy.batch_window_s
        self._max_batch = policy.max_batch_size
        self._base = float(policy.max_inflight)
        self._floor = float(policy.min_inflight)
        self._cap = float(policy.hard_cap)
        adapting = has_metrics and policy.adaptive
        start = policy.max_inflight
        if adapting and policy.initial_inflight is not None:
            start = policy.initial_inflight
        self._limit = float(start)
        self._ilimit = start
        self._slow_start = adapting and policy.slow_start
        self._sized = not adapting or policy.kv_tokens_per_request is None
        self._interval = policy.metrics_interval_s
        # Limit-bound (queue non-empty, every slot used) since the last sample.
        self._saturated = False
        # The last sample allows growth that has not happened yet (taken at _sample_t).
        self._sample_unspent = False
        self._sample_t = -math.inf
        self.increases = 0
        """Times the limit grew on engine metrics."""
        self.decreases = 0
        """Times the limit shrank (429/503/preemptions)."""
        self._seq = 0
        self._heap: list[tuple[float, int, PolicyItem]] = []
        self._bheap: list[tuple[float, int, PolicyItem]] = []
        self._queued = 0
        self._bqueued = 0
        self._dead = 0
        self._window_open: float | None = None
        self._in_flight = 0
        self._by_sibling: dict[Hashable, int] = {}
        self._attained: dict[Hashable, float] = {}
        self._last_decrease = -math.inf
        self._last_preemptions: float | None = None
        self._util_area = 0.0
        self._util_t: float | None = None
        self._util_t0: float | None = None
        self.latest_metrics: EngineMetrics | None = None
        # The decode cap (see `_decode_cap.py`): agent requests in flight, the
        # in-flight integral since the last metrics sample, and whether the cap
        # held an agent request back since then.
        self._decode: DecodeCap | None = None
        if adapting and policy.decode_cap:
            self._decode = DecodeCap(
                ceiling=policy.hard_cap,
                floor=policy.min_inflight,
                start=min(_DECODE_START, policy.hard_cap),
                elasticity=policy.decode_elasticity,
            )
        self._capped = 0
        self._demand = RunDemand()
        self._area = 0.0
        self._area_t0: float | None = None
        self._decode_bound = False
        self._idle = True
        # Until the engine's first metrics sample the cap is provisional (held at
        # its start): it goes when a sample lacks the generated-token counter, or
        # when none came within this long after the first request.
        self._decode_grace = max(_DECODE_GRACE_S, 4.0 * policy.metrics_interval_s)
        self._decode_deadline: float | None = None
        self._warming = warming
        self._warm_ttl = policy.warm_ttl_s
        self._warm: OrderedDict[Hashable, float] = OrderedDict()
        self._leaders: dict[Hashable, PolicyItem] = {}
        self._held: dict[Hashable, list[PolicyItem]] = {}
        self._held_count = 0
        self.warmups = 0
        """Leaders dispatched (prefix warm-ups started)."""
        self.held_total = 0
        """Items that were held behind a warming leader."""
        self.held_s = 0.0
        """Seconds items spent held behind leaders, summed."""

    # ------------------------------------------------------------------ views

    @property
    def queued(self) -> int:
        """Items waiting for a slot, held ones included (withdrawn ones excluded)."""
        return self._queued + self._bqueued + self._held_count

    @property
    def ready(self) -> int:
        """Items waiting for a slot that `plan` may grant (held ones excluded)."""
        return self._queued + self._bqueued

    @property
    def held(self) -> int:
        """Items held until their prefix is warm."""
        return self._held_count

    @property
    def warming(self) -> bool:
        """Whether prefix warming is on."""
        return self._warming

    def is_warm(self, prefix: Hashable, now: float) -> bool:
        """Whether a prefix key is warm now (warmed and used within `warm_ttl_s`)."""
        t = self._warm.get(prefix)
        return t is not None and now - t <= self._warm_ttl

    @property
    def in_flight(self) -> int:
        """Slots held now."""
        return self._in_flight

    @property
    def limit(self) -> int:
        """The current (adaptive) in-flight limit."""
        return self._ilimit

    @property
    def limit_exact(self) -> float:
        """The adaptive limit before rounding down."""
        return self._limit

    @property
    def slots_free(self) -> int:
        """Slots that may be granted now (never negative)."""
        free = self._ilimit - self._in_flight
        return free if free > 0 else 0

    @property
    def decode_limit(self) -> int | None:
        """The decode cap on agent requests in flight now (None: not capping).

        With engine metrics it holds from the first request (at its start
        until the engine's first sample) and stands down when the engine does
        not count generated tokens; see `BatchPolicy.decode_cap`.
        """
        d = self._decode
        return d.limit if d is not None else None

    @property
    def decode_cap(self) -> DecodeCap | None:
        """The decode cap's learner (None: off, or no engine metrics)."""
        return self._decode

    def inflight_by_sibling(self) -> dict[Hashable, int]:
        """Slots held per sibling id (siblings with none are absent)."""
        return dict(self._by_sibling)

    def attained_service(self, sibling_id: Hashable) -> float:
        """Seconds of inference a sibling has received so far (the LAS key)."""
        return self._attained.get(sibling_id, 0.0)

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
        mode = self._mode
        if mode == "depth_first":
            primary: float = -item.turn
        elif mode == "fifo":
            primary = 0
        else:
            sid = item.sibling_id
            primary = self._attained.get(sid, 0.0) if sid is not None else 0.0
        entry = (primary, item.seq, item)
        item.entry = entry
        item.enqueued_at = now
        item.in_batch = False
        if not item.batchable:
            self._track(item, 1)
        if self._warming and item.prefix is not None and not self._admit_prefix(item, now):
            item.state = HELD
            item.held_at = now
            self._held.setdefault(item.prefix, []).append(item)
            self._held_count += 1
            self.held_total += 1
            return
        self._push(item, now)
        if self._in_flight >= self._ilimit:
            self._saturated = True
            if self._sample_unspent and now - self._sample_t < self._interval:
                self._grow()

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
            or self._in_flight >= self._ilimit
            or (item.batchable and self._batching)
        ):
            return False
        if not item.batchable and self._decode is not None:
            room = self._decode_room(now)
            if room is not None and room <= 0:
                return False
        if self._warming and item.prefix is not None and not self._admit_prefix(item, now):
            return False
        if item.seq < 0:
            item.seq = self._seq
            self._seq += 1
        item.enqueued_at = now
        item.in_batch = False
        if not item.batchable:
            self._track(item, 1)
        self._grant(item, now)
        return True

    def withdraw(self, item: PolicyItem, now: float = 0.0) -> bool:
        """Remove a queued or held item (its caller went away). Lazy: O(1).

        A withdrawn prefix leader hands the lead to the best held item.

        Args:
            item: the item.
            now: the current time, seconds (for the held-time statistics).

        Returns:
            True when the item was queued; False when it was not (already
            granted, finished or withdrawn), which is not an error.
        """
        if item.state == HELD:
            item.state = WITHDRAWN
            if not item.batchable:
                self._track(item, -1)
            self._held_count -= 1
            self.held_s += now - item.held_at
            held = self._held[item.prefix]
            held.remove(item)
            if not held:
                del self._held[item.prefix]
            return True
        if item.state != QUEUED:
            return False
        item.state = WITHDRAWN
        if not item.batchable:
            self._track(item, -1)
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
        self._fill(plan, now)
        if (self._queued or self._bqueued) and self._in_flight >= self._ilimit:
            self._saturated = True
            if self._sample_unspent and now - self._sample_t < self._interval:
                self._grow()
                self._fill(plan, now)
        return plan

    def _fill(self, plan: Plan, now: float) -> None:
        free = self._ilimit - self._in_flight
        ready = self._batch_ready(now, plan)
        heap = self._heap
        room = self._decode_room(now) if self._decode is not None else None
        while free > 0:
            e = self._peek(heap) if self._queued else None
            if e is not None and room is not None and room <= 0 and not e[2].batchable:
                # The decode cap holds the plain queue (in priority order) back.
                self._decode_bound = True
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
            self._capped -= 1
            self._track(item, -1)
        if not self._in_flight:
            self._idle = True
        sid = item.sibling_id
        if sid is not None:
            n = self._by_sibling[sid] - 1
            if n:
                self._by_sibling[sid] = n
            else:
                del self._by_sibling[sid]
            if self._mode == "las":
                attained = self._attained
                service = attained.pop(sid, 0.0) + (now - item.dispatched_at)
                attained[sid] = service  # re-inserted last: the dict is kept in LRU order
                if len(attained) > _LAS_MEMORY:
                    del attained[next(iter(attained))]
        if item.leading:
            self._end_lead(item, warm=outcome is Outcome.OK, now=now)
        elif self._warming and item.prefix is not None and outcome is Outcome.OK:
            self._touch(item.prefix, now)
        if outcome is Outcome.OK:
            if (
                self.policy.adaptive
                and not self._has_metrics
                and self._limit < self._base
                and (self._queued or self._bqueued)
            ):
                # Recover towards the configured limit: ~+1 slot per window of completions.
                self._set_limit(min(self._base, self._limit + 1.0 / self._limit))
        elif outcome is Outcome.RATE_LIMITED or outcome is Outcome.OVERLOADED:
            self._decrease(now)

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
        before = self._held_count
        self._end_lead(item, warm=True, now=now)
        return self._held_count < before

    def on_metrics(self, metrics: EngineMetrics, now: float) -> None:
        """Adapt the limit to what the engine reports about its own load.

        Rising `num_preemptions_total` shrinks the limit and ends slow start.
        The first sample with `kv_capacity_tokens` may raise the starting
        limit (see `BatchPolicy.kv_tokens_per_request`). An empty engine queue
        (`num_requests_waiting == 0`) grows the limit, up to the hard cap, when
        we were limit-bound at any time since the previous sample; otherwise
        the growth stays available to the first limit-bound `enqueue`/`plan`
        while this sample is younger than `metrics_interval_s`.

        Args:
            metrics: the engine's figures.
            now: the current time, seconds.
        """
        self.latest_metrics = metrics
        self._sample_unspent = False
        saturated = self._saturated
        self._saturated = bool(self._queued or self._bqueued) and self._in_flight >= self._ilimit
        if self._decode is not None:
            if metrics.generation_tokens_total is None:
                self._decode = None  # the engine does not count generated tokens
            else:
                self._observe_decode(metrics, now)
        if not self.policy.adaptive or not self._has_metrics:
            return
        pre = metrics.num_preemptions_total
        last = self._last_preemptions
        if pre is not None:
            self._last_preemptions = pre
            if last is not None and pre > last:
                self._decrease(now)
                return
        if not self._sized and metrics.kv_capacity_tokens:
            self._sized = True
            per_request = self.policy.kv_tokens_per_request
            if self._slow_start and per_request:
                fits = min(self._cap, float(metrics.kv_capacity_tokens // per_request))
                if fits > self._limit:
                    self._set_limit(fits)
        waiting = metrics.num_requests_waiting
        if waiting is None or waiting > 0:
            return
        self._sample_t = now
        if saturated or self._saturated:
            self._grow()
        else:
            self._sample_unspent = True

    @property
    def in_slow_start(self) -> bool:
        """Whether the limit still doubles per sample (no overload seen yet)."""
        return self._slow_start

    def drain(self) -> list[PolicyItem]:
        """Remove and return every queued item (the scheduler is closing or dead)."""
        items = [e[2] for e in self._heap if e[2].state == QUEUED]
        items += [e[2] for e in self._bheap if e[2].state == QUEUED]
        for held in self._held.values():
            items += held
        items.sort(key=_seq_of)
        for it in items:
            it.state = WITHDRAWN
        self._heap.clear()
        self._bheap.clear()
        self._queued = self._bqueued = self._dead = 0
        self._window_open = None
        self._held.clear()
        self._held_count = 0
        self._leaders.clear()
        for it in items:
            if not it.batchable:
                self._track(it, -1)
        return items

    # ---------------------------------------------------------- prefix warming

    def _admit_prefix(self, item: PolicyItem, now: float) -> bool:
        # May the item be queued now (True), or must it be held (False)?
        key = item.prefix
        leader = self._leaders.get(key)
        if leader is item:
            return True
        if leader is not None:
            item.leading = False
            return False
        warm = self._warm
        t = warm.get(key)
        if t is not None and now - t <= self._warm_ttl:
            warm[key] = now
            warm.move_to_end(key)
            item.leading = False
            return True
        self._leaders[key] = item
        item.leading = True
        return True

    def _touch(self, key: Hashable, now: float) -> None:
        warm = self._warm
        if key in warm:
            warm[key] = now
            warm.move_to_end(key)

    def _end_lead(self, item: PolicyItem, *, warm: bool, now: float) -> None:
        # The leader got its first token or finished (warm=True), or failed,
        # was cancelled or withdrawn (warm=False). Keeps `item.leading` as it
        # is (the heap routing of a queued leader depends on it) apart from
        # unmarking a warmed leader, which has left the queue already.
        key = item.prefix
        if self._leaders.get(key) is not item:
            return
        del self._leaders[key]
        if warm:
            item.leading = False
            w = self._warm
            w[key] = now
            w.move_to_end(key)
            if len(w) > _WARM_MEMORY:
                w.popitem(last=False)
            held = self._held.pop(key, None)
            if held:
                self._held_count -= len(held)
                for it in held:
                    self.held_s += now - it.held_at
                    self._push(it, now)
            return
        held = self._held.get(key)
        if not held:
            return
        best = min(held, key=_entry_of)
        held.remove(best)
        if not held:
            del self._held[key]
        self._held_count -= 1
        self.held_s += now - best.held_at
        self._leaders[key] = best
        best.leading = True
        self._push(best, now)

    # -------------------------------------------------------------- decode cap

    def _observe_decode(self, metrics: EngineMetrics, now: float) -> None:
        # Feed the decode cap one sample: the engine's counters, our mean in
        # flight since the last one, whether we had nothing in flight for a
        # moment, and whether the cap held an agent request back meanwhile.
        decode = self._decode
        assert decode is not None
        generated = metrics.generation_tokens_total
        assert generated is not None
        prompt, hits = metrics.prompt_tokens_total, metrics.prefix_cache_hits_total
        prefill = None if prompt is None or hits is None else prompt - hits
        self._account(now)
        t0 = self._area_t0
        mean = self._area / (now - t0) if t0 is not None and now > t0 else float(self._in_flight)
        self._area = 0.0
        self._area_t0 = now
        bound = self._decode_bound
        if not bound and self._queued:
            room = self._decode_room(now)
            bound = room is not None and room <= 0
        self._decode_bound = False
        busy = not self._idle and self._in_flight > 0
        self._idle = self._in_flight == 0
        decode.observe(
            now,
            generated=generated,
            prefill=prefill,
            in_flight=mean,
            busy=busy,
            bound=bound,
            engines=metrics.engines or 1,
        )

    def _decode_room(self, now: float) -> int | None:
        """Agent items that may start now under the decode cap (None: no cap).

        The cap is rounded so that what the fan_out runs have left runs in
        equal waves, never a small last one (`DecodeCap.wave`). Before the
        engine's first metrics sample it is held at its start, for at most
        the grace period after the first request (then it stands down: the
        engine's metrics do not arrive).
        """
        decode = self._decode
        assert decode is not None
        if not decode.active:
            deadline = self._decode_deadline
            if deadline is None:
                self._decode_deadline = now + self._decode_grace
            elif now > deadline:
                self._decode = None
                return None
        return decode.wave(self._demand.siblings_left()) - self._capped

    def _track(self, item: PolicyItem, delta: int) -> None:
        # Count an agent item in (+1) or out (-1) of the demand.
        if delta > 0:
            self._demand.add(item.group, item.left)
        else:
            self._demand.remove(item.group, item.left)

    # -------------------------------------------------------------- internals

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
            self._capped += 1
        if item.leading:
            self.warmups += 1
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

    def _decrease(self, now: float) -> None:
        if not self.policy.adaptive or now - self._last_decrease < self.policy.adapt_cooldown_s:
            return
        self._last_decrease = now
        self._slow_start = False
        self._sample_unspent = False
        self.decreases += 1
        self._set_limit(max(self._floor, self._limit * self.policy.decrease_factor))

    def _grow(self) -> None:
        # Spend the current metrics sample on one increase.
        self._sample_unspent = False
        self._saturated = False
        step = self._limit if self._slow_start else self.policy.increase_step
        value = min(self._cap, self._limit + step)
        if value > self._limit:
            self.increases += 1
            self._set_limit(value)

    def _set_limit(self, value: float) -> None:
        self._limit = value
        self._ilimit = max(int(value), 1)

    def _account(self, now: float) -> None:
        t = self._util_t
        if t is None:
            self._util_t = self._util_t0 = now
            return
        if now > t:
            self._util_area += (now - t) * min(1.0, self._in_flight / self._ilimit)
            self._area += (now - t) * self._in_flight
            self._util_t = now


def _seq_of(item: PolicyItem) -> int:
    return item.seq


def _entry_of(item: PolicyItem) -> tuple[float, int]:
    e = item.entry
    assert e is not None
    return (e[0], e[1])
