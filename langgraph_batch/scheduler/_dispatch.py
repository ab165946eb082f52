"""The `Scheduler`'s dispatch loop: it feeds the policy's plan and performs it.

One task per scheduler, created lazily in the running loop, that wakes only
when something may be dispatched (`kick`): it asks `Planner.plan`
for a plan, resolves the winners' futures (their callers then make the
call), starts one task per batch (`complete_batch_settled`, which resolves
every member's future with its own response or error), arms a timer for open
batch windows, and polls the engine's metrics. It never polls in a loop.

A batched call is one HTTP request, which the engine aborts only as a whole
(vLLM aborts a request whose client disconnects). When the callers of every
member of a batch have been cancelled (`abandon`), the batch task is
cancelled, which closes its connection: the engine stops generating for
nobody. While at least one member still waits, the call runs on.

`DispatchLoop` is a collaborator of the `Scheduler`: it is given the backend,
the policy, the policy core, the stats and the scheduler's `Lifecycle`, and
owns what it alone touches (the event loop, the runner task, its wake-up
future and timer, the batch tasks).
"""

from __future__ import annotations

import asyncio
import logging
import time

from langgraph_batch.backends.base import Backend
from langgraph_batch.errors import BackendError
from langgraph_batch.scheduler._item import RUNNING, Outcome, PolicyItem
from langgraph_batch.scheduler._policy import BatchPolicy, Planner
from langgraph_batch.scheduler._retry import outcome_of
from langgraph_batch.scheduler._state import Lifecycle, SchedulerState
from langgraph_batch.scheduler._stats import StatsRecorder

__all__ = ("DispatchLoop",)

logger = logging.getLogger("langgraph_batch.scheduler._runner")


