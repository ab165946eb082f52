"""`fan_out`: a graph node that runs one sibling subgraph per item, isolated and durable.

```python
builder.add_node(
    "review",
    fan_out(agent, items="docs", into="reviews", make_input=lambda d, i: {"messages": [d]}),
)
```

How it is built, and why:

- `fan_out(...)` returns a `FanOutNode`, a `RunnableLambda` the user adds
  as one node of the parent graph. When it runs it reads the items from the
  parent state and invokes an inner compiled graph (`FanOutNode.graph`):
  `START -> Send("sibling", {index, item}) x N`. Invoking a compiled graph
  inside a node makes it a LangGraph subgraph with its own checkpoint
  namespace, and each `Send` is its own task with its own namespace and its
  own pending writes. With a checkpointer, a run killed after k siblings
  finished resumes (`ainvoke(None, config)`) with only the others re-run:
  the parent re-runs the fan_out node, which re-enters the inner graph in
  resume mode, and the inner graph replays the k saved writes.
- The sibling node calls the user's subgraph with `ainvoke` inside
  `sibling_scope(SiblingInfo(...))`. A context variable set in one node does
  not reach another node, so the user's subgraph cannot simply be the Send
  target; calling it from the sibling node is what lets the sibling identity
  reach every model and tool call inside it (LangGraph copies the context
  into each task it spawns). Admission (the `max_active` gate) wraps the
  same call.
- Failure isolation is a `try/except` around that call: the failing sibling
  writes a `SiblingError` record instead of a result, so LangGraph never
  sees a failed task and never cancels the others (a bare Send fan-out
  cancels every sibling on the first failure). `add_node(error_handler=...)`
  would isolate too, but cannot share the sibling context with the
  subgraph call. `GraphBubbleUp` (interrupts, `Command(graph=PARENT)`)
  passes through untouched.
- `get_graph(xray=True)` finds the inner graph and the user's subgraph
  because both are closure variables of the node functions (LangGraph looks
  for compiled graphs among a function's nonlocals).
- Cancelling the run cancels the fan_out task, which cancels the inner graph
  and every Send task in it; their queued LLM requests are withdrawn by the
  scheduler when their awaiting callers are cancelled.

Records travel through the private `results` channel as plain lists
(`[index, "ok", value]` or `[index, "error", {...}]`) so they survive any
checkpoint serializer, including strict msgpack; the collector turns them
into the `into` list, in input order.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import logging
import operator
import sys
import traceback as tb
import uuid
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import asdict, dataclass, is_dataclass
from typing import Annotated, Any, Literal, TypedDict

from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.runnables.config import merge_configs
from langgraph.config import get_stream_writer
from langgraph.errors import GraphBubbleUp
from langgraph.graph import START, StateGraph
from langgraph.types import Send

from langgraph_batch._context import SiblingInfo, sibling_scope
from langgraph_batch._loop import background_loop
from langgraph_batch._progress import fan_out_event
from langgraph_batch.errors import SiblingFailedError
from langgraph_batch.nodes._admission import DEFAULT_KV_HEADROOM, SiblingAdmission
from langgraph_batch.scheduler.registry import loop_schedulers

__all__ = ("DEFAULT_SIBLING_TOKENS", "FanOutNode", "SiblingError", "fan_out")

logger = logging.getLogger(__name__)

DEFAULT_SIBLING_TOKENS = 4096
"""Estimated KV working set of one sibling before any has finished (sizes `max_active`)."""

_RUN_KEY = "__lgb_fan_out_run"
"""configurable key carrying the live `_FanOutRun` to the sibling tasks (never checkpointed)."""

_METRICS_TIMEOUT_S = 2.0
"""How long a fan_out waits for the server's metrics to size `max_active`."""

_DISCOVER_TIMEOUT_S = 1.0
"""How long after its first sibling started a fan_out without `scheduler=` looks for the
scheduler its siblings' models create (admitting one sibling meanwhile)."""

_DISCOVER_POLL_S = 0.02

_OK = "ok"
_ERR = "error"


