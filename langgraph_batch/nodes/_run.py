"""The live state of one fan_out invocation, and how a run opens and closes.

`FanOutRun` is shared by the sibling tasks (through the inner graph's config):
the gate, the counters, the progress writer. `open_run` reads the items
(`read_items`), finds the scheduler (`named_scheduler`), builds the gate on
the server's KV ledger as the scheduler keeps it (`make_admission`; without
a named scheduler, `size_later` finds the one the siblings' models create)
and announces the run; `close_run` stops the gate's sizer and forgets what
coalesced tools kept for the run. `FanOutSpec` holds the options only.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from langchain_core.callbacks import adispatch_custom_event, dispatch_custom_event
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import merge_configs
from langgraph.config import get_stream_writer

from langgraph_batch._loop import BackgroundLoop
from langgraph_batch._observe import sinks
from langgraph_batch._observe.progress import FAN_OUT_EVENT, fan_out_event
from langgraph_batch.nodes._admission import SiblingAdmission
from langgraph_batch.nodes._direct import DirectLambda
from langgraph_batch.nodes._spec import FanOutSpec
from langgraph_batch.pricing import CostCallback, CostMeter
from langgraph_batch.scheduler import KVLedger, ledger_of
from langgraph_batch.scheduler.registry import find_scheduler, loop_schedulers, scheduler_created
from langgraph_batch.tools import forget_run

__all__ = (
    "RUN_KEY",
    "SYNC_MAX_THREADS",
    "FanOutRun",
    "child_config",
    "close_empty",
    "close_run",
    "group_id",
    "loop_scheduler",
    "make_admission",
    "named_scheduler",
    "open_run",
    "read_items",
    "report_sizer",
    "size_later",
    "stream_writer",
    "thread_config",
)

logger = logging.getLogger("langgraph_batch.nodes.fan_out")

RUN_KEY = "__lgb_fan_out_run"
"""configurable key carrying the live `FanOutRun` to the sibling tasks (never checkpointed)."""

FLUSH_EVENTS_S = 5.0
"""How long a fan_out waits, before it returns, for handlers to take its progress events."""

SYNC_MAX_THREADS = 128
"""Siblings running at once when a sync graph runs them in threads (unless the config
sets `max_concurrency`)."""


@dataclass(slots=True, kw_only=True)
class FanOutRun:
    """Live state of one fan_out invocation, shared by its sibling tasks."""

    node: str
    group: str
    run_id: str
    """Unique to this invocation (coalesced tools share within it, never across runs)."""
    total: int
    items: list[Any]
    admission: SiblingAdmission
    scheduler: Any
    writer: Callable[[Any], None]
    run_done: asyncio.Event
    sizer: asyncio.Task[None] | None = None
    started: int = 0
    done: int = 0
    failed: int = 0
    emit_failed: bool = False
    threads: bool = False
    """Whether the siblings run in threads (sync graph, sync-only checkpointer)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Guards the counters: in threads, siblings count from several threads."""
    config: RunnableConfig | None = None
    """The fan_out node's config: progress also goes to its callbacks as custom
    events (`astream_events` shows them as `on_custom_event`)."""
    pending: set[asyncio.Task[None]] = field(default_factory=set)
    """Custom events dispatched from the loop, not delivered yet (`flush_events` awaits them)."""
    meter: CostMeter | None = None
    """The run's usage and cost (with `prices` or `cost_into`): every event carries its
    summary as `cost`."""

    def count_started(self) -> None:
        with self.lock:
            self.started += 1
        sinks.sibling(self.node, "started")

    def count_done(self, *, failed: bool) -> None:
        with self.lock:
            self.done += 1
            self.failed += int(failed)
        sinks.sibling(self.node, "failed" if failed else "finished")

    def left(self) -> int:
        """Siblings not finished yet (`SiblingInfo.left`: the scheduler sizes its last waves)."""
        return max(0, self.total - self.done)

    def emit(self, event: str, **fields: Any) -> None:
        fields.setdefault("stats", _scheduler_stats(self.scheduler))
        if self.meter is not None:
            fields.setdefault("cost", self.meter.summary())
        try:
            payload = fan_out_event(
                event,
                node=self.node,
                group=self.group,
                done=self.done,
                failed=self.failed,
                total=self.total,
                active=self.admission.active,
                **fields,
            )
            self.writer(payload)
            if self.config is not None and _wants_custom_events(self.config):
                # stream_mode="custom" gets the writer's copy; astream_events and
                # any other callback handler get this one (never both in one stream).
                self._dispatch(payload)
        except Exception as exc:  # progress must never break a run, nor fail unseen
            if not self.emit_failed:
                self.emit_failed = True
                logger.warning(
                    "fan_out %s: progress events cannot be written (%s); the run goes on "
                    "without them",
                    self.node,
                    type(exc).__name__,
                )
            logger.debug("fan_out %s: could not write a progress event", self.node, exc_info=True)

    def _dispatch(self, payload: dict[str, Any]) -> None:
        """Hand `payload` to the callback handlers, never blocking the event loop.

        On a running loop the handlers are awaited in a task (the sync
        dispatcher would run async handlers on a thread and wait for it);
        `flush_events` delivers them before the node returns. Off the loop
        (siblings in threads, a sync node's own thread) the sync dispatcher runs.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            dispatch_custom_event(FAN_OUT_EVENT, payload, config=self.config)
            return
        task = loop.create_task(adispatch_custom_event(FAN_OUT_EVENT, payload, config=self.config))
        self.pending.add(task)
        task.add_done_callback(self._dispatched)

    def _dispatched(self, task: asyncio.Task[None]) -> None:
        self.pending.discard(task)
        if not task.cancelled() and task.exception() is not None and not self.emit_failed:
            self.emit_failed = True
            logger.warning(
                "fan_out %s: a callback handler failed on a progress event (%s); the run "
                "goes on without them",
                self.node,
                type(task.exception()).__name__,
            )

    async def flush_events(self) -> None:
        """Deliver the custom events still in flight.

        Bounded by `FLUSH_EVENTS_S`: a stuck handler never hangs a run; a run
        being cancelled drops them at once.
        """
        timeout = FLUSH_EVENTS_S
        if not self.pending:
            return
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            for event in self.pending:
                event.cancel()
            return
        _, late = await asyncio.wait(set(self.pending), timeout=timeout)
        for task in late:
            task.cancel()
        if late:
            logger.warning(
                "fan_out %s: %d progress events not delivered within %.0f s (a callback "
                "handler is stuck); dropped",
                self.node,
                len(late),
                timeout,
            )


def _wants_custom_events(config: RunnableConfig) -> bool:
    """Whether a callback handler of `config` listens to custom events.

    Dispatching one costs ~0.1 ms: skipped when nobody listens.
    """
    callbacks = config.get("callbacks")
    if callbacks is None:
        return False
    handlers = callbacks if isinstance(callbacks, list) else getattr(callbacks, "handlers", [])
    return any(not getattr(h, "ignore_custom_event", False) for h in handlers)


def _noop_writer(_: Any) -> None:
    return None


def stream_writer() -> Callable[[Any], None]:
    try:
        return get_stream_writer()
    except Exception:  # called outside a graph run
        return _noop_writer


def _scheduler_stats(scheduler: Any) -> dict[str, Any] | None:
    if scheduler is None or not callable(getattr(scheduler, "stats", None)):
        return None
    try:
        stats = scheduler.stats()
        if is_dataclass(stats) and not isinstance(stats, type):
            raw = asdict(stats)
        elif isinstance(stats, Mapping):
            raw = dict(stats)
        else:
            return None
    except Exception:
        logger.debug("fan_out: scheduler.stats() failed", exc_info=True)
        return None
    return {k: v for k, v in raw.items() if isinstance(v, int | float | str | bool) or v is None}


def group_id(config: RunnableConfig) -> str:
    """An id for this fan_out invocation: stable across resume when checkpointed."""
    conf = config.get("configurable") or {}
    ns = conf.get("checkpoint_ns")
    if isinstance(ns, str) and ns:
        # The namespace ends with this node's task id, which LangGraph derives
        # from the checkpoint: the same when the run resumes, new otherwise.
        raw = f"{conf.get('thread_id', '')}|{ns}"
        return hashlib.sha256(raw.encode()).hexdigest()[:8]
    return uuid.uuid4().hex[:8]


_DISCOVER_TIMEOUT_S = 1.0
"""How long after its first sibling started a fan_out without `scheduler=` waits for the
scheduler its siblings' models create (admitting one sibling meanwhile)."""


def loop_scheduler() -> Any:
    """The one open scheduler the model calls created in the running loop, if exactly one."""
    found = loop_schedulers()
    return found[0] if len(found) == 1 else None


async def _discover_scheduler(admission: SiblingAdmission, run_done: asyncio.Event) -> Any:
    """The one scheduler of the running loop, once a model creates it (None: gave up).

    The registry announces each scheduler it creates (`scheduler_created`):
    nothing polls. A loop with several schedulers is ambiguous (None at the
    deadline), as is one where no model of the run creates any.
    """
    loop = asyncio.get_running_loop()
    ended = loop.create_task(run_done.wait())
    started = loop.create_task(admission.first_resident.wait())
    deadline: asyncio.Task[None] | None = None
    created: asyncio.Future[Any] | None = None
    try:
        while True:
            found = loop_scheduler()
            if found is not None:
                return found
            created = scheduler_created()
            waits: set[asyncio.Future[Any]] = {created, ended}
            waits.add(deadline if deadline is not None else started)
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if ended in done or (deadline is not None and deadline in done):
                return None
            if deadline is None and started in done:
                # The grace period starts when the first sibling runs.
                deadline = loop.create_task(asyncio.sleep(_DISCOVER_TIMEOUT_S))
    finally:
        for task in (ended, started, deadline, created):
            if task is not None and not task.done():
                task.cancel()


def read_items(spec: FanOutSpec, state: Any) -> list[Any]:
    """The run's items, from the state key or callable, as a list in input order."""
    if callable(spec.items):
        seq = spec.items(state)
    else:
        try:
            seq = state[spec.items]
        except (KeyError, TypeError):
            raise KeyError(
                f"fan_out {spec.node_name!r}: the state has no key {spec.items!r} to read "
                f"items from; pass items= the right key or a callable(state)"
            ) from None
    if isinstance(seq, Set):
        raise TypeError(
            f"fan_out {spec.node_name!r}: items is a {type(seq).__name__}, which has no input "
            f"order, but results come back in input order; pass a list (for example "
            f"sorted(...) of it)"
        )
    if isinstance(seq, str | bytes) or not isinstance(seq, Sequence):
        raise TypeError(
            f"fan_out {spec.node_name!r}: items must be a sequence (a list or tuple), "
            f"got {type(seq).__name__}"
        )
    items = list(seq)
    if spec.make_input is None and not isinstance(spec.subgraph, DirectLambda):
        # A graph takes a mapping; a plain function takes whatever the item is.
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise TypeError(
                    f"fan_out {spec.node_name!r}: item {i} is a {type(item).__name__}, not a "
                    f"mapping; pass make_input=lambda item, index: {{...}} to build each "
                    f"sibling's input"
                )
    return items


def named_scheduler(spec: FanOutSpec) -> Any:
    """The scheduler `spec` names: itself, or its registry name's (None: none, or unknown)."""
    sched = spec.scheduler
    if isinstance(sched, str):
        try:
            return find_scheduler(sched)
        except Exception:
            logger.debug("fan_out: no scheduler named %s", sched, exc_info=True)
            return None
    return sched


async def size_later(admission: SiblingAdmission, run_done: asyncio.Event) -> None:
    """Size the gate from the scheduler the first sibling's model creates.

    Runs while the gate admits one fresh sibling at a time; gives up (no
    budget, as when the capacity is unknown) when no scheduler appears
    within `_DISCOVER_TIMEOUT_S` after the first sibling started, or the
    run ends.
    """
    ledger: KVLedger | None = None
    try:
        found = await _discover_scheduler(admission, run_done)
        if found is not None:
            ledger = await ledger_of(found)
    finally:
        admission.set_kv_ledger(ledger)


async def make_admission(spec: FanOutSpec, scheduler: Any) -> SiblingAdmission:
    """The gate of one run: `max_active` plus the server's shared KV budget when known."""
    return SiblingAdmission(
        max_active=spec.max_active,
        kv_ledger=await ledger_of(scheduler),
        kv_headroom=spec.kv_headroom,
        sibling_tokens=spec.sibling_tokens,
    )


def report_sizer(task: asyncio.Task[None]) -> None:
    """The sizer is never awaited (the run may be cancelled): report its failure here."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.warning(
            "fan_out: sizing the admission gate failed (%s); running without a KV budget",
            type(exc).__name__,
        )


async def open_run(spec: FanOutSpec, state: Any, config: RunnableConfig) -> FanOutRun:
    """Read the items, build the gate, announce the run (in the event loop it will use)."""
    items = read_items(spec, state)
    remote = spec.executor is not None
    # Remote siblings are admitted by their workers: the parent's gate stays open.
    scheduler = None if remote else named_scheduler(spec)
    admission = SiblingAdmission() if remote else await make_admission(spec, scheduler)
    label = spec.name
    if label is None:  # unnamed: progress events use the graph's name for the node
        label = str((config.get("metadata") or {}).get("langgraph_node") or spec.node_name)
    run = FanOutRun(
        node=label,
        group=group_id(config),
        run_id=uuid.uuid4().hex,
        total=len(items),
        items=items,
        admission=admission,
        scheduler=scheduler,
        writer=stream_writer(),
        run_done=asyncio.Event(),
        config=config,
    )
    if spec.prices is not None or spec.cost_into is not None:
        run.meter = CostMeter(prices=spec.prices)
    if not remote and scheduler is None and spec.max_active is None and items:
        # No scheduler named: the siblings' models create one on their first
        # call. Let one sibling in, find that scheduler, then size the gate.
        admission.start_sizing()
        run.sizer = asyncio.create_task(size_later(admission, run.run_done))
        run.sizer.add_done_callback(report_sizer)
    run.emit("started", max_active=admission.max_active)
    return run


def child_config(run: FanOutRun, config: RunnableConfig) -> RunnableConfig:
    child: RunnableConfig = {"configurable": {RUN_KEY: run}}
    if run.meter is not None:
        # Every model call of every sibling reports its usage to the run's meter.
        child["callbacks"] = [CostCallback(run.meter)]
    return merge_configs(config, child)


def thread_config(run: FanOutRun, child: RunnableConfig) -> RunnableConfig:
    """In threads, each running sibling holds one: size LangGraph's pool for them."""
    if child.get("max_concurrency"):
        return child
    return merge_configs(child, {"max_concurrency": min(run.total, SYNC_MAX_THREADS)})


def close_run(run: FanOutRun, *, loop: BackgroundLoop | None = None) -> None:
    """Stop the sizer and forget kept tool results (from the run's loop, or any thread)."""

    def close() -> None:
        run.run_done.set()
        if run.sizer is not None and not run.sizer.done():
            run.sizer.cancel()  # never awaited here: this task may itself be cancelled
        run.admission.close()  # its siblings stop counting in the server's KV ledger
        forget_run(run.run_id)  # what coalesced tools kept for the run

    if loop is None:
        close()
    else:
        loop.call(close)


def close_empty(spec: FanOutSpec, run: FanOutRun) -> dict[str, Any]:
    run.admission.close()  # nothing ran: leave the server's KV ledger at once
    run.emit("done")
    if spec.cost_into is not None and run.meter is not None:
        return {spec.into: [], spec.cost_into: run.meter.summary()}
    return {spec.into: []}