class DispatchLoop:
    """The `Scheduler`'s part that performs the policy's plans.

    Args:
        backend: where batches go (`complete_batch_settled`) and metrics come from.
        policy: the scheduler's policy (the metrics interval).
        core: the policy core that plans.
        stats: the scheduler's counters.
        life: the scheduler's lifecycle.
    """

    def __init__(
        self,
        *,
        backend: Backend,
        policy: BatchPolicy,
        core: Planner,
        stats: StatsRecorder,
        life: Lifecycle,
    ) -> None:
        self._backend = backend
        self._policy = policy
        self._core = core
        self._stats = stats
        self._life = life
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop it runs in (None before it starts or after it ends)."""
        self.runner: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._batch_tasks: set[asyncio.Task[None]] = set()
        self._batch_of: dict[PolicyItem, asyncio.Task[None]] = {}
        self._members: dict[asyncio.Task[None], list[PolicyItem]] = {}

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Open the scheduler in `loop` and start the runner task there."""
        self.loop = loop
        self._life.state = SchedulerState.OPENED
        self.runner = loop.create_task(self._run(), name=f"langgraph-batch scheduler {self.name}")

    @property
    def name(self) -> str:
        return self._life.name

    def tasks(self) -> list[asyncio.Task[None]]:
        """The runner and the batch tasks still running (what closing cancels)."""
        return [t for t in (self.runner, *self._batch_tasks) if t is not None and not t.done()]

    def fail_queued(self) -> None:
        """Fail every queued request with the scheduler's refusal."""
        for item in self._core.drain():
            fut = item.future
            if fut is not None and not fut.done():
                fut.set_exception(self._life.refusal())

    def release_loop(self) -> None:
        """Drop every reference to the loop so that the registry's weak keys can go."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake = None
        self.runner = None
        self.loop = None

    def die(self, exc: BaseException) -> None:
        """The runner failed: the scheduler is dead, its queued requests fail with the cause."""
        life = self._life
        if life.state is not SchedulerState.OPENED:
            return
        life.state = SchedulerState.DEAD
        life.dead_cause = exc
        logger.error("scheduler %r runner died", self.name, exc_info=exc)
        try:
            self.fail_queued()
        finally:
            for t in self._batch_tasks:
                t.cancel()

    def kick(self) -> None:
        """Wake the runner: something may be dispatched."""
        f = self._wake
        if f is not None:
            self._wake = None
            if not f.done():
                f.set_result(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        core = self._core
        clock = time.monotonic
        poller = None
        if self._backend.capabilities.metrics:
            poller = loop.create_task(
                self._poll_metrics(), name=f"langgraph-batch metrics {self.name}"
            )
        try:
            while True:
                now = clock()
                plan = core.plan(now)
                again = False
                for item in plan.dispatch:
                    fut = item.future
                    if fut.done():
                        # Its caller was cancelled after the plan was made.
                        core.on_complete(item, Outcome.CANCELLED, now)
                        again = True
                    else:
                        fut.set_result(None)
                for batch in plan.batches:
                    live = []
                    for item in batch:
                        if item.future.done():
                            core.on_complete(item, Outcome.CANCELLED, now)
                            again = True
                        else:
                            live.append(item)
                    if live:
                        self._stats.record_batch(len(live))
                        task = loop.create_task(self._run_batch(live))
                        self._batch_tasks.add(task)
                        task.add_done_callback(self._batch_done)
                        self._members[task] = live
                        for item in live:
                            self._batch_of[item] = task
                if plan.wake_at != self._timer_at:
                    if self._timer is not None:
                        self._timer.cancel()
                        self._timer = None
                    self._timer_at = plan.wake_at
                    if plan.wake_at is not None:
                        self._timer = loop.call_later(
                            max(0.0, plan.wake_at - now), self._timer_fired
                        )
                if again:
                    continue
                wake = self._wake = loop.create_future()
                await wake
        except asyncio.CancelledError:
            if self._life.opened:
                # Cancelled from outside (the loop is shutting down): behave as closed.
                self._life.state = SchedulerState.CLOSED
                self.fail_queued()
                for t in self._batch_tasks:
                    t.cancel()
                self.release_loop()
            raise
        except BaseException as exc:  # the runner must never die silently
            self.die(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            if poller is not None:
                poller.cancel()
            if not self._life.opened:
                self.release_loop()

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._batch_tasks.discard(task)
        for item in self._members.pop(task, ()):
            self._batch_of.pop(item, None)

    def abandon(self, item: PolicyItem) -> None:
        """A batched item's caller was cancelled: abort the call once no member waits for it."""
        task = self._batch_of.get(item)
        if task is None or task.done():
            return
        if all(m.future is None or m.future.done() for m in self._members.get(task, ())):
            task.cancel()

    def _timer_fired(self) -> None:
        self._timer = None
        self._timer_at = None
        self.kick()

    async def _run_batch(self, batch: list[PolicyItem]) -> None:
        requests = [item.payload.request for item in batch]
        for _ in batch:
            self._stats.record_dispatch()
        try:
            # One outcome per member: a bad member fails only its own caller.
            results = await self._backend.complete_batch_settled(requests)
            if len(results) != len(batch):
                raise BackendError(
                    f"complete_batch_settled returned {len(results)} outcomes for {len(batch)} "
                    f"requests ({type(self._backend).__name__} breaks the Backend contract)"
                )
        except asyncio.CancelledError:
            # The scheduler is closing or dead (members get its refusal), or every
            # member's caller was cancelled (`abandon`: no future is left to resolve).
            for item in batch:
                self.release(item, Outcome.CANCELLED)
                if not item.future.done():
                    item.future.set_exception(self._life.refusal())
            raise
        except Exception as exc:
            outcome = outcome_of(exc)
            for item in batch:
                self.release(item, outcome)
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        for item, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                self.release(item, outcome_of(result))
                if not item.future.done():
                    item.future.set_exception(result)
            else:
                self.release(item, Outcome.OK)
                if not item.future.done():
                    item.future.set_result(result)

    async def _poll_metrics(self) -> None:
        interval = self._policy.metrics_interval_s
        backend = self._backend
        core = self._core
        while True:
            try:
                metrics = await backend.metrics()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.debug("scheduler %r: metrics poll failed: %r", self.name, exc)
                metrics = None
            if metrics is not None:
                try:
                    core.on_metrics(metrics, time.monotonic())
                except Exception as exc:
                    self.die(exc)
                    if self.runner is not None:
                        self.runner.cancel()
                    return
                if core.ready and core.slots_free:
                    self.kick()
            await asyncio.sleep(interval)

    def release(self, item: PolicyItem, outcome: Outcome) -> None:
        """Give a running item's slot back, with how its attempt ended."""
        if self._life.state is SchedulerState.DEAD or item.state != RUNNING:
            return
        core = self._core
        core.on_complete(item, outcome, time.monotonic())
        if core.ready:
            self.kick()
