"""One request's life inside the `Scheduler`: slot, call, retries, timeout.

The caller's task runs all of it (`Scheduler.submit` calls `_run_item`): it
asks the policy for a slot (at once when nothing is queued, else it parks on
a future the dispatch loop resolves), calls the backend, gives the slot back
whatever happens, and retries a retryable failure after a jittered backoff
WITHOUT a slot. A streamed request that already delivered content or
tool-call chunks is never retried. A prefix leader's first chunk releases its
held followers (`_call_leader`).

`RequestAttempts` is a collaborator of the `Scheduler`, given the backend,
the policy, the policy core, the stats, the scheduler's `Lifecycle` and its
`DispatchLoop` (to wake it and to give slots back).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import replace

from langgraph_batch._heartbeat import held
from langgraph_batch._rate_budget import RateTicket
from langgraph_batch._retry_policy import Delivery
from langgraph_batch.backends.base import Backend, ChatChunk, ChatRequest, ChatResponse
from langgraph_batch.errors import BatchTimeoutError, MalformedToolCallError
from langgraph_batch.scheduler._dispatch import DispatchLoop
from langgraph_batch.scheduler._item import HELD, QUEUED, RUNNING, Outcome, PolicyItem, Submission
from langgraph_batch.scheduler._pacing import RateGate
from langgraph_batch.scheduler._policy import BatchPolicy, Planner
from langgraph_batch.scheduler._retry import log_failure, log_retry, outcome_of
from langgraph_batch.scheduler._state import Lifecycle
from langgraph_batch.scheduler._stats import StatsRecorder

__all__ = ("RequestAttempts",)


class RequestAttempts:
    """The `Scheduler`'s part that runs one request in its caller's task.

    Args:
        backend: where calls go.
        policy: the scheduler's policy (its `retry`).
        core: the policy core that grants slots.
        stats: the scheduler's counters.
        life: the scheduler's lifecycle.
        dispatch: the dispatch loop (woken when a slot may be granted; takes slots back).
        gate: the rate budget each attempt waits for before its slot (None: none).
    """

    def __init__(
        self,
        *,
        backend: Backend,
        policy: BatchPolicy,
        core: Planner,
        stats: StatsRecorder,
        life: Lifecycle,
        dispatch: DispatchLoop,
        gate: RateGate | None = None,
    ) -> None:
        self._backend = backend
        self._policy = policy
        self._core = core
        self._stats = stats
        self._life = life
        self._dispatch = dispatch
        self._gate = gate
        self._rng = random.Random()

    async def run_item(self, item: PolicyItem) -> ChatResponse:
        """Run the submission `item` carries (`item.payload`) to its response or error."""
        call: Submission = item.payload
        request, timeout, sibling = call.request, call.timeout, call.sibling
        try:
            if timeout is None:
                return await self._execute(item, call)
            cm = asyncio.timeout(timeout)
            try:
                async with cm:
                    return await self._execute(item, call)
            except TimeoutError as exc:
                if not cm.expired():
                    raise
                self._stats.timed_out += 1
                err = BatchTimeoutError(
                    f"request {request.request_id or '<no id>'} did not finish within "
                    f"{timeout} s ({item.queued_s:.3f} s of it waiting for a slot). Raise "
                    "`timeout`, or lower the load (fewer siblings, higher max_inflight).",
                    timeout_s=timeout,
                    queued_s=item.queued_s,
                    request_id=request.request_id or None,
                )
                self._stats.record_failure(err)
                log_failure(self._life.name, request.request_id, sibling, err, attempt=0)
                raise err from exc
        except asyncio.CancelledError:
            self._stats.cancelled += 1
            raise

    async def _execute(self, item: PolicyItem, call: Submission) -> ChatResponse:
        request, max_retries, sibling = call.request, call.max_retries, call.sibling
        on_chunk, check = call.on_chunk, call.check
        loop = asyncio.get_running_loop()
        core = self._core
        clock = time.monotonic
        t0 = clock()
        retry = self._policy.retry
        # Only content and tool-call fragments reach the caller's output; a stream
        # that fails before the first of them is retried like any call.
        delivery = Delivery()
        cb = delivery.wrap(on_chunk) if on_chunk is not None and request.stream else on_chunk
        attempt = 0
        gate = self._gate
        while True:
            ticket = None
            try:
                if gate is not None:
                    ticket = await gate.wait(request)
                now = clock()
                if core.try_acquire(item, now):
                    resp = await self._call(item, request, cb, ticket)
                else:
                    fut: asyncio.Future[ChatResponse | None] = loop.create_future()
                    item.future = fut
                    core.enqueue(item, now)
                    if core.slots_free and core.ready:
                        self._dispatch.kick()
                    try:
                        with held():  # parked: LangGraph's idle timeout must not fire
                            res = await fut
                    except asyncio.CancelledError:
                        self._abandon(item)
                        raise
                    resp = res if res is not None else await self._call(item, request, cb, ticket)
                if gate is not None:
                    gate.done(ticket, resp, None)
                if check is not None:
                    check(resp)
            except Exception as exc:
                if gate is not None:
                    gate.done(ticket, None, exc)
                if isinstance(exc, MalformedToolCallError):
                    self._stats.malformed_tool_calls += 1
                if not self._life.opened or not retry.should_retry(
                    exc, attempt=attempt, delivery=delivery, max_retries=max_retries
                ):
                    self._stats.record_failure(exc)
                    log_failure(
                        self._life.name,
                        request.request_id,
                        sibling,
                        exc,
                        attempt=attempt,
                        delivered=delivery.delivered,
                    )
                    raise
                attempt += 1
                self._stats.record_retry(exc)
                delay = retry.interval(
                    attempt, self._rng, retry_after=getattr(exc, "retry_after_s", None)
                )
                log_retry(
                    self._life.name,
                    request.request_id,
                    sibling,
                    exc,
                    attempt=attempt,
                    max_retries=max_retries,
                    delay=delay,
                )
                with held():
                    await asyncio.sleep(delay)
                if not self._life.opened:
                    refusal = self._life.refusal()
                    self._stats.record_failure(refusal)
                    raise refusal from exc
                continue
            except BaseException as exc:  # cancelled: its booking stays spent
                if gate is not None:
                    gate.done(ticket, None, exc)
                raise
            self._stats.record_success(
                queue_wait=item.queued_s, latency=clock() - t0, usage=resp.usage
            )
            return replace(resp, queue_wait_s=item.queued_s)

    async def _call(
        self,
        item: PolicyItem,
        request: ChatRequest,
        cb: Callable[[ChatChunk], None] | None,
        ticket: RateTicket | None,
    ) -> ChatResponse:
        self._stats.record_dispatch()
        gate = self._gate
        try:
            with gate.sending(ticket) if gate is not None else contextlib.nullcontext():
                if item.leading:
                    resp = await self._call_leader(item, request, cb)
                else:
                    resp = await self._backend.chat(request, on_chunk=cb)
        except BaseException as exc:
            self._dispatch.release(item, outcome_of(exc))
            raise
        self._dispatch.release(item, Outcome.OK)
        return resp

    async def _call_leader(
        self,
        item: PolicyItem,
        request: ChatRequest,
        cb: Callable[[ChatChunk], None] | None,
    ) -> ChatResponse:
        # The prefix leader: the first streamed chunk means the server has run
        # the prefill (and cached the prefix), so the held followers may go.
        # A non-streaming leader is streamed internally; chat() returns the
        # aggregated response either way. Its caller's on_chunk (if any) is
        # not called, as for any non-streaming request.
        user_cb = cb if request.stream else None
        seen = False

        def first(chunk: ChatChunk) -> None:
            nonlocal seen
            if not seen:
                seen = True
                if self._life.opened and self._core.on_first_token(item, time.monotonic()):
                    self._dispatch.kick()
            if user_cb is not None:
                user_cb(chunk)

        if not request.stream:
            request = replace(request, stream=True)
        return await self._backend.chat(request, on_chunk=first)

    def _abandon(self, item: PolicyItem) -> None:
        # The caller was cancelled while parked on its future.
        if item.state == QUEUED or item.state == HELD:
            core = self._core
            core.withdraw(item, time.monotonic())  # counts its wait into queued_s
            if core.ready and core.slots_free:
                self._dispatch.kick()  # a withdrawn leader may have handed the lead on
        elif item.state == RUNNING and not item.in_batch:
            # Granted but never started: give the slot straight back.
            self._dispatch.release(item, Outcome.CANCELLED)
        elif item.state == RUNNING:
            # In a batched call: abort the call once none of its members waits.
            self._dispatch.abandon(item)
