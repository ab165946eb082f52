"""Drive the engine against the wall clock, scaled by `time_scale`.

The step loop runs in its own thread, as vLLM's EngineCore runs apart from
its API server: schedule a step, sleep until the step's end (engine time
mapped to wall time), commit it. The event loop (HTTP parsing, templating,
tokenizing, SSE writing) only hands new requests and aborts over through a
queue, which the engine drains at step boundaries, and receives each step's
progress in one batch (`call_soon_threadsafe`). So a burst of arrivals
delays their own admission, as a busy API server would, instead of
stretching the steps of requests that already run.

Lag is how late a step STARTS relative to its scheduled wall time (the end
of the previous step, or the wake-up after idle, scaled by `time_scale`).
The engine never stretches its own clock: engine timings stay what the GPU
would take, and the driver reports the lag in `/metrics`
(`emulator:lag_seconds`, `emulator:max_lag_seconds`), `/emulator/stats` and
the log.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from langgraph_batch.emulator.engine import Engine, Request, RequestStatus

__all__ = ("Histogram", "RealTimeDriver")

logger = logging.getLogger(__name__)

_LAG_WARN_S = 0.1
_JITTER_S = 0.001
"""Lateness below this is timer and thread-switch jitter, reported as 0."""

_T = TypeVar("_T")


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
    """Runs an engine in (scaled) real time in a thread beside the event loop.

    Every engine mutation happens in that thread. The event loop calls
    `submit`, `abort` and `call` (which only queue work); listeners of
    requests run in the event loop.

    Args:
        engine: The engine to drive.
        time_scale: Engine seconds per wall second.
    """

    def __init__(self, engine: Engine, *, time_scale: float = 1.0) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.engine = engine
        self.time_scale = time_scale
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._stopping = False
        self._inbox: deque[tuple[str, Any]] = deque()
        self._outbox: list[Request] = []
        engine.notify = self._outbox.append
        self._anchor_wall = time.monotonic()
        self._vnow = 0.0
        self._next_free = 0.0
        self.lag_s = 0.0
        """How late the last step started, wall seconds (0 when on time)."""
        self.max_lag_s = 0.0
        self.late_steps = 0
        self.max_wake_late_s = 0.0
        """Largest delay between a step's end and the engine thread running
        again (the OS and the GIL; counts into lag)."""
        self.max_work_s = 0.0
        """Largest engine-thread time from a step's end to the next step's
        start (commit, notifications, admission, scheduling)."""
        self._last_warn = 0.0
        self.dead: BaseException | None = None
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue = Histogram(TTFT_BUCKETS)
        self.prefill = Histogram(TTFT_BUCKETS)
        self.decode = Histogram(E2E_BUCKETS)
        self.inference = Histogram(E2E_BUCKETS)
        self.finished_by_reason: dict[str, int] = {}
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
        self.max_wake_late_s = 0.0
        self.max_work_s = 0.0

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        """Start the engine thread; call from the event loop (idempotent)."""
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._anchor_wall = time.monotonic()
            self._stopping = False
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="emulator-engine", daemon=True)
            self._thread.start()

    async def aclose(self) -> None:
        """Stop the engine thread (it finishes the step in flight)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stopping = True
            self._stop.set()
            self._wake.set()
            await asyncio.to_thread(thread.join)

    @property
    def alive(self) -> bool:
        """False once the step loop died with an error."""
        return self.dead is None

    # -- requests (event loop side) -------------------------------------------

    def submit(self, req: Request) -> None:
        """Queue a request arriving now; the engine admits it at its next step."""
        if self.dead is not None:
            raise RuntimeError("the emulator engine died") from self.dead
        req.arrival = self.now()
        self._post("add", req)

    def abort(self, req: Request) -> None:
        """Withdraw a request (applied at the next step boundary)."""
        self._post("abort", req)

    async def call(self, fn: Callable[[], _T]) -> _T:
        """Run `fn()` in the engine thread between two steps and return its result."""
        if self._thread is None:
            return fn()
        fut: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
        self._post("call", (fn, fut))
        return await fut

    def _post(self, kind: str, item: Any) -> None:
        self._inbox.append((kind, item))
        if self._thread is None:
            self._drain()  # not started (no lifespan): apply at once
            self._flush()
        else:
            self._wake.set()

    # -- engine thread -----------------------------------------------------------

    def _run(self) -> None:
        try:
            self._steps()
        except BaseException as exc:  # the server reports 503 from /health
            self.dead = exc
            logger.exception("emulator engine loop died")

    def _drain(self) -> None:
        inbox = self._inbox
        engine = self.engine
        while inbox:
            kind, item = inbox.popleft()
            if kind == "add":
                if not engine.has_work():
                    self._vnow = max(self._vnow, self._mapped())
                item.arrival = min(item.arrival, self._vnow)
                engine.add_request(item)
            elif kind == "abort":
                engine.abort(item)
            else:
                fn, fut = item
                try:
                    result = fn()
                except Exception as exc:  # handed to the caller
                    self._deliver_soon(_settle, fut, None, exc)
                else:
                    self._deliver_soon(_settle, fut, result, None)

    def _deliver_soon(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None:
            fn(*args)
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed under us: nobody is listening
            self._stopping = True

    def _flush(self, tokens: list[tuple[Request, bool]] | None = None, end: float = 0.0) -> None:
        if self._outbox or tokens:
            batch = self._outbox[:]
            self._outbox.clear()
            self._deliver_soon(self._apply, batch, tokens, end)

    def _apply(
        self, batch: list[Request], tokens: list[tuple[Request, bool]] | None, end: float
    ) -> None:
        # Event loop side, as vLLM's output processor runs in its API server:
        # latency histograms first, then the listeners.
        if tokens:
            self._record(tokens, end)
        last = self._last_token
        for req in batch:
            if req.status is RequestStatus.ABORTED:
                last.pop(id(req), None)
            listener = req.listener
            if listener is not None:
                listener(req)

    def _idle(self) -> None:
        self._flush()
        self._wake.wait()
        self._wake.clear()
        # Idle time passes in engine time too: catch the clock up.
        self._vnow = max(self._vnow, self._mapped())

    def _steps(self) -> None:
        engine = self.engine
        scale = self.time_scale
        woke: float | None = None
        while not self._stopping:
            self._drain()
            if not engine.has_work():
                self.lag_s = 0.0
                self._idle()
                woke = None
                continue
            started = time.monotonic()
            step = engine.schedule(self._vnow)
            if step is None:
                # Work that cannot be scheduled now (waiting for memory that
                # only an abort can free): wait for news.
                self._idle()
                woke = None
                continue
            if woke is not None:
                work = time.monotonic() - woke
                if work > self.max_work_s:
                    self.max_work_s = work
            self._track_lag(started - (self._anchor_wall + self._vnow / scale))
            end = self._vnow + step.duration
            self._next_free = end
            deadline = self._anchor_wall + end / scale
            delay = deadline - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return  # closing: drop the step in flight
            woke = time.monotonic()
            overshoot = woke - deadline
            if overshoot > self.max_wake_late_s:
                self.max_wake_late_s = overshoot
            self._vnow = end
            touched = engine.commit(step, end)
            self._flush([(r, r.finished) for r in touched], end)

    def _track_lag(self, late: float) -> None:
        self.lag_s = late if late > _JITTER_S else 0.0
        if self.lag_s > self.max_lag_s:
            self.max_lag_s = self.lag_s
        if self.lag_s > 0.0:
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

    def _record(self, tokens: list[tuple[Request, bool]], end: float) -> None:
        """Histograms for the requests that got a token at `end` (finished then or not)."""
        last = self._last_token
        for req, finished in tokens:
            key = id(req)
            prev = last.get(key)
            if prev is None:
                if req.first_token_time == end:
                    self.ttft.observe(end - req.arrival)
                    if req.first_scheduled is not None:
                        self.queue.observe(req.first_scheduled - req.arrival)
                        self.prefill.observe(end - req.first_scheduled)
            else:
                self.itl.observe(end - prev)
            if finished:
                last.pop(key, None)
                self.e2e.observe(end - req.arrival)
                if req.first_token_time is not None:
                    self.decode.observe(end - req.first_token_time)
                if req.first_scheduled is not None:
                    self.inference.observe(end - req.first_scheduled)
                reason = req.finish_reason
                self.finished_by_reason[reason] = self.finished_by_reason.get(reason, 0) + 1
            else:
                last[key] = end


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)
