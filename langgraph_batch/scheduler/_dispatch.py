"""The `Scheduler`'s dispatch loop: it feeds the policy's plan and performs it.

One task per scheduler, created lazily in the running loop, that wakes only
when something may be dispatched (`_kick`): it asks `BatchPolicyCore.plan`
for a plan, resolves the winners' futures (their callers then make the
call), starts one task per batch (`complete_batch_settled`, which resolves
every member's future with its own response or error), arms a timer for open
batch windows, and polls the engine's metrics. It never polls in a loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from langgraph_batch.backends.base import Backend
from langgraph_batch.errors import BackendError, SchedulerError
from langgraph_batch.scheduler._item import RUNNING, Outcome, PolicyItem
from langgraph_batch.scheduler._policy import BatchPolicy, BatchPolicyCore
from langgraph_batch.scheduler._retry import outcome_of
from langgraph_batch.scheduler._state import SchedulerState
from langgraph_batch.scheduler._stats import StatsRecorder

__all__ = ("DispatchLoop",)

logger = logging.getLogger("langgraph_batch.scheduler._runner")


class DispatchLoop:
    """The `Scheduler`'s part that performs the policy's plans (a mixin)."""

    if TYPE_CHECKING:
        name: str
        _backend: Backend
        _policy: BatchPolicy
        _core: BatchPolicyCore
        _stats: StatsRecorder
        _state: SchedulerState
        _runner: asyncio.Task[None] | None
        _wake: asyncio.Future[None] | None
        _timer: asyncio.TimerHandle | None
        _timer_at: float | None
        _batch_tasks: set[asyncio.Task[None]]

        def _refusal(self) -> SchedulerError: ...
        def _fail_queued(self) -> None: ...
        def _release_loop(self) -> None: ...
        def _die(self, exc: BaseException) -> None: ...

    def _kick(self) -> None:
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
                        task.add_done_callback(self._batch_tasks.discard)
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
            if self._state is SchedulerState.OPENED:
                # Cancelled from outside (the loop is shutting down): behave as closed.
                self._state = SchedulerState.CLOSED
                self._fail_queued()
                for t in self._batch_tasks:
                    t.cancel()
                self._release_loop()
            raise
        except BaseException as exc:  # the runner must never die silently
            self._die(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            if poller is not None:
                poller.cancel()
            if self._state is not SchedulerState.OPENED:
                self._release_loop()

    def _timer_fired(self) -> None:
        self._timer = None
        self._timer_at = None
        self._kick()

    async def _run_batch(self, batch: list[PolicyItem]) -> None:
        requests = [item.payload for item in batch]
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
            # The scheduler is closing or dead: members get its refusal.
            for item in batch:
                self._release(item, Outcome.CANCELLED)
                if not item.future.done():
                    item.future.set_exception(self._refusal())
            raise
        except Exception as exc:
            outcome = outcome_of(exc)
            for item in batch:
                self._release(item, outcome)
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        for item, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                self._release(item, outcome_of(result))
                if not item.future.done():
                    item.future.set_exception(result)
            else:
                self._release(item, Outcome.OK)
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
                    self._die(exc)
                    if self._runner is not None:
                        self._runner.cancel()
                    return
                if core.ready and core.slots_free:
                    self._kick()
            await asyncio.sleep(interval)

    def _release(self, item: PolicyItem, outcome: Outcome) -> None:
        if self._state is SchedulerState.DEAD or item.state != RUNNING:
            return
        core = self._core
        core.on_complete(item, outcome, time.monotonic())
        if core.ready:
            self._kick()
