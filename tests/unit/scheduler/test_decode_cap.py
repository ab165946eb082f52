"""DecodeCap: learning where decode throughput stops growing, with explicit clocks.

The engines here are synthetic: a decode throughput curve X(B) (tokens/s at B
requests in flight) and, for prefill, a cost per computed token. The
emulator's fitted H100 profile supplies the realistic curves.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import pytest

from langgraph_batch.emulator.costs import get_profile
from langgraph_batch.scheduler._decode_cap import DecodeCap
from langgraph_batch.scheduler._decode_gate import RunDemand

Curve = Callable[[float], float]


def h100(context: int) -> Curve:
    """Decode tokens/s of the emulator's vLLM-0.26-on-H100 fit at `context` tokens."""
    profile = get_profile("h100-llama3-8b")
    return lambda b: b / profile.decode_step_time(round(b), context)


def linear_until(knee: float, per_request: float = 130.0) -> Curve:
    return lambda b: per_request * min(b, knee)


class Engine:
    """Feeds a DecodeCap samples from a synthetic engine, every `dt` seconds."""

    def __init__(
        self,
        cap: DecodeCap,
        curve: Curve,
        *,
        demand: int = 1000,
        prefill_s_per_token: float = 0.0,
        dt: float = 0.5,
    ) -> None:
        self.cap = cap
        self.curve = curve
        self.demand = demand
        self.c = prefill_s_per_token
        self.dt = dt
        self.t = 0.0
        self.generated = 0.0
        self.prefill = 0.0
        self.limits: list[int] = []
        cap.observe(0.0, generated=0.0, prefill=0.0, in_flight=1.0, busy=True, bound=True)

    def run(self, samples: int, *, prefill: Callable[[int], float] = lambda i: 0.0) -> None:
        for i in range(samples):
            b = min(self.cap.limit, self.demand)
            computed = prefill(i)
            decode_s = self.dt - computed * self.c
            assert decode_s > 0
            self.t += self.dt
            self.generated += self.curve(b) * decode_s
            self.prefill += computed
            self.cap.observe(
                self.t,
                generated=self.generated,
                prefill=self.prefill,
                in_flight=float(b),
                busy=True,
                bound=self.demand > b,
            )
            self.limits.append(self.cap.limit)

    def settled(self) -> int:
        """The cap most of the last 20 samples ran at (probes aside)."""
        return statistics.mode(self.limits[-20:])


def test_settles_at_the_knee_of_a_bandwidth_bound_engine() -> None:
    # ~3k-token contexts: throughput is flat (and dips) past 16 sequences.
    cap = DecodeCap(ceiling=256)
    engine = Engine(cap, h100(3000))
    engine.run(40)
    assert not cap.in_slow_start
    assert engine.settled() == 16
    assert 23 in engine.limits  # it tried one step up, which did not pay
    assert set(engine.limits) == {16, 23}
    assert cap.throughput(16) == pytest.approx(h100(3000)(16), rel=1e-6)


def test_climbs_while_throughput_grows_with_short_contexts() -> None:
    # ~64-token contexts: decode throughput grows almost linearly up to 64.
    cap = DecodeCap(ceiling=256)
    engine = Engine(cap, h100(64))
    engine.run(40)
    assert engine.settled() == 64
    assert max(engine.limits) == 91  # the step past the knee, taken back


def test_learns_different_caps_for_different_engines() -> None:
    found = {}
    for knee in (11, 23, 45, 91):
        engine = Engine(DecodeCap(ceiling=512), linear_until(knee))
        engine.run(60)
        found[knee] = engine.settled()
    # A knee below the start keeps the start: nothing measured the level below
    # better (throughput is flat there, so this costs latency, not throughput).
    assert found == {11: 16, 23: 23, 45: 45, 91: 91}


def test_never_exceeds_the_ceiling_and_stops_slow_start_there() -> None:
    cap = DecodeCap(ceiling=40, start=16)
    engine = Engine(cap, linear_until(1000))
    engine.run(20)
    assert max(engine.limits) <= 40
    assert cap.limit == 32
    assert not cap.in_slow_start


def test_start_and_floor_are_clamped_to_the_grid_and_ceiling() -> None:
    assert DecodeCap(ceiling=10, start=16).limit == 8
    assert DecodeCap(ceiling=256, start=3, floor=4).limit == 4
    assert DecodeCap(ceiling=1, start=16).limit == 1
    assert DecodeCap(ceiling=256, start=20).limit == 23
    assert DecodeCap(ceiling=256, start=12, floor=12).limit == 16  # the grid level >= floor


