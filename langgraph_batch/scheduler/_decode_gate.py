"""The decode cap as the policy core applies it: which agent requests may start now.

`DecodeCap` (`_decode_cap.py`) learns the cap from the engine's counters;
this gate feeds it (our mean in flight per sample, whether the cap held a
request back) and answers the core's one question, `room(now)`: how many
more agent requests (anything but one-shot, batchable ones) may start. It
holds at the cap's start from the first request until the engine's first
sample, and stands down for good when the engine does not count generated
tokens, or when no sample comes within a grace period. When every agent
request belongs to a fan_out run, the cap is rounded so that what the runs
have left goes in equal waves (`PolicyItem.left` reads the run's counter).

The cap is the engine's, not ours: other clients may share the engine (the
other workers of a Redis or Ray fan_out, each with a scheduler of its own,
or another job). Their requests are what the engine runs and queues beyond
ours (`num_requests_running + num_requests_waiting - ours`, the smaller of
the last two samples, so a sample taken while our answers were on the wire
does not count them as someone else's). They take their share of the cap,
and the learner fits the engine's concurrency, theirs included. Whatever
they run, we keep at least half the cap (`share`): two clients settle at
half each, and a busy neighbour never starves us.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from langgraph_batch.backends.base import EngineMetrics
from langgraph_batch.scheduler._config import BatchPolicy
from langgraph_batch.scheduler._decode_cap import DecodeCap
from langgraph_batch.scheduler._item import PolicyItem

__all__ = (
    "DECODE_GRACE_S",
    "DECODE_START",
    "LONG_HORIZON_TURNS",
    "DecodeGate",
    "RunDemand",
    "share",
)

DECODE_START = 16
"""Where the cap's search starts (like TCP's initial window, in requests): it
steps up from here while decode throughput keeps up, and probes after."""

DECODE_GRACE_S = 2.0
"""How long the cap waits for a first metrics sample before it stands down (at
least; 4 metrics intervals when that is longer)."""


class DecodeGate:
    """Agent requests in flight against the learned decode cap.

    Example:
        ```python
        gate = DecodeGate(policy, adapting=True)
        room = gate.room(now)        # None: not capping; <= 0: hold agent requests
        ```
    """

    def __init__(self, policy: BatchPolicy, *, adapting: bool) -> None:
        self.cap: DecodeCap | None = None
        """The learner (None: off, no engine metrics, or stood down)."""
        if adapting and policy.decode_cap:
            self.cap = DecodeCap(
                ceiling=policy.hard_cap,
                floor=policy.min_inflight,
                start=min(DECODE_START, policy.hard_cap),
                elasticity=policy.decode_elasticity,
            )
        self.capped = 0
        """Agent requests holding a slot."""
        self._demand = RunDemand()
        self._area = 0.0
        self._area_t0: float | None = None
        self.bound = False
        """The cap held an agent request back since the last sample."""
        self.idle = True
        """We had nothing in flight at some moment since the last sample."""
        self._grace = max(DECODE_GRACE_S, 4.0 * policy.metrics_interval_s)
        self._deadline: float | None = None
        self.foreign = 0
        """Requests of other clients the engine ran or queued at the last two samples."""
        self._foreign_last = 0

    def track(self, item: PolicyItem, delta: int) -> None:
        """Count an agent item in (+1) or out (-1) of the runs' demand."""
        if delta > 0:
            self._demand.add(item.group, item.left, item.turn)
        else:
            self._demand.remove(item.group, item.left)

    def account(self, seconds: float, in_flight: int) -> None:
        """`in_flight` requests were on the wire for `seconds` (the in-flight integral)."""
        self._area += seconds * in_flight

    def room(self, now: float) -> int | None:
        """Agent items that may start now (None: no cap).

        Rounded so that what the fan_out runs have left runs in equal waves,
        never a small last one (`DecodeCap.wave`). Before the engine's first
        sample the cap holds at its start, for at most the grace period after
        the first request (then it stands down: the metrics do not arrive).
        """
        cap = self.cap
        if cap is None:
            return None
        if not cap.active:
            deadline = self._deadline
            if deadline is None:
                self._deadline = now + self._grace
            elif now > deadline:
                self.cap = None
                return None
        return share(cap.wave(self._demand.siblings_left()), self.foreign) - self.capped

    def observe(self, metrics: EngineMetrics, now: float, *, in_flight: int, queued: int) -> None:
        """Feed the cap one sample (after `account` brought the integral up to `now`).

        The engine's counters, our mean in flight since the last sample,
        whether we had nothing in flight for a moment, and whether the cap
        held an agent request back meanwhile.
        """
        cap = self.cap
        if cap is None:
            return
        generated = metrics.generation_tokens_total
        if generated is None:
            self.cap = None  # the engine does not count generated tokens
            return
        prompt, hits = metrics.prompt_tokens_total, metrics.prefix_cache_hits_total
        prefill = None if prompt is None or hits is None else prompt - hits
        t0 = self._area_t0
        mean = self._area / (now - t0) if t0 is not None and now > t0 else float(in_flight)
        self._area = 0.0
        self._area_t0 = now
        bound = self.bound
        if not bound and queued:
            room = self.room(now)
            bound = room is not None and room <= 0
        self.bound = False
        busy = not self.idle and in_flight > 0
        self.idle = in_flight == 0
        self._see_foreign(metrics, in_flight)
        cap.observe(
            now,
            generated=generated,
            prefill=prefill,
            in_flight=mean + self.foreign,
            busy=busy,
            bound=bound,
            engines=metrics.engines or 1,
        )

    def _see_foreign(self, metrics: EngineMetrics, in_flight: int) -> None:
        running = metrics.num_requests_running
        if running is None:
            self.foreign = self._foreign_last = 0
            return
        seen = max(0, round(running + (metrics.num_requests_waiting or 0)) - in_flight)
        self.foreign = min(seen, self._foreign_last)
        self._foreign_last = seen