@dataclass(frozen=True, slots=True, kw_only=True)
class SiblingError:
    """A sibling that raised, in its place among the results of `fan_out`.

    Serialisable: it round-trips through LangGraph's checkpoint serializer.
    Under strict msgpack (`LANGGRAPH_STRICT_MSGPACK=true`) annotate the `into`
    key with `SiblingError` (e.g. `list[Review | SiblingError]`) so the
    graph's allowlist includes it, or it comes back as a dict
    (`SiblingError.from_dict` restores it).
    """

    index: int
    """Position of the sibling's item in the input list."""
    item: Any
    """The item the sibling ran on."""
    error_type: str
    """The exception's class name, e.g. `BackendServerError`."""
    message: str
    """`str(exception)`."""
    retryable: bool = False
    """Whether running the sibling again may succeed (the exception's `is_retryable`)."""
    traceback: str | None = None
    """The formatted traceback, when available."""

    @classmethod
    def from_exception(cls, exc: BaseException, *, index: int, item: Any) -> SiblingError:
        """Describe `exc`, raised by sibling `index` running on `item`."""
        retryable = getattr(exc, "is_retryable", None)
        if not isinstance(retryable, bool):
            retryable = isinstance(exc, ConnectionError | TimeoutError)
        return cls(
            index=index,
            item=item,
            error_type=type(exc).__name__,
            message=str(exc),
            retryable=retryable,
            traceback="".join(tb.format_exception(exc)),
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict."""
        return {
            "index": self.index,
            "item": self.item,
            "error_type": self.error_type,
            "message": self.message,
            "retryable": self.retryable,
            "traceback": self.traceback,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SiblingError:
        """Rebuild from `to_dict()` output (or a checkpoint that stored it as a dict)."""
        return cls(
            index=int(data["index"]),
            item=data.get("item"),
            error_type=str(data["error_type"]),
            message=str(data.get("message", "")),
            retryable=bool(data.get("retryable", False)),
            traceback=data.get("traceback"),
        )


class _SiblingPayload(TypedDict):
    index: int
    item: Any


class _InnerState(TypedDict, total=False):
    items: list[Any]
    results: Annotated[list[list[Any]], operator.add]


@dataclass(slots=True, kw_only=True)
class _FanOutRun:
    """Live state of one fan_out invocation, shared by its sibling tasks."""

    node: str
    group: str
    run_id: str
    """Unique to this invocation (coalesced tools share within it, never across runs)."""
    total: int
    admission: SiblingAdmission
    scheduler: Any
    writer: Callable[[Any], None]
    done: int = 0
    failed: int = 0
    emit_failed: bool = False

    def emit(self, event: str, **fields: Any) -> None:
        fields.setdefault("stats", _scheduler_stats(self.scheduler))
        try:
            self.writer(
                fan_out_event(
                    event,
                    node=self.node,
                    group=self.group,
                    done=self.done,
                    failed=self.failed,
                    total=self.total,
                    active=self.admission.active,
                    **fields,
                )
            )
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


def _noop_writer(_: Any) -> None:
    return None


def _stream_writer() -> Callable[[Any], None]:
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


def _group_id(config: RunnableConfig) -> str:
    """An id for this fan_out invocation: stable across resume when checkpointed."""
    conf = config.get("configurable") or {}
    ns = conf.get("checkpoint_ns")
    if isinstance(ns, str) and ns:
        # The namespace ends with this node's task id, which LangGraph derives
        # from the checkpoint: the same when the run resumes, new otherwise.
        raw = f"{conf.get('thread_id', '')}|{ns}"
        return hashlib.sha256(raw.encode()).hexdigest()[:8]
    return uuid.uuid4().hex[:8]


async def _fetch_kv_capacity(scheduler: Any) -> int | None:
    """Ask the scheduler's backend for its KV capacity when no metrics were polled yet."""
    backend = getattr(scheduler, "backend", None)
    if backend is None or not callable(getattr(backend, "metrics", None)):
        return None
    try:
        async with asyncio.timeout(_METRICS_TIMEOUT_S):
            metrics = await backend.metrics()
    except Exception:  # unknown capacity means no cap, never a failed run
        logger.debug("fan_out: could not read the server's KV capacity", exc_info=True)
        return None
    capacity = getattr(metrics, "kv_capacity_tokens", None)
    return capacity if isinstance(capacity, int) else None


def _loop_scheduler() -> Any:
    """The one open scheduler the model calls created in the running loop, if exactly one."""
    found = loop_schedulers()
    return found[0] if len(found) == 1 else None


def _forget_run(run_id: str) -> None:
    """Drop what coalesced tools kept for this run (the tools module is optional here)."""
    tools = sys.modules.get("langgraph_batch._tool_policy")
    forget = getattr(tools, "forget_run", None)
    if callable(forget):
        try:
            forget(run_id)
        except Exception:
            logger.warning("fan_out: forget_run(%s) failed", run_id, exc_info=True)


def _report_sizer(task: asyncio.Task[None]) -> None:
    """The sizer is never awaited (the run may be cancelled): report its failure here."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.warning(
            "fan_out: sizing the admission gate failed (%s); running without a KV budget",
            type(exc).__name__,
        )


def _default_input(item: Any, index: int) -> Any:
    return item


@dataclass(slots=True, kw_only=True)
class _Spec:
    """The options of one FanOutNode, and what the node functions do with them.

    Deliberately not a Runnable: LangGraph searches node functions' closures
    for compiled graphs (xray), and a Runnable here would be searched first.
    """

    name: str
    named: bool
    """Whether `name` was given (else progress events use the graph's node name)."""
    items: str | Callable[[Any], Sequence[Any]]
    into: str
    make_input: Callable[[Any, int], Any] | None
    result: Callable[[Any], Any] | None
    on_error: Literal["collect", "raise"]
    max_active: int | None
    scheduler: Any
    sibling_tokens: int
    kv_headroom: float = DEFAULT_KV_HEADROOM

    def resolve_items(self, state: Any) -> list[Any]:
        if callable(self.items):
            seq = self.items(state)
        else:
            try:
                seq = state[self.items]
            except (KeyError, TypeError):
                raise KeyError(
                    f"fan_out {self.name!r}: the state has no key {self.items!r} to read "
                    f"items from; pass items= the right key or a callable(state)"
                ) from None
        if isinstance(seq, Set):
            raise TypeError(
                f"fan_out {self.name!r}: items is a {type(seq).__name__}, which has no input "
                f"order, but results come back in input order; pass a list (for example "
                f"sorted(...) of it)"
            )
        if isinstance(seq, str | bytes) or not isinstance(seq, Sequence):
            raise TypeError(
                f"fan_out {self.name!r}: items must be a sequence (a list or tuple), "
                f"got {type(seq).__name__}"
            )
        items = list(seq)
        if self.make_input is None:
            for i, item in enumerate(items):
                if not isinstance(item, Mapping):
                    raise TypeError(
                        f"fan_out {self.name!r}: item {i} is a {type(item).__name__}, not a "
                        f"mapping; pass make_input=lambda item, index: {{...}} to build each "
                        f"sibling's input"
                    )
        return items

    def resolve_scheduler(self) -> Any:
        sched = self.scheduler
        if isinstance(sched, str):
            try:
                # Imported by name: the scheduler package is optional at this layer.
                registry = importlib.import_module("langgraph_batch.scheduler.registry")
            except ImportError:
                return None
            try:
                return registry.get_scheduler(sched)
            except Exception:
                logger.debug("fan_out: no scheduler named %s", sched, exc_info=True)
                return None
        return sched

    async def resolve_kv_capacity(self, scheduler: Any) -> int | None:
        """The server's KV capacity in tokens, or None when unknown."""
        capacity = getattr(getattr(scheduler, "latest_metrics", None), "kv_capacity_tokens", None)
        if capacity is None:
            capacity = await _fetch_kv_capacity(scheduler)
        if isinstance(capacity, int) and not isinstance(capacity, bool) and capacity > 0:
            return capacity
        return None

    async def resolve_max_active(self, scheduler: Any) -> int | None:
        """The starting cap: explicit, else KV capacity // sibling_tokens, else None."""
        if self.max_active is not None:
            return self.max_active
        capacity = await self.resolve_kv_capacity(scheduler)
        return None if capacity is None else max(1, capacity // self.sibling_tokens)

    async def size_later(self, admission: SiblingAdmission, run_done: asyncio.Event) -> None:
        """Find the scheduler the first sibling's model created, then size the gate.

        Runs while the gate admits one fresh sibling at a time; gives up (no
        budget, as when the capacity is unknown) when none appears within
        `_DISCOVER_TIMEOUT_S` or the run ends.
        """
        capacity: int | None = None
        try:
            loop = asyncio.get_running_loop()
            deadline: float | None = None
            while not run_done.is_set() and (deadline is None or loop.time() < deadline):
                if deadline is None and admission.stats().resident:
                    # The grace period starts when the first sibling runs.
                    deadline = loop.time() + _DISCOVER_TIMEOUT_S
                found = _loop_scheduler()
                if found is not None:
                    capacity = await self.resolve_kv_capacity(found)
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_DISCOVER_POLL_S):
                        await run_done.wait()
        finally:
            admission.set_kv_capacity(capacity, kv_headroom=self.kv_headroom)

    async def make_admission(self, scheduler: Any) -> SiblingAdmission:
        """The gate of one run: `max_active` plus the resident KV budget when capacity is known."""
        capacity = await self.resolve_kv_capacity(scheduler)
        return SiblingAdmission(
            max_active=self.max_active,
            kv_capacity=capacity,
            kv_headroom=self.kv_headroom,
            sibling_tokens=self.sibling_tokens,
        )

    def collect(self, run: _FanOutRun, records: Sequence[Sequence[Any]]) -> list[Any]:
        by_index: dict[int, Any] = {}
        for rec in records:
            index, kind, value = int(rec[0]), rec[1], rec[2]
            by_index[index] = SiblingError.from_dict(value) if kind == _ERR else value
        missing = [i for i in range(run.total) if i not in by_index]
        if missing:
            # Cannot happen unless the checkpoint was edited: say so clearly.
            raise RuntimeError(
                f"fan_out {self.name!r}: no result for siblings {missing[:10]} "
                f"(of {run.total}); the inner checkpoint is inconsistent"
            )
        return [by_index[i] for i in range(run.total)]


class FanOutNode(RunnableLambda[Any, dict[str, Any]]):
    """The node `fan_out` returns: add it with `StateGraph.add_node(name, node)`.

    Runs in async graphs (`ainvoke`, `astream`) and sync ones (`invoke`, `stream`:
    the node then runs on langgraph-batch's background event loop).

    Attributes:
        subgraph: the compiled graph each sibling runs.
        graph: the inner graph (dispatch via `Send`, one task per sibling).
    """

    def __init__(
        self,
        subgraph: Any,
        *,
        items: str | Callable[[Any], Sequence[Any]],
        into: str,
        make_input: Callable[[Any, int], Any] | None = None,
        result: Callable[[Any], Any] | None = None,
        on_error: Literal["collect", "raise"] = "collect",
        max_active: int | None = None,
        scheduler: Any = None,
        name: str | None = None,
        sibling_tokens: int = DEFAULT_SIBLING_TOKENS,
        kv_headroom: float = DEFAULT_KV_HEADROOM,
    ) -> None:
        _validate(
            subgraph=subgraph,
            items=items,
            into=into,
            make_input=make_input,
            result=result,
            on_error=on_error,
            max_active=max_active,
            scheduler=scheduler,
            name=name,
            sibling_tokens=sibling_tokens,
            kv_headroom=kv_headroom,
        )
        node_name = name or f"fan_out[{getattr(subgraph, 'name', None) or 'subgraph'}]"
        self.subgraph = subgraph
        self.spec = _Spec(
            name=node_name,
            named=name is not None,
            items=items,
            into=into,
            make_input=make_input,
            result=result,
            on_error=on_error,
            max_active=max_active,
            scheduler=scheduler,
            sibling_tokens=sibling_tokens,
            kv_headroom=kv_headroom,
        )
        self.graph = _build_inner(self.spec, subgraph)
        sync_runner, async_runner = _build_runner(self.spec, self.graph)
        super().__init__(sync_runner, afunc=async_runner, name=node_name)

    @property
    def into(self) -> str:
        """The state key that receives the results."""
        return self.spec.into

    def __repr__(self) -> str:
        sub = getattr(self.subgraph, "name", None) or type(self.subgraph).__name__
        return f"FanOutNode(name={self.name!r}, subgraph={sub!r}, into={self.spec.into!r})"


def _validate(
    *,
    subgraph: Any,
    items: Any,
    into: Any,
    make_input: Any,
    result: Any,
    on_error: Any,
    max_active: Any,
    scheduler: Any,
    name: Any,
    sibling_tokens: Any,
    kv_headroom: Any,
) -> None:
    """Refuse bad `fan_out` arguments at construction, naming the bad value."""
    if not callable(getattr(subgraph, "ainvoke", None)):
        raise TypeError(
            f"fan_out needs a compiled graph or Runnable with ainvoke, got {type(subgraph)!r}"
        )
    if isinstance(items, str):
        if not items:
            raise ValueError("items must be a non-empty state key or a callable(state), got ''")
    elif not callable(items):
        raise TypeError(f"items must be a state key or a callable(state), got {items!r}")
    if not isinstance(into, str) or not into:
        raise ValueError(f"into must be a non-empty state key, got {into!r}")
    for label, fn in (("make_input", make_input), ("result", result)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{label} must be a callable or None, got {fn!r}")
    if on_error not in ("collect", "raise"):
        raise ValueError(f"on_error must be 'collect' or 'raise', got {on_error!r}")
    if max_active is not None and not _positive_int(max_active):
        raise ValueError(f"max_active must be a positive int or None, got {max_active!r}")
    if scheduler is not None:
        if isinstance(scheduler, str):
            if not scheduler:
                raise ValueError("scheduler must be a Scheduler, a registry name or None, got ''")
        elif not callable(getattr(scheduler, "stats", None)):
            hint = (
                "; pass model.get_scheduler() for a BatchedChatModel"
                if callable(getattr(scheduler, "get_scheduler", None))
                else ""
            )
            raise TypeError(
                f"scheduler must be a Scheduler, a registry name or None, "
                f"got {type(scheduler).__name__}{hint}"
            )
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"name must be a non-empty string or None, got {name!r}")
    if not _positive_int(sibling_tokens):
        raise ValueError(f"sibling_tokens must be a positive int, got {sibling_tokens!r}")
    if (
        isinstance(kv_headroom, bool)
        or not isinstance(kv_headroom, int | float)
        or not 0.0 < kv_headroom <= 1.0
    ):
        raise ValueError(f"kv_headroom must be a number in (0, 1], got {kv_headroom!r}")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _build_runner(
    spec: _Spec, inner: Any
) -> tuple[Callable[..., dict[str, Any]], Callable[..., Any]]:
    """The parent-graph node functions, sync and async.

    Both are closures that name `inner`: xray finds the sibling subgraph by
    reading the node function's closure.
    """

    async def run_fan_out(state: Any, config: RunnableConfig) -> dict[str, Any]:
        return await _run_fan_out(spec, inner, state, config)

    def run_fan_out_sync(state: Any, config: RunnableConfig) -> dict[str, Any]:
        # Sync graphs (`graph.invoke`) run nodes in threads: run the node on the
        # shared background loop, where the siblings' sync model calls meet
        # their scheduler too. The parent's checkpointer must then support the
        # async API (InMemorySaver, AsyncSqliteSaver, ... do).
        return background_loop().run(_run_fan_out(spec, inner, state, config))

    return run_fan_out_sync, run_fan_out


async def _run_fan_out(
    spec: _Spec, inner: Any, state: Any, config: RunnableConfig
) -> dict[str, Any]:
    """Run every sibling of one fan_out invocation and collect the results."""
    items = spec.resolve_items(state)
    scheduler = spec.resolve_scheduler()
    admission = await spec.make_admission(scheduler)
    run_done = asyncio.Event()
    sizer: asyncio.Task[None] | None = None
    if scheduler is None and spec.max_active is None and items:
        # No scheduler named: the siblings' models create one on their first
        # call. Let one sibling in, find that scheduler, then size the gate.
        admission.start_sizing()
        sizer = asyncio.create_task(spec.size_later(admission, run_done))
        sizer.add_done_callback(_report_sizer)
    label = spec.name
    if not spec.named:
        label = str((config.get("metadata") or {}).get("langgraph_node") or label)
    run = _FanOutRun(
        node=label,
        group=_group_id(config),
        run_id=uuid.uuid4().hex,
        total=len(items),
        admission=admission,
        scheduler=scheduler,
        writer=_stream_writer(),
    )
    run.emit("started", max_active=admission.max_active)
    if not items:
        run.emit("done")
        return {spec.into: []}
    child = merge_configs(config, {"configurable": {_RUN_KEY: run}})
    try:
        out = await inner.ainvoke({"items": items}, child)
    finally:
        run_done.set()
        if sizer is not None and not sizer.done():
            sizer.cancel()  # never awaited here: this task may itself be cancelled
        _forget_run(run.run_id)
    results = spec.collect(run, out.get("results") or [])
    errors = [r for r in results if isinstance(r, SiblingError)]
    run.done, run.failed = len(results), len(errors)
    run.emit("done", peak_active=admission.stats().peak_active)
    if errors and spec.on_error == "raise":
        first = errors[0]
        raise SiblingFailedError(
            f"fan_out {spec.name!r}: {len(errors)} of {len(results)} siblings failed "
            f"(first: sibling {first.index}: {first.error_type}: {first.message}); "
            f"use on_error='collect' to get SiblingError results instead",
            errors=errors,
            results=results,
        )
    return {spec.into: results}


def _build_inner(spec: _Spec, subgraph: Any) -> Any:
    """The inner graph: one Send task per item, each running `subgraph` (a closure variable)."""

    def dispatch(state: _InnerState) -> list[Send]:
        return [
            Send("sibling", _SiblingPayload(index=i, item=item))
            for i, item in enumerate(state.get("items") or [])
        ]

    async def sibling(payload: _SiblingPayload, config: RunnableConfig) -> dict[str, Any]:
        run: _FanOutRun = (config.get("configurable") or {})[_RUN_KEY]
        index: int = payload["index"]
        item = payload["item"]
        info = SiblingInfo(
            group=run.group,
            index=index,
            total=run.total,
            admission=run.admission,
            run_id=run.run_id,
        )
        child = merge_configs(
            config,
            {
                "configurable": {"lgb_sibling_group": run.group, "lgb_sibling_index": index},
                "metadata": {"lgb_sibling_group": run.group, "lgb_sibling_index": index},
            },
        )
        make_input = spec.make_input or _default_input
        try:
            sibling_input = make_input(item, index)
            with sibling_scope(info):
                await run.admission.acquire(info, returning=False)
                try:
                    run.emit("sibling_started", index=index)
                    final = await subgraph.ainvoke(sibling_input, child)
                finally:
                    # Done for good: its KV leaves the resident set (evictable).
                    run.admission.finish(info)
            value = spec.result(final) if spec.result is not None else final
        except GraphBubbleUp:
            raise
        except Exception as exc:
            err = SiblingError.from_exception(exc, index=index, item=item)
            run.done += 1
            run.failed += 1
            # The exception's message may quote anything (a URL with credentials,
            # a tool's input): the log names the type only; the SiblingError
            # in the results carries the message.
            logger.warning(
                "fan_out %s: sibling %d failed: %s (retryable: %s); its SiblingError "
                "holds the message",
                run.node,
                index,
                err.error_type,
                err.retryable,
                extra={
                    "lgb_group": run.group,
                    "lgb_index": index,
                    "lgb_error_type": err.error_type,
                    "lgb_retryable": err.retryable,
                },
            )
            run.emit(
                "sibling_failed",
                index=index,
                error_type=err.error_type,
                message=err.message,
                retryable=err.retryable,
            )
            return {"results": [[index, _ERR, err.to_dict()]]}
        run.done += 1
        run.emit("sibling_finished", index=index, turns=info.turn)
        return {"results": [[index, _OK, value]]}

    builder = StateGraph(_InnerState)
    # The typed overloads do not cover async (state, config) functions.
    builder.add_node("sibling", sibling)  # type: ignore[call-overload]
    builder.add_conditional_edges(START, dispatch, ["sibling"])
    return builder.compile(name=f"{getattr(subgraph, 'name', None) or 'fan_out'}_siblings")


def fan_out(
    subgraph: Any,
    *,
    items: str | Callable[[Any], Sequence[Any]],
    into: str,
    make_input: Callable[[Any, int], Any] | None = None,
    result: Callable[[Any], Any] | None = None,
    on_error: Literal["collect", "raise"] = "collect",
    max_active: int | None = None,
    scheduler: Any = None,
    name: str | None = None,
    sibling_tokens: int = DEFAULT_SIBLING_TOKENS,
    kv_headroom: float = DEFAULT_KV_HEADROOM,
) -> FanOutNode:
    """A node that runs `subgraph` once per item, concurrently, and collects the results.

    Each sibling is its own LangGraph task with its own checkpoint namespace
    (resumable), runs with its identity in context (`current_sibling()`), so
    `BatchedChatModel` and the tool hooks can prioritise and coalesce, and
    fails alone: with `on_error="collect"` a sibling that raises becomes a
    `SiblingError` in its place. Progress events go to the custom stream.

    Args:
        subgraph: any compiled graph (a `create_agent` / `create_react_agent`
            agent, a compiled `StateGraph`, another graph with a `fan_out`),
            or any Runnable with `ainvoke`.
        items: the state key holding the items, or `callable(state) -> sequence`.
        into: the state key that receives the list of results, in input order.
            Give it no reducer (or one that accepts a list) in the parent state.
        make_input: `(item, index) -> sibling input`; default: the item itself,
            which must then be a mapping.
        result: `final_sibling_state -> value` to collect; default: the final state.
        on_error: `"collect"` (a `SiblingError` takes the failed sibling's
            place) or `"raise"` (`SiblingFailedError` once every sibling has
            finished, with all errors attached). A failed sibling counts as
            finished: resuming the thread does not run it again.
        max_active: most siblings ACTIVE (not waiting, not in a tool) at once.
            Default: the server's KV capacity (`scheduler.latest_metrics.
            kv_capacity_tokens`) divided by the estimated sibling context
            (`sibling_tokens`, then learned from finished siblings), or no
            cap when the capacity is unknown. With a known capacity, fresh
            siblings are also admitted only while the resident siblings'
            (active or in a tool, whose KV stays cached) estimated tokens fit
            `kv_capacity * kv_headroom`; siblings back from a tool are not
            held back by that budget.
        scheduler: the `Scheduler` (or its registry name) the siblings' models
            use: the source of KV capacity and of the stats in progress events.
        name: the node's name (default `fan_out[<subgraph name>]`).
        sibling_tokens: estimated KV tokens of one sibling's context, used
            until finished siblings teach the gate a measured one.
        kv_headroom: share of the KV capacity the resident siblings may fill.

    Returns:
        A `FanOutNode` to add with `builder.add_node("name", node)`.

    Raises:
        TypeError: if `subgraph` cannot be invoked asynchronously, `items` is
            neither a key nor a callable, `make_input`/`result` is not
            callable, or `scheduler` is not a Scheduler or a name.
        ValueError: for a bad `into`, `on_error`, `max_active`, `name`,
            `sibling_tokens` or `kv_headroom`.

    At run time, items that are not a list or tuple (a set has no input
    order; a generator or a mapping is not a sequence) raise `TypeError`.
    Every failed sibling is logged at WARNING (its index and error type,
    never the message, which may quote secrets).

    Example:
        ```python
        agent = create_agent(BatchedChatModel(base_url=url), tools=[search])
        builder.add_node(
            "review",
            fan_out(
                agent,
                items="documents",
                into="reviews",
                make_input=lambda doc, i: {"messages": [("user", doc)]},
                result=lambda final: final["messages"][-1].content,
            ),
        )
        ```
    """
    return FanOutNode(
        subgraph,
        items=items,
        into=into,
        make_input=make_input,
        result=result,
        on_error=on_error,
        max_active=max_active,
        scheduler=scheduler,
        name=name,
        sibling_tokens=sibling_tokens,
        kv_headroom=kv_headroom,
    )
