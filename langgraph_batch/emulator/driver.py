"""Drive the engine against the wall clock, scaled by `time_scale`.

One asyncio task runs the step loop: schedule a step, sleep until the step's
end (engine time mapped to wall time), commit it. When the host cannot keep
up, the engine does not stretch its own clock: engine timings stay what the
GPU would take, and the driver measures how far behind schedule it runs
(`lag_s`) and says so in `/metrics`, `/emulator/stats` and the log.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import Sequence

from langgraph_batch.emulator.engine import Engine, Request

__all__ = ("Histogram", "RealTimeDriver")

logger = logging.getLogger(__name__)

_LAG_WARN_S = 0.1


class Histogram:
    """A Prometheus-style cumulative histogram."""

    __slots__ = ("buckets", "count", "counts", "total")

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Record one value."""
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs, ending with +Inf."""
        out: list[tuple[str, int]] = []
        acc = 0
        for b, c in zip(self.buckets, self.counts, strict=False):
            acc += c
            out.append((repr(float(b)), acc))
        out.append(("+Inf", self.count))
        return out


TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
               50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class RealTimeDriver:
    """Runs an engine in (scaled) real time inside the running event loop.

    Args:
        engine: The engine to drive.
        time_scale: Engine seconds per wall second.
    """

    def __init__(self, engine: Engine, *, time_scale: float = 1.0) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.engine = engine
        self.time_scale = time_scale
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._anchor_wall = time.monotonic()
        self._vnow = 0.0
        self._next_free = 0.0
        self.lag_s = 0.0
        """How late the last step ended, wall seconds (0 when on time)."""
        self.max_lag_s = 0.0
        self.late_steps = 0
        self._last_warn = 0.0
        self.dead: BaseException | None = None
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue = Histogram(TTFT_BUCKETS)
        self._last_token: dict[int, float] = {}

    # -- clock ---------------------------------------------------------------

    def _mapped(self) -> float:
        return (time.monotonic() - self._anchor_wall) * self.time_scale

    def now(self) -> float:
        """Engine time now (never later than the next step start)."""
        return min(self._mapped(), self._next_free) if self.engine.in_flight else self._mapped()

    def reset_lag(self) -> None:
        """Forget the lag high-water mark."""
        self.lag_s = 0.0
        self.max_lag_s = 0.0
        self.late_steps = 0

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        """Start the step loop in the running event loop (idempotent)."""
        if self._task is None:
            self._anchor_wall = time.monotonic()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="emulator-engine")

    async def aclose(self) -> None:
        """Stop the step loop."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def alive(self) -> bool:
        """False once the step loop died with an error."""
        return self.dead is None

    # -- requests ------------------------------------------------------------

    def submit(self, req: Request) -> None:
        """Queue a request arriving now."""
        if self.dead is not None:
            raise RuntimeError("the emulator engine died") from self.dead
        req.arrival = self.now()
        self.engine.add_request(req)
        self._wake.set()

    def abort(self, req: Request) -> None:
        """Withdraw a request."""
        self.engine.abort(req)
        self._last_token.pop(id(req), None)
        self._wake.set()

    # -- loop ----------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the server reports 503 from /health
            self.dead = exc
            logger.exception("emulator engine loop died")
            raise

    async def _loop(self) -> None:
        engine = self.engine
        scale = self.time_scale
        while True:
            if not engine.has_work():
                self._wake.clear()
                await self._wake.wait()
                # Idle time passes in engine time too: catch the clock up.
                self._vnow = max(self._vnow, self._mapped())
                self.lag_s = 0.0
                continue
            step = engine.schedule(self._vnow)
            if step is None:
                # Work that cannot be scheduled now (waiting for memory that
                # only an abort can free): wait for news.
                self._wake.clear()
                await self._wake.wait()
                self._vnow = max(self._vnow, self._mapped())
                continue
            end = self._vnow + step.duration
            self._next_free = end
            deadline = self._anchor_wall + end / scale
            delay = deadline - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)
            late = time.monotonic() - deadline
            self._vnow = end
            touched = engine.commit(step, end)
            self._record(touched, end)
            self._track_lag(late)

    def _track_lag(self, late: float) -> None:
        # Sleep overshoot of a millisecond or two is timer jitter, not lag.
        self.lag_s = late if late > 0.002 else 0.0
        if self.lag_s > self.max_lag_s:
            self.max_lag_s = self.lag_s
        if self.lag_s > 0.002:
            self.late_steps += 1
        if self.lag_s > _LAG_WARN_S:
            now = time.monotonic()
            if now - self._last_warn > 5.0:
                self._last_warn = now
                logger.warning(
                    "emulator runs %.3f s behind schedule at time_scale %s: the host cannot "
                    "keep up; engine timings stay exact but clients see them stretched "
                    "(lower --time-scale)",
                    self.lag_s,
                    self.time_scale,
                    extra={"lag_s": self.lag_s, "time_scale": self.time_scale},
                )

    def _record(self, touched: list[Request], end: float) -> None:
        last = self._last_token
        for req in touched:
            key = id(req)
            prev = last.get(key)
            if prev is None:
                if req.first_token_time == end:
                    self.ttft.observe(end - req.arrival)
                    if req.first_scheduled is not None:
                        self.queue.observe(req.first_scheduled - req.arrival)
            else:
                self.itl.observe(end - prev)
            if req.finished:
                last.pop(key, None)
                self.e2e.observe(end - req.arrival)
            else:
                last[key] = end