def test_learns_the_prefill_cost_and_sees_through_it() -> None:
    # Every other interval spends a third of its time on 8k prefill tokens (20 us each).
    cap = DecodeCap(ceiling=256)
    engine = Engine(cap, h100(3000), prefill_s_per_token=20e-6)
    engine.run(40, prefill=lambda i: 8000.0 if i % 2 else 0.0)
    assert cap.prefill_s_per_token == pytest.approx(20e-6, rel=0.05)
    assert cap.limit == 16
    assert cap.throughput(16) == pytest.approx(h100(3000)(16), rel=0.02)


def test_a_phase_of_all_prefill_does_not_move_the_cap() -> None:
    # Every interval is prefill-heavy (a burst of new siblings, or W3 at a high
    # time scale): decode is a small share of the engine's time, nothing is
    # measured about it, and the cap stays where it is.
    cap = DecodeCap(ceiling=256)
    engine = Engine(cap, h100(5000), prefill_s_per_token=20e-6)
    engine.run(30, prefill=lambda i: 12_000.0)
    assert cap.moves == 0
    assert cap.throughput(16) is None
    # Once decode-dominated intervals come, it learns again (and c from the heavy ones).
    engine.run(30, prefill=lambda i: 8000.0 if i % 2 else 0.0)
    assert cap.prefill_s_per_token == pytest.approx(20e-6, rel=0.05)
    assert engine.settled() == 16


def test_varying_prefill_tells_the_two_costs_apart() -> None:
    # Every interval is prefill-heavy but by different amounts (W3's agents at
    # a high time scale): least squares still separates decode from prefill.
    cap = DecodeCap(ceiling=256)
    engine = Engine(cap, h100(5000), prefill_s_per_token=20e-6)
    engine.run(40, prefill=lambda i: (6000.0, 12_000.0, 18_000.0)[i % 3])
    assert cap.prefill_s_per_token == pytest.approx(20e-6, rel=0.01)
    assert cap.throughput(16) == pytest.approx(h100(5000)(16), rel=0.01)
    assert engine.settled() == 16
    assert 23 in engine.limits


def test_without_prefill_counters_every_interval_counts() -> None:
    cap = DecodeCap(ceiling=256)
    cap.observe(0.0, generated=0, prefill=None, in_flight=16, busy=True, bound=True)
    cap.observe(0.5, generated=950, prefill=None, in_flight=16, busy=True, bound=True)
    cap.observe(1.0, generated=1900, prefill=None, in_flight=16, busy=True, bound=True)
    assert cap.prefill_s_per_token == 0.0
    assert cap.throughput(16) == pytest.approx(1900)
    assert cap.limit == 23  # slow start steps up after two samples at 16


def test_a_cap_that_held_nothing_back_does_not_move() -> None:
    cap = DecodeCap(ceiling=256)
    engine = Engine(cap, linear_until(1000), demand=10)
    engine.run(20)
    assert cap.limit == 16
    assert cap.moves == 0
    assert cap.throughput(10) == pytest.approx(1300)  # measured all the same


@pytest.mark.parametrize(
    ("dt", "tokens", "busy", "in_flight"),
    [
        (0.0, 100.0, True, 16.0),  # no interval
        (0.5, 0.0, True, 16.0),  # nothing decoded
        (0.5, -5000.0, True, 16.0),  # counter reset (server restart)
        (0.5, 100.0, False, 16.0),  # we had nothing in flight for a moment
        (0.5, 100.0, True, 0.5),  # below one request on average
    ],
)
def test_intervals_that_say_nothing_are_ignored(
    dt: float, tokens: float, busy: bool, in_flight: float
) -> None:
    cap = DecodeCap(ceiling=256)
    assert not cap.active
    cap.observe(10.0, generated=10_000, prefill=0, in_flight=16, busy=True, bound=True)
    assert cap.active
    cap.observe(
        10.0 + dt,
        generated=10_000 + tokens,
        prefill=0,
        in_flight=in_flight,
        busy=busy,
        bound=True,
    )
    assert cap.throughput(16) is None
    assert cap.throughput(in_flight) is None


def test_steps_up_when_the_level_above_becomes_better() -> None:
    # Contexts shrink mid-run: a periodic probe finds that more now pays.
    cap = DecodeCap(ceiling=256, probe_every=4)
    engine = Engine(cap, h100(3000))
    engine.run(20)
    assert cap.limit == 16
    engine.curve = h100(64)
    engine.run(40)
    assert cap.limit == 64


def test_steps_down_when_decode_gets_slower_at_its_level() -> None:
    # Contexts grow until the knee is far below the cap: it looks one step
    # down, and on down while that pays.
    cap = DecodeCap(ceiling=256, start=32, memory=6)
    engine = Engine(cap, linear_until(30))
    engine.run(20)
    assert engine.settled() == 32
    engine.curve = linear_until(9, per_request=60.0)
    engine.run(40)
    assert engine.settled() == 11
    assert min(engine.limits) == 8  # one step too far, taken back