def share(cap: int, foreign: int) -> int:
    """Our part of the engine's decode cap when other clients run `foreign` requests.

    What they leave, and never less than half the cap (rounded up): two
    clients that each see the other settle near half each.

    Example:
        ```python
        share(16, 0)   # 16: alone
        share(16, 5)   # 11
        share(16, 40)  # 8: half, however busy the engine is
        ```
    """
    return max(cap - foreign, -(-cap // 2))


LONG_HORIZON_TURNS = 4
"""A run whose requests reach this many completed calls per sibling is long-horizon: its
siblings do not finish in a wave (each has turns left), so the cap is not rounded for it."""


class _RunRequests:
    """A fan_out run with agent requests queued or running."""

    __slots__ = ("deepest", "left", "live")

    def __init__(self, left: Callable[[], int]) -> None:
        self.live = 0
        self.left = left
        self.deepest = 0
        """The most calls a sibling of the run had completed when it queued a request."""


class RunDemand:
    """The agent requests queued or running, by fan_out run (for `DecodeCap.wave`).

    Each request says which run it belongs to and carries the run's counter of
    siblings not finished yet (`SiblingInfo.left`); requests of no known run
    make the demand unknown.

    Example:
        ```python
        demand = RunDemand()
        demand.add("run-1", lambda: 40)
        assert demand.siblings_left() == 40
        demand.add(None, None)            # a request outside any fan_out
        assert demand.siblings_left() is None
        ```
    """

    __slots__ = ("_runs", "_solo")

    def __init__(self) -> None:
        self._runs: dict[Hashable, _RunRequests] = {}
        self._solo = 0

    def add(self, run: Hashable | None, left: Callable[[], int] | None, turn: int = 0) -> None:
        """A request of `run` was queued (its counter: `left`; None, None: of no run).

        `turn`: the calls its sibling had completed (a deep one marks a long-horizon run).
        """
        if run is None or left is None:
            self._solo += 1
            return
        r = self._runs.get(run)
        if r is None:
            r = self._runs[run] = _RunRequests(left)
        r.live += 1
        if turn > r.deepest:
            r.deepest = turn

    def remove(self, run: Hashable | None, left: Callable[[], int] | None) -> None:
        """A request of `run` finished or was withdrawn (the same arguments as `add`)."""
        if run is None or left is None:
            self._solo = max(0, self._solo - 1)
            return
        r = self._runs.get(run)
        if r is None:
            return
        r.live -= 1
        if r.live <= 0:
            del self._runs[run]

    def siblings_left(self) -> int | None:
        """Siblings the runs in progress have left (None: unknown, or no run in progress).

        A run counts at least its requests queued or running (a sibling may
        have several). A long-horizon run (`LONG_HORIZON_TURNS`) makes it
        unknown: its siblings finish one by one, many turns apart, never in
        one last wave, so rounding the cap up to all of them would only put
        more sequences into every decode step (measured on W8's agents of 6-24
        turns: rounded up to ~32 at ~30 left, decode slowed ~2x per token and
        the run took 1.25x longer than at the learned 16).
        """
        if self._solo or not self._runs:
            return None
        total = 0
        for r in self._runs.values():
            if r.deepest >= LONG_HORIZON_TURNS:
                return None
            left = r.left()
            total += left if left > r.live else r.live
        return total
