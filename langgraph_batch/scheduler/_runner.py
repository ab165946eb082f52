"""`Scheduler`: the async driver around the pure `Planner`.

This module holds the public face and the lifecycle; its collaborators,
each given what it needs: `_attempt.RequestAttempts` runs one request in its
caller's task, `_dispatch.DispatchLoop` is the loop that performs the policy's
plans, `_state.Lifecycle` is the state they share, `_capacity` keeps the
server's KV capacity and ledger.

Division of work (cheapest design that keeps cancellation exact):

- The CALLER's task does the inference call itself. `submit` asks the
  policy for a slot (at once when nothing is queued, else it parks on one
  future that the runner resolves), then awaits `backend.chat` inside
  try/except that always gives the slot back. Cancelling the caller
  therefore cancels the HTTP request directly (the server aborts it), and
  a queued caller that is cancelled withdraws its request.
- The RUNNER task (one per scheduler, created lazily in the running loop)
  only wakes when something may be dispatched: it asks the policy for a
  plan, resolves the winners' futures, starts one task per batch
  (`complete_batch_settled`, which resolves every member's future with its own
  response or error), arms a timer
  for open batch windows and polls engine metrics. It never polls in a loop.
- Retries back off WITHOUT a slot; a streamed request that already
  delivered content or tool-call chunks is never retried (one that failed
  before its first content chunk is retried like any call).
- If the runner dies, every waiter and every later `submit` gets
  `SchedulerDeadError` carrying the cause.
- Prefix warming (`BatchPolicy.prefix_warming`, on by default for SGLang
  only): `submit` computes the request's prefix key (`_prefix.prefix_key`)
  in the caller's task; the policy holds same-prefix requests behind a
  leader. The leader's call reports its FIRST chunk to the policy, which
  releases the held requests. A non-streaming leader is run as a stream
  internally (`stream=True` on a copy of the request; the backend returns
  the aggregated response, so its caller sees no difference), so that its
  followers go at the leader's first token instead of its completion.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from types import TracebackType
from typing import Any, Self

from langgraph_batch._context import SiblingInfo
from langgraph_batch._observe import tracing
from langgraph_batch._rate_budget import pacer_for
from langgraph_batch.backends.base import (
    Backend,
    ChatChunk,
    ChatRequest,
    ChatResponse,
    EngineMetrics,
    conversation_key,
    sibling_route_key,
)
from langgraph_batch.errors import SchedulerError
from langgraph_batch.scheduler._attempt import RequestAttempts
from langgraph_batch.scheduler._capacity import (
    KVLedger,
    make_ledger,
    read_kv_capacity,
    read_kv_tiers,
)
from langgraph_batch.scheduler._dispatch import DispatchLoop
from langgraph_batch.scheduler._item import PolicyItem, Submission
from langgraph_batch.scheduler._pacing import RateGate
from langgraph_batch.scheduler._policy import BatchPolicy, Planner
from langgraph_batch.scheduler._prefix import prefix_key
from langgraph_batch.scheduler._state import Lifecycle, SchedulerState
from langgraph_batch.scheduler._stats import SchedulerStats, StatsRecorder

__all__ = ("Scheduler", "SchedulerState", "live_schedulers")

logger = logging.getLogger(__name__)

_CLEANUP_TIMEOUT_S = 5.0
_names = itertools.count(1)
_LIVE: weakref.WeakSet[Scheduler] = weakref.WeakSet()


def live_schedulers() -> list[Scheduler]:
    """Every Scheduler of the process not yet garbage-collected, in any loop or thread."""
    return list(_LIVE)


class Scheduler:
    """Queues LLM requests of many callers and sends them to one backend.

    At most `policy.inflight_limit` requests (adaptive) are on the wire; the
    rest wait in priority order (depth-first by default: callers further
    along go first, FIFO among equals). Batchable requests may go out
    together through `backend.complete_batch`. Retryable failures are
    retried with jittered exponential backoff, without holding a slot.

    A scheduler is bound to the event loop it first runs in. Several chat
    models usually share one through `scheduler_for(...)` in
    `langgraph_batch.scheduler.registry`.

    Args:
        backend: where requests go.
        policy: queueing, batching and retry configuration.
        name: a name for logs and the registry (default: `scheduler-<n>`).
        owns_backend: close the backend in `aclose()`.

    Example:
        ```python
        from langgraph_batch.scheduler import BatchPolicy, Scheduler

        async with Scheduler(backend, policy=BatchPolicy(inflight_limit=64)) as s:
            resp = await s.submit(request, turn=2, sibling=current_sibling())
            print(resp.content, s.stats().in_flight)
        ```
    """

    def __init__(
        self,
        backend: Backend,
        *,
        policy: BatchPolicy | None = None,
        name: str | None = None,
        owns_backend: bool = False,
    ) -> None:
        self._backend = backend
        self._policy = policy if policy is not None else BatchPolicy()
        self.name = name if name is not None else f"scheduler-{next(_names)}"
        self._owns_backend = owns_backend
        caps = backend.capabilities
        self._warming = self._policy.warms_prefixes(
            caps.flavor, hosted_prompt_cache=caps.hosted_prompt_cache
        )
        self._core = Planner(
            self._policy,
            batching=caps.batch_completions,
            has_metrics=caps.metrics,
            warming=self._warming,
        )
        self._stats = StatsRecorder(window=self._policy.stats_window, name=self.name)
        self._provider = tracing.provider_of(backend)
        _LIVE.add(self)
        self._life = Lifecycle(self.name)
        # Its parts, each given what it needs (nothing is shared by inheritance).
        self._dispatch = DispatchLoop(
            backend=backend,
            policy=self._policy,
            core=self._core,
            stats=self._stats,
            life=self._life,
        )
        # One rate budget per endpoint and credentials, shared by every scheduler on them.
        pacer = pacer_for(backend.key)
        pacer.configure(self._policy.rate_limit, time.monotonic())
        self._gate = RateGate(pacer)
        self._attempts = RequestAttempts(
            backend=backend,
            policy=self._policy,
            core=self._core,
            stats=self._stats,
            life=self._life,
            dispatch=self._dispatch,
            gate=self._gate,
        )
        self._priority_to_engine = caps.priority
        self._orders_by_recency = self._core.priority.recency is not None
        self._ledger: KVLedger | None = None

    # ------------------------------------------------------------ properties

    @property
    def backend(self) -> Backend:
        """The backend requests go to."""
        return self._backend

    @property
    def policy(self) -> BatchPolicy:
        """The scheduling policy."""
        return self._policy

    @property
    def state(self) -> SchedulerState:
        """The lifecycle state."""
        return self._life.state

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the scheduler runs in (None before it starts or after it ends)."""
        return self._dispatch.loop

    @property
    def _runner(self) -> asyncio.Task[None] | None:
        return self._dispatch.runner

    @property
    def prefix_warming(self) -> bool:
        """Whether this scheduler warms shared prefixes (the policy resolved for the backend)."""
        return self._warming

    @property
    def latest_metrics(self) -> EngineMetrics | None:
        """The last `EngineMetrics` polled from the backend (None: none yet)."""
        return self._core.latest_metrics

    async def kv_capacity(self) -> int | None:
        """The server's KV-cache capacity in tokens (None: the server does not say).

        From the last metrics sample, else one metrics call (`_capacity`).
        """
        return await read_kv_capacity(self._core.latest_metrics, self._backend)

    async def kv_ledger(self) -> KVLedger | None:
        """The server's resident-KV ledger that every fan_out run on this scheduler books.

        Made once, from `kv_capacity()`, with the server's second KV tier
        (`EngineMetrics.kv_offload_tokens`, else `BatchPolicy.kv_offload_tokens`);
        None while the server does not say its capacity (asked again next
        time). Concurrent fan_out runs share it, so together they keep within
        one server's cache.

        Example:
            ```python
            ledger = await scheduler.kv_ledger()
            print(ledger.capacity if ledger else "unknown", ledger.resident_tokens())
            ```
        """
        if self._ledger is None:
            capacity, offload = await read_kv_tiers(self._core.latest_metrics, self._backend)
            if capacity is not None and self._ledger is None:
                # The server's word on its second tier, else the user's.
                if offload is None:
                    offload = self._policy.kv_offload_tokens
                self._ledger = make_ledger(capacity, offload_capacity=offload)
        return self._ledger

    def inflight_by_sibling(self) -> dict[str, int]:
        """Requests on the wire now, per sibling id (siblings with none are absent).

        Example:
            ```python
            assert scheduler.inflight_by_sibling().get(info.sibling_id, 0) == 0
            ```
        """
        return {str(k): v for k, v in self._core.inflight_by_sibling().items()}

    def load(self) -> tuple[int, int, int, int | None]:
        """`(queued, in_flight, limit, decode_cap)` now; cheap, from any thread (scrapes)."""
        core = self._core
        return core.queued, core.in_flight, core.limit, core.decode_limit

    def stats(self) -> SchedulerStats:
        """A snapshot of load and history.

        Example:
            ```python
            s = scheduler.stats()
            print(s.queued, s.in_flight, s.inflight_limit, s.latency_p95)
            ```
        """
        core = self._core
        snap = core.stats()
        rec = self._stats
        qw = rec.percentiles(rec.queue_wait)
        lat = rec.percentiles(rec.latency)
        return SchedulerStats(
            queued=snap.queued,
            in_flight=snap.in_flight,
            inflight_limit=snap.limit,
            completed=rec.completed,
            failed=rec.failed,
            retries=rec.retries,
            cancelled=rec.cancelled,
            timed_out=rec.timed_out,
            slot_utilisation=core.utilisation(time.monotonic()),
            batches=rec.batches,
            batch_size_mean=rec.batch_items / rec.batches if rec.batches else 0.0,
            batch_size_max=rec.batch_max,
            prompt_tokens=rec.prompt_tokens,
            completion_tokens=rec.completion_tokens,
            cached_tokens=rec.cached_tokens,
            queue_wait_p50=qw[0],
            queue_wait_p95=qw[1],
            queue_wait_p99=qw[2],
            latency_p50=lat[0],
            latency_p95=lat[1],
            latency_p99=lat[2],
            warmups=snap.warmups,
            warm_held=snap.held_total,
            warm_held_s=snap.held_s,
            malformed_tool_calls=rec.malformed_tool_calls,
            decode_cap=snap.decode_limit,
            rate_waits=self._gate.waits,
            rate_wait_s=self._gate.wait_s,
        )

    def __repr__(self) -> str:
        return f"<Scheduler {self.name!r} {self.state.name} backend={self._backend.key!r}>"

    # ------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        if self.state is SchedulerState.UNOPENED:
            self._start(asyncio.get_running_loop())
        elif not self._life.opened:
            raise self._life.refusal()
        else:
            self._check_loop(asyncio.get_running_loop())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close: queued requests fail with `SchedulerClosedError`, the runner stops.

        Requests already on the wire run to completion (their callers own
        them); their retries are refused. Idempotent. A closed scheduler
        cannot be reopened.

        Example:
            ```python
            await scheduler.aclose()
            assert scheduler.state is SchedulerState.CLOSED
            ```
        """
        life = self._life
        if life.state is SchedulerState.CLOSED:
            return
        was_dead = life.state is SchedulerState.DEAD
        life.state = SchedulerState.CLOSED
        if not was_dead:
            self._dispatch.fail_queued()
        tasks = self._dispatch.tasks()
        for t in tasks:
            t.cancel()
        if tasks:
            await self._bounded(asyncio.gather(*tasks, return_exceptions=True), "stop tasks")
        self._dispatch.release_loop()
        if self._owns_backend:
            await self._bounded(self._backend.aclose(), "close backend")
        logger.info("scheduler %r closed", self.name)

    async def _bounded(self, aw: Any, what: str) -> None:
        # Cleanup awaits are shielded (a cancelled closer still finishes them)
        # and time-limited (a hung backend cannot hang the closer forever).
        try:
            async with asyncio.timeout(_CLEANUP_TIMEOUT_S):
                await asyncio.shield(aw)
        except TimeoutError:
            logger.warning("scheduler %r: %s took over %s s", self.name, what, _CLEANUP_TIMEOUT_S)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._dispatch.start(loop)
        logger.info("scheduler %r started (backend %s)", self.name, self._backend.key)

    def _check_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._dispatch.loop:
            raise SchedulerError(
                f"scheduler {self.name!r} runs in another event loop; a scheduler is bound "
                "to the loop it first ran in. Use scheduler_for(...) from "
                "langgraph_batch.scheduler.registry to get one per loop."
            )

    # ------------------------------------------------------------ submitting

    async def submit(
        self,
        request: ChatRequest,
        *,
        turn: int | None = None,
        sibling: SiblingInfo | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - part of the contract; covers retries too
        on_chunk: Callable[[ChatChunk], None] | None = None,
        check: Callable[[ChatResponse], None] | None = None,
    ) -> ChatResponse:
        """Queue a request, wait for a slot, run it (retrying), return the response.

        Args:
            request: the chat completion to run.
            turn: LLM calls the caller has completed (default: `request.turn`, else
                `sibling.turn`, else 0).
            sibling: the calling sibling (`current_sibling()`), for priority, stats and logs.
            max_retries: retries of this call's retryable errors. The one
                precedence rule: this when given (`BatchedChatModel` passes its
                `max_retries` when set), else `policy.retry.max_attempts - 1`;
                which errors and how long between come from `policy.retry`.
            timeout: seconds for queue wait + call + retries (default: the policy's).
            on_chunk: called with every streamed delta (needs `request.stream`).
            check: called with each response; a retryable error it raises (e.g.
                `MalformedToolCallError`) is retried like a failed call, within
                `max_retries`, unless content already streamed to the caller.

        Returns:
            The backend's response.

        Raises:
            BatchTimeoutError: `timeout` expired (says how long it was queued).
            SchedulerClosedError: the scheduler is closed.
            SchedulerDeadError: the scheduler's runner died.
            BackendError: the call failed (non-retryable, out of retries, or
                failed after content streamed to the caller).
            asyncio.CancelledError: the caller was cancelled (request withdrawn
                or aborted), re-raised.

        Example:
            ```python
            resp = await scheduler.submit(
                ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}]),
                turn=0,
            )
            ```
        """
        loop = asyncio.get_running_loop()
        state = self._life.state
        if state is not SchedulerState.OPENED:
            if state is SchedulerState.UNOPENED:
                self._start(loop)
            else:
                raise self._life.refusal()
        elif loop is not self._dispatch.loop:
            self._check_loop(loop)
        if timeout is None:
            timeout = self._policy.timeout
        elif not timeout > 0:
            raise ValueError(f"timeout={timeout!r} must be > 0 seconds (or None)")
        if max_retries is None:  # the one precedence rule: the call's budget, else the policy's
            max_retries = self._policy.retry.max_retries
        prefix = prefix_key(request) if self._warming else None
        if sibling is not None and request.route_key is None:
            request = replace(request, route_key=sibling_route_key(sibling.sibling_id))
        conversation = conversation_key(request) if self._orders_by_recency else None
        if turn is None:  # the request's own turn, else the sibling's
            turn = request.turn if request.turn is not None else (sibling.turn if sibling else 0)
        if sibling is not None:
            item = PolicyItem(
                turn=turn,
                sibling_id=sibling.sibling_id,
                group=sibling.group,
                batchable=request.batchable,
                prefix=prefix,
                left=sibling.left,
                conversation=conversation,
            )
        else:
            item = PolicyItem(
                turn=turn,
                batchable=request.batchable,
                prefix=prefix,
                conversation=conversation,
            )
        if self._priority_to_engine and request.priority == 0:
            request = replace(request, priority=self._core.priority.for_engine(item))
        item.payload = Submission(
            request=request,
            timeout=timeout,
            max_retries=max_retries,
            sibling=sibling,
            on_chunk=on_chunk,
            check=check,
        )
        if not tracing.ENABLED or not tracing.recording():
            return await self._attempts.run_item(item)
        t0 = time.monotonic()
        with tracing.call_span(self.name, self._provider, request, sibling) as span:
            try:
                resp = await self._attempts.run_item(item)
            except BaseException as exc:
                if span is not None:
                    span.failed(exc)
                raise
            if span is not None:
                span.ok(resp, time.monotonic() - t0 - item.queued_s)
            return resp