def test_a_tie_after_a_step_down_settles_there() -> None:
    # Below 23 throughput grows exactly as fast as the objective asks (X ~ B ** e):
    # 8, 11, 16 and 23 are worth the same; 32 is worse. Once 23 is measured
    # better than 32 the cap steps down, and on down while that pays; at 16 it
    # finds a tie and stays, instead of walking down to the floor on ties.
    cap = DecodeCap(ceiling=256, start=32, memory=8, probe_every=1000)
    engine = Engine(cap, linear_until(32))
    engine.run(12)
    assert cap.limit == 32
    engine.curve = lambda b: 1000.0 * (min(b, 23.0) / 23.0) ** 0.25 * (0.8 if b > 23 else 1.0)
    engine.demand = 23  # a lull measures 23
    engine.run(4)
    engine.demand = 1000
    engine.run(30)
    assert engine.settled() == 16
    assert engine.limits[-20:] == [16] * 20  # it stays there
    assert min(engine.limits) == 16  # and never looked lower


def test_steps_down_to_a_lower_level_measured_better() -> None:
    cap = DecodeCap(ceiling=256, start=32, memory=8)
    engine = Engine(cap, linear_until(32))
    engine.run(12)
    assert not cap.in_slow_start
    engine.limits.clear()
    # Decode above 23 becomes slow (another tenant's load, say); a lull in
    # demand measures 23, and once the cap holds requests back again it moves.
    engine.curve = lambda b: 130.0 * b if b <= 23 else 1500.0
    engine.demand = 23
    engine.run(4)
    assert cap.limit in (32, 45)
    engine.demand = 1000
    engine.run(8)
    assert engine.limits[-1] == 23


def test_the_cap_is_learned_per_engine_and_applies_to_all() -> None:
    # Four replicas behind a pool: the counters are sums, the load is spread.
    cap = DecodeCap(ceiling=1024)
    four = h100(3000)
    t, gen = 0.0, 0.0
    cap.observe(t, generated=gen, prefill=0, in_flight=64, busy=True, bound=True, engines=4)
    assert cap.limit == 64  # 16 per engine
    limits = []
    for _ in range(30):
        b = cap.limit
        t += 0.5
        gen += 4 * four(b / 4) * 0.5
        cap.observe(t, generated=gen, prefill=0, in_flight=b, busy=True, bound=True, engines=4)
        limits.append(cap.limit)
    assert statistics.mode(limits[-20:]) == 64
    assert 92 in limits  # 23 per engine, tried and left
    assert cap.throughput(64) == pytest.approx(4 * four(16), rel=1e-6)
    assert cap.throughput(2) is None  # under one request per engine
    for _ in range(2):  # the cap's level measured since its last move (a probe's return)
        t += 0.5
        gen += 4 * four(16) * 0.5
        cap.observe(t, generated=gen, prefill=0, in_flight=64, busy=True, bound=True, engines=4)
    assert cap.limit == 64
    assert cap.wave(100) == 100  # under two caps: at once
    # A replica drops out of the counters: a new baseline, no bogus interval.
    moves = cap.moves
    cap.observe(
        t + 0.5, generated=gen / 2, prefill=0, in_flight=64, busy=True, bound=True, engines=2
    )
    cap.observe(
        t + 1.0, generated=gen / 2 + 900, prefill=0, in_flight=30, busy=True, bound=True, engines=2
    )
    assert cap.limit == 32  # 16 per engine on 2
    assert cap.moves == moves


def test_wave_rounds_what_is_left_into_equal_waves() -> None:
    cap = DecodeCap(ceiling=256, start=16)
    assert cap.wave(None) == 16
    assert cap.wave(10) == 16
    assert cap.wave(20) == 20  # under two caps: all at once
    assert cap.wave(31) == 31
    assert cap.wave(32) == 16
    assert cap.wave(100) == 17  # six waves, none small
    assert DecodeCap(ceiling=24, start=16).wave(31) == 24


def test_wave_stays_at_a_cap_not_measured_since_it_moved() -> None:
    # W9's fault: slow start stepped to 23; with all 64 of every tick's run left,
    # rounding up ran two waves of 32, level 23 was never measured and the cap
    # never judged again. Until its level is measured, the rounding stays there.
    cap = DecodeCap(ceiling=256, start=16)
    engine = Engine(cap, linear_until(23), demand=64)
    engine.run(2)  # 16 measured and paid: slow start steps to 23
    assert cap.limit == 23
    assert cap.wave(64) == 22  # three waves at 23's level, not two of 32
    assert cap.wave(40) == 20  # two waves of 20: still 23's level
    assert cap.wave(36) == 23  # two of 18 would be below its level: the cap itself
    engine.run(2)  # 23 measured and paid: on to 32
    assert cap.limit == 32
    engine.run(2)  # 32 no better: back to 23, which is not measured since
    assert cap.limit == 23
    assert not cap.in_slow_start
    assert cap.wave(40) == 20
    engine.run(2)
    assert cap.limit == 23
    assert cap.wave(40) == 40  # measured, and 32 decodes as fast: under two caps, at once
    assert cap.wave(64) == 32  # two equal waves, 32 measured no slower


