"""The decode cap: how many requests to keep decoding at once, learned from the engine.

Long-context decode is bandwidth-bound: every step reads every running
sequence's whole KV cache, so past some batch size a step costs about as much
more as the sequences it adds and the engine's token throughput stops growing
(vLLM 0.26 on an H100 with ~3k-token contexts: ~1.9k tokens/s at 16 sequences
and at 96). Past that point a larger batch only makes every sequence slower:
an agent's turn ends later, its tool call starts later and its siblings finish
together at the end instead of one after another.

`DecodeCap` finds that point from the engine's own counters, sampled by the
scheduler (`/metrics`): generated tokens (`vllm:generation_tokens_total`,
`sglang:generation_tokens_total`) and, where the engine reports them, prompt
tokens and prompt tokens served from its prefix cache (the difference is the
prefill it computed). Between two samples the engine spent its time decoding
and prefilling:

    seconds = generated * u(B) + computed_prefill * c

where `u(B)` is the decode time per generated token at `B` requests in flight
(our mean over the interval) and `c` the prefill time per computed token, an
engine constant. `u` for each concurrency level and the shared `c` are fitted
by least squares over the last `memory` samples. The two costs can be told
apart once the window holds, at one concurrency level, intervals with
clearly different amounts of prefill per generated token (agent workloads
do: turns that start siblings are prefill-heavy, answer turns are not);
until then only intervals that computed fewer prompt tokens than they
generated measure `u`, so a phase that is all prefill (a burst of new
siblings) never passes for slow decode. After, an interval measures `u`
when its estimated decode time is at least half of it. Without prefill
counters `c` is 0 and every interval measures `u`, prefill included.
Intervals in which we had nothing in flight for a moment are left out: the
engine may have idled.

The cap moves on a geometric grid (steps of sqrt 2) to maximise the power

    J(B) = -ln u(B) - e * ln B,    e = `elasticity` (0.25 by default),

that is, it takes a step towards more concurrency only when decode throughput
(1/u) grows at least `e` times as fast as concurrency, in relative terms (and
by more than `margin`, against noise). Like TCP's slow start it steps up from
`start` while that pays, and steps back to the last level that paid; then it
probes one step up every `probe_every` samples (cheap where throughput is
flat, past the knee), and one step down when decode at its level got slower by
several margins since it settled there (contexts grew), on down while that
pays. A level is judged on two intervals at least. Only intervals in which
the cap held a request back can move it: without a backlog there is nothing
to learn about more concurrency.

At the end of a fan_out run the cap is rounded (`wave`) so that what the run
has left runs in equal waves: 100 siblings at a cap of 16 run in waves of 17
(not six of 16 and a last one of 4, which would decode alone at a fraction
of the throughput), and fewer than two caps' worth run at once (the gate's
`RunDemand`, in `_decode_gate.py`, says how many siblings the runs have left).

The objects are pure: fed numbers with an explicit `now`, no clock.
`Planner` owns them when the backend reports engine metrics and
applies the cap to agent requests (see `BatchPolicy.decode_cap`).

Example:
    ```python
    cap = DecodeCap(ceiling=256)
    for i in range(3):  # 1.9k tokens/s at 16 requests in flight, others held back
        cap.observe(0.5 * i, generated=950 * i, prefill=0, in_flight=16, busy=True, bound=True)
    assert cap.limit == 23  # slow start tries one step up
    ```
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

__all__ = ("DecodeCap",)

_STEP = math.sqrt(2.0)
_LOG_STEP = math.log(_STEP)

_REGIME = 3.0
"""Decode at the current level this many margins slower than when the cap settled
there means the regime changed (longer contexts): the cap looks one step down."""

_SETTLE = 2
"""Samples at a level, after the cap moved there, before it is judged."""

_FIT_ROUNDS = 16
"""Coordinate-descent rounds of the least-squares fit per sample (a window of a
few dozen intervals: microseconds)."""

_RATIO_SPREAD = 2.0
"""The prefill cost is told apart from decode once the window holds intervals
whose prompt tokens computed per generated token differ this many times."""

_DECODE_SHARE = 0.5
"""Once the prefill cost is known, an interval measures decode when its estimated
decode time is at least this share of it."""


@dataclass(frozen=True, slots=True)
class _Sample:
    """One interval between two metrics samples."""

    k: int
    """Grid index of our mean concurrency."""
    seconds: float
    tokens: float
    """Tokens generated."""
    prefill: float
    """Prompt tokens computed (0 when the engine does not say)."""
    log_b: float
    """ln of our mean concurrency."""
    index: int
    """Its sample number."""


@dataclass(frozen=True, slots=True)
class _Level:
    """The fitted decode cost at one grid level."""

    log_u: float
    """ln(decode seconds per generated token)."""
    log_b: float
    """Mean ln(concurrency) of its samples."""
    last: int
    """Sample number of its latest sample."""
    fresh: int
    """Its samples taken since the cap last moved."""


def _grid(k: int) -> int:
    """The cap at grid index `k`: round(sqrt(2) ** k), so 8, 11, 16, 23, 32, 45, 64, ..."""
    return max(1, round(_STEP**k))


def _index(value: float) -> int:
    """The grid index nearest to `value` (in log scale)."""
    return round(math.log(value) / _LOG_STEP)


class DecodeCap:
    """Learns the concurrency past which the engine's decode throughput stops growing.

    Args:
        ceiling: the cap never exceeds this (the scheduler's hard cap).
        start: where the search starts (clamped to `floor..ceiling`, rounded
            to the grid).
        floor: the cap never goes below this.
        elasticity: `e` in the power `-ln u - e ln B` the cap maximises: a step
            up must raise decode throughput by at least `e` times the relative
            rise in concurrency. 0 < e < 1; lower favours throughput, higher
            per-request latency.
        probe_every: samples between two probes one step up.
        memory: how many recent samples the fit uses.
        margin: relative difference in throughput below which two levels count
            as equal (hysteresis against noise).

    Raises:
        ValueError: a bound that is not a positive integer, `floor > ceiling`,
            or a parameter out of range.

    Example:
        ```python
        cap = DecodeCap(ceiling=256, start=16)
        cap.observe(now, generated=gen, prefill=computed, in_flight=mean, busy=True, bound=True)
        allowed = cap.limit
        ```
    """

    def __init__(
        self,
        *,
        ceiling: int,
        start: int = 16,
        floor: int = 1,
        elasticity: float = 0.25,
        probe_every: int = 8,
        memory: int = 24,
        margin: float = 0.03,
    ) -> None:
        for name, value in (
            ("ceiling", ceiling),
            ("start", start),
            ("floor", floor),
            ("probe_every", probe_every),
            ("memory", memory),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        if floor > ceiling:
            raise ValueError(f"floor={floor} must be <= ceiling={ceiling}")
        if not 0.0 < elasticity < 1.0:
            raise ValueError(f"elasticity={elasticity!r} must be in (0, 1)")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin={margin!r} must be in [0, 1)")
        self._ceiling = ceiling
        self._floor = floor
        self._e = elasticity
        self._probe_every = probe_every
        self._margin = math.log1p(margin)
        self._k_min = _index(floor)
        while _grid(self._k_min) < floor:
            self._k_min += 1
        self._k_max = max(self._k_min, _index(ceiling))
        while self._k_max > self._k_min and _grid(self._k_max) > ceiling:
            self._k_max -= 1
        self._k = min(max(_index(start), self._k_min), self._k_max)
        self._window: collections.deque[_Sample] = collections.deque(maxlen=memory)
        self._levels: dict[int, _Level] = {}
        self._c = 0.0
        self._c_known = False
        self._used: dict[int, list[_Sample]] = {}
        self._samples = 0
        self._moved_at = 0
        """Sample count when the cap last moved (a level is measured after it)."""
        self._probed_at = 0
        self._settled: float | None = None
        """ln u at the current level when the cap settled there (None: not settled)."""
        self._came_from: int | None = None
        """In slow start: the level the last step up left."""
        self._descending = False
        """The last move was down and paid: keep looking one step lower."""
        self._probed_from: int | None = None
        """The level the last probe up left (going back there is no step down)."""
        self._slow_start = True
        self._last: tuple[float, float, float | None] | None = None
        self._engines = 1
        self.moves = 0
        """Times the cap moved."""

    # ------------------------------------------------------------------ views

    @property
    def limit(self) -> int:
        """The cap now: how many requests may decode at once (on all engines)."""
        return min(max(_grid(self._k) * self._engines, self._floor), self._ceiling)

    @property
    def active(self) -> bool:
        """Whether the engine has reported generated tokens (before that: no cap)."""
        return self._last is not None

    @property
    def in_slow_start(self) -> bool:
        """Whether the cap still steps up while that pays."""
        return self._slow_start

    @property
    def prefill_s_per_token(self) -> float:
        """The fitted prefill time per computed token (0 until prefill was measured)."""
        return self._c

    def throughput(self, concurrency: float) -> float | None:
        """Fitted decode tokens/s at the grid level nearest `concurrency` (None: unmeasured).

        Both on all engines (the fit is per engine).
        """
        per_engine = concurrency / self._engines
        if per_engine < 1:
            return None
        level = self._levels.get(_index(per_engine))
        return None if level is None else self._engines * math.exp(-level.log_u)

    def wave(self, left: int | None) -> int:
        """The cap rounded so that `left` remaining siblings run in equal waves.

        Args:
            left: how many siblings the runs in progress have left (None:
                unknown; some requests belong to no known run).

        Returns:
            The cap itself when `left` is unknown or fits under it; otherwise
            the smallest size of `left // cap` equal waves (between the cap and
            twice the cap: all of what is left when that is under two caps), or,
            when the engine is known to decode slower at that size, the size of
            one more wave when that stays at the cap's grid level (just under
            the cap: 30 left at a cap of 16 go as 15 and 15). Never above the
            cap's grid level while that level is not measured since the cap
            moved there (the start level counts as measured): then equal waves
            at the cap's level, or the cap itself. Rounding up past an
            unmeasured cap would keep it from ever being judged: every tick of
            a simulation is a new run with all its siblings left, so slow
            start's step to 23 ran every tick as two waves of 32 and stayed
            there (W9).

        Example:
            ```python
            assert DecodeCap(ceiling=256, start=16).wave(100) == 17   # 6 waves: 17 x 4 + 16 x 2
            assert DecodeCap(ceiling=256, start=16).wave(20) == 20    # all at once
            ```
        """
        cap = self.limit
        if left is None or left <= cap:
            return cap
        waves = left // cap
        size = -(-left // waves)
        smaller = -(-left // (waves + 1))  # one more wave: at most the cap
        at_level = _index(smaller / self._engines) >= self._k  # not below the cap's level
        if _index(size / self._engines) > self._k and not self._measured_here():
            return smaller if at_level else cap
        if self.slower_at(size) and at_level:
            size = smaller
        return min(size, self._ceiling)

    def _measured_here(self) -> bool:
        """Whether the cap's level has been measured since the cap moved there.

        The start level counts as measured: it is the prior the rounding was
        designed around, and a fresh scheduler's first runs keep their equal waves.
        """
        return not self.moves or self._power(self._k, since_move=True) is not None

    def slower_at(self, concurrency: float) -> bool:
        """Whether decode at `concurrency` is known to be slower than at the cap now.

        Known: measured at its grid level, slower by more than the margin. The
        scheduler rounds the cap up at the end of a fan_out run (equal waves,
        no small last one) only to a concurrency not known to be slower.
        """
        here = self._levels.get(self._k)
        per_engine = concurrency / self._engines
        there = self._levels.get(_index(per_engine)) if per_engine >= 1 else None
        if here is None or there is None:
            return False
        return there.log_u > here.log_u + self._margin

    # ---------------------------------------------------------------- events

    def observe(
        self,
        now: float,
        *,
        generated: float,
        prefill: float | None,
        in_flight: float,
        busy: bool,
        bound: bool,
        engines: int = 1,
    ) -> None:
        """Learn from one metrics sample.

        Args:
            now: the sample's time, seconds.
            generated: the engine's generated-tokens counter.
            prefill: the engine's count of prompt tokens it computed (prompt
                tokens less prefix-cache hits), or None when it does not say.
            in_flight: our mean number of requests in flight since the previous sample.
            busy: whether we had a request in flight all the time since then.
            bound: whether the cap held a request back since then.
            engines: how many engines the counters sum over (a pool's replicas):
                the fit is per engine (load spread evenly), the cap for all.
        """
        engines = max(1, engines)
        last = self._last
        self._last = (now, generated, prefill)
        if last is None or engines != self._engines:
            # First sample, or the counters now cover other engines: a new baseline.
            self._engines = engines
            return
        dt = now - last[0]
        tokens = generated - last[1]
        computed = 0.0 if prefill is None or last[2] is None else max(0.0, prefill - last[2])
        if dt <= 0 or tokens <= 0 or not busy or in_flight < 1.0:
            # No interval, a counter reset (server restart), or the engine may
            # have idled: nothing to learn.
            return
        per_engine = in_flight / engines
        if per_engine < 1.0:
            return
        self._samples += 1
        self._window.append(
            _Sample(
                k=_index(per_engine),
                seconds=dt,
                tokens=tokens / engines,
                prefill=computed / engines,
                log_b=math.log(per_engine),
                index=self._samples,
            )
        )
        self._fit()
        if bound:
            self._decide()

    # -------------------------------------------------------------- internals

    def _fit(self) -> None:
        # Least squares of seconds = tokens * u[k] + prefill * c over the window
        # (coordinate descent: u per level given c, then c given every u). The
        # prefill cost is known once the window mixes intervals of clearly
        # different prefill per generated token (else the two costs cannot be
        # told apart); from then on an interval measures u when its estimated
        # decode time is at least half of it. Before, only intervals that
        # computed fewer prompt tokens than they generated measure u, as if
        # prefill were free.
        window = self._window
        c = self._c
        known = self._c_known or self._separable()
        u: dict[int, float] = {}
        for _ in range(_FIT_ROUNDS if known else 1):
            u = self._fit_u(c if known else 0.0, known)
            if not known:
                break
            cn = cd = 0.0
            for s in window:
                uk = u.get(s.k)
                if uk is not None and s.prefill > 0:
                    cn += s.prefill * (s.seconds - s.tokens * uk)
                    cd += s.prefill * s.prefill
            c = max(0.0, cn / cd) if cd > 0 else 0.0
        if known:
            u = self._fit_u(c, known)
        self._c, self._c_known = c, known
        levels: dict[int, _Level] = {}
        for k, uk in u.items():
            samples = self._used[k]
            levels[k] = _Level(
                log_u=math.log(uk),
                log_b=sum(s.log_b for s in samples) / len(samples),
                last=samples[-1].index,
                fresh=sum(1 for s in samples if s.index > self._moved_at),
            )
        self._levels = levels

    def _separable(self) -> bool:
        # Some level's intervals differ clearly in prefill per generated token
        # (and some are prefill-heavy): there, decode and prefill costs differ
        # in how they add up, and least squares can tell them apart.
        ratios: dict[int, list[float]] = {}
        for s in self._window:
            ratios.setdefault(s.k, []).append(s.prefill / s.tokens)
        return any(
            len(r) >= 2 and max(r) > 1 and min(r) * _RATIO_SPREAD <= max(r) for r in ratios.values()
        )

    def _fit_u(self, c: float, known: bool) -> dict[int, float]:
        # u per level from the intervals that measure it (see `_fit`); keeps
        # them in `_used` for the level statistics.
        num: dict[int, float] = {}
        den: dict[int, float] = {}
        used: dict[int, list[_Sample]] = {}
        for s in self._window:
            decode_s = s.seconds - s.prefill * c
            ok = decode_s >= _DECODE_SHARE * s.seconds if known else s.prefill <= s.tokens
            if ok:
                num[s.k] = num.get(s.k, 0.0) + s.tokens * decode_s
                den[s.k] = den.get(s.k, 0.0) + s.tokens * s.tokens
                used.setdefault(s.k, []).append(s)
        self._used = used
        return {k: num[k] / den[k] for k in num if num[k] > 0}

    def _power(self, k: int, *, since_move: bool = False) -> float | None:
        """J at level k, or None when it has no recent measurement."""
        level = self._levels.get(k)
        if level is None or (since_move and level.fresh < _SETTLE):
            return None
        return -level.log_u - self._e * level.log_b

    def _move(self, k: int) -> None:
        k = min(max(k, self._k_min), self._k_max)
        if k != self._k:
            self._k = k
            self.moves += 1
            self._settled = None
        self._moved_at = self._samples

    def _decide(self) -> None:
        k = self._k
        here = self._power(k, since_move=True)
        if here is None:
            return  # the current level has not been measured since the cap moved there
        margin = self._margin
        if self._slow_start:
            came = self._came_from
            before = None if came is None else self._power(came)
            if came is not None and before is not None and here <= before + margin:
                # The last step up did not pay: back to where it started, and settle.
                self._slow_start = False
                self._probed_at = self._samples
                self._move(came)
                return
            if k >= self._k_max:
                self._slow_start = False
                return
            self._came_from = k
            self._move(k + 1)
            return
        up = self._power(k + 1) if k < self._k_max else None
        down = self._power(k - 1) if k > self._k_min else None
        best, target = here + margin, k
        if up is not None and up > best:
            best, target = up, k + 1
        if down is not None and down > best:
            target = k - 1
        if target != k:
            self._descending = target < k and target != self._probed_from
            self._probed_from = None
            self._move(target)
            return
        log_u = self._levels[k].log_u
        if self._settled is None:
            self._settled = log_u
        # The last step down paid only when this level beats the one it left by
        # more than the margin: a tie (noise, or intervals of another phase of
        # the job) settles here, or every tie would walk the cap down.
        paid = self._descending and up is not None and here > up + margin
        if down is None and k > self._k_min and (paid or log_u > self._settled + _REGIME * margin):
            # The last step down paid, or decode got slower here since the cap
            # settled (contexts grew): look one step lower.
            self._descending = True
            self._probed_at = self._samples
            self._move(k - 1)
            return
        self._descending = False
        if up is None and k < self._k_max and self._samples - self._probed_at >= self._probe_every:
            self._probed_at = self._samples
            self._probed_from = k
            self._move(k + 1)