def test_wave_rounds_down_where_bigger_batches_decode_slower() -> None:
    cap = DecodeCap(ceiling=256)
    Engine(cap, h100(3000)).run(20)  # measured 16 and 23; 23 is slower per token here? no:
    # at ~3k contexts 23 decodes about as fast as 16, so 20 left still go at once
    assert cap.wave(20) == 20
    assert not cap.slower_at(20)
    assert cap.slower_at(1000) is False  # unmeasured: not known to be slower
    slow = DecodeCap(ceiling=256, start=16)
    Engine(slow, lambda b: 2000.0 if b <= 16 else 1500.0).run(12)
    assert slow.limit == 16
    assert slow.slower_at(23)
    assert slow.wave(20) == 20  # 2 x 10 would decode below the knee: one wave
    assert slow.wave(44) == 15  # three of 15 rather than two slow ones of 22
    assert not slow.slower_at(30)  # unmeasured: not known
    assert slow.wave(30) == 30
    assert not slow.slower_at(0.5)


def test_throughput_of_unmeasured_or_meaningless_concurrency_is_none() -> None:
    cap = DecodeCap(ceiling=256)
    assert cap.throughput(0) is None
    assert cap.throughput(16) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ceiling": 0},
        {"ceiling": True},
        {"ceiling": 8, "start": 0},
        {"ceiling": 8, "floor": 9},
        {"ceiling": 8, "probe_every": 0},
        {"ceiling": 8, "memory": 1.5},
        {"ceiling": 8, "elasticity": 0.0},
        {"ceiling": 8, "elasticity": 1.0},
        {"ceiling": 8, "margin": -0.1},
        {"ceiling": 8, "margin": 1.0},
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(k for k in kwargs if k != "ceiling"), "ceil")):
        DecodeCap(**kwargs)  # type: ignore[arg-type]


def test_run_demand_counts_siblings_left_of_the_runs_in_progress() -> None:
    demand = RunDemand()
    assert demand.siblings_left() is None  # nothing in progress
    left = {"a": 40, "b": 3}
    demand.add("a", lambda: left["a"])
    demand.add("b", lambda: left["b"])
    assert demand.siblings_left() == 43
    left["a"] = 10
    assert demand.siblings_left() == 13  # read live, not when the request came
    for _ in range(5):
        demand.add("b", lambda: left["b"])
    assert demand.siblings_left() == 16  # run b: 6 requests, more than its 3 siblings
    demand.add(None, None)
    assert demand.siblings_left() is None  # a request of no known run: unknown
    demand.remove(None, None)
    demand.remove(None, None)  # never below zero
    for _ in range(6):
        demand.remove("b", lambda: left["b"])
    demand.remove("b", lambda: left["b"])  # gone already: no-op
    assert demand.siblings_left() == 10
    demand.remove("a", lambda: left["a"])
    assert demand.siblings_left() is None


def test_the_power_objective_prefers_latency_as_elasticity_rises() -> None:
    # Elasticity sets how much throughput a step up must buy: on a concave curve
    # a higher one settles lower.
    def concave(b: float) -> float:
        return 2000.0 * (1.0 - math.exp(-b / 24.0))

    caps = {}
    for e in (0.1, 0.25, 0.5):
        engine = Engine(DecodeCap(ceiling=512, elasticity=e), concave)
        engine.run(60)
        caps[e] = engine.settled()
    assert caps[0.1] > caps[0.25] > caps[0.5]


def test_a_long_horizon_run_is_never_rounded_into_waves() -> None:
    from langgraph_batch.scheduler._decode_gate import LONG_HORIZON_TURNS, RunDemand

    demand = RunDemand()
    demand.add("run", lambda: 30, turn=0)
    assert demand.siblings_left() == 30  # short agents: the last 30 go in one wave
    demand.add("run", lambda: 30, turn=LONG_HORIZON_TURNS)
    # Siblings that have made 4 calls or more finish one by one, turns apart: the
    # demand is unknown to the rounding, which then keeps the learned cap.
    assert demand.siblings_left() is None
    assert DecodeCap(ceiling=256, start=16).wave(demand.siblings_left()) == 16
