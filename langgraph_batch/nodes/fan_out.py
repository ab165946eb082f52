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
- Sync graphs: the run (gate, progress) lives on the background loop of
  `langgraph_batch._loop`. The inner graph runs there with `ainvoke` when
  the checkpointer has an async API; a sync-only one (`SqliteSaver`) raises
  `NotImplementedError` when the inner graph reads its checkpoint, before
  any sibling starts, and the inner graph then runs here with `invoke`: the
  sibling node has a sync twin that calls `subgraph.invoke` in its thread.

Modules: `_spec` (`FanOutSpec`: every option named, typed, defaulted and
checked once; pure data), `_run` (a run's live state, how it opens and
closes: its items, its scheduler, the server's KV ledger and the gate's
sizing), `_admission` (the gate); this one builds the node and the siblings.

Records travel through the private `results` channel as plain lists and are
collected in input order by `_results` (which also owns `SiblingError`).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.runnables.config import merge_configs
from langgraph.errors import GraphBubbleUp
from langgraph.graph import START, StateGraph
from langgraph.types import Send
from typing_extensions import TypedDict

from langgraph_batch._context import SiblingInfo, current_sibling, sibling_scope
from langgraph_batch._estimates import KV_HEADROOM
from langgraph_batch._loop import background_loop
from langgraph_batch.nodes._admission import SiblingAdmission
from langgraph_batch.nodes._direct import DirectLambda, as_sibling_runnable
from langgraph_batch.nodes._remote import SiblingExecutor, run_remote
from langgraph_batch.nodes._results import ERR, OK, SiblingError, collect_results
from langgraph_batch.nodes._run import (
    RUN_KEY,
    FanOutRun,
    child_config,
    close_empty,
    close_run,
    open_run,
    thread_config,
)
from langgraph_batch.nodes._spec import DEFAULT_SIBLING_TOKENS, FanOutSpec
from langgraph_batch.pricing import CostMeter, PriceTable

__all__ = (
    "DEFAULT_SIBLING_TOKENS",
    "FanOutNode",
    "SiblingError",
    "SyncUnsupportedError",
    "fan_out",
)

logger = logging.getLogger(__name__)


class _SiblingPayload(TypedDict):
    index: int
    item: Any


class _InnerState(TypedDict, total=False):
    items: list[Any]
    results: Annotated[list[list[Any]], operator.add]


def _default_input(item: Any, index: int) -> Any:
    return item


class FanOutNode(RunnableLambda[Any, dict[str, Any]]):
    """The node `fan_out` returns: add it with `StateGraph.add_node(name, node)`.

    Runs in async graphs (`ainvoke`, `astream`) and sync ones (`invoke`,
    `stream`). In a sync graph the run lives on langgraph-batch's background
    event loop (where sync model calls meet their scheduler); with a
    checkpointer that has no async API (`SqliteSaver`) the siblings then run
    with `subgraph.invoke`, one thread each (at most the config's
    `max_concurrency`, default min(N, 128)), and a sibling subgraph with
    async-only nodes raises `SyncUnsupportedError` at the first call.

    Attributes:
        spec: the node's options, a frozen `FanOutSpec` (what `fan_out` built).
        subgraph: the compiled graph each sibling runs.
        graph: the inner graph (dispatch via `Send`, one task per sibling).
    """

    def __init__(
        self, subgraph: Any = None, *, spec: FanOutSpec | None = None, **options: Any
    ) -> None:
        """Build the node from `subgraph` and `fan_out`'s options, or from a `spec`.

        Args:
            subgraph: the graph each sibling runs (see `fan_out`).
            spec: the options already built and checked (what `fan_out` passes);
                not with `subgraph` or other options.
            **options: `fan_out`'s keyword options (`items`, `into`, ...), checked
                as `fan_out` checks them.

        Raises:
            TypeError: both `spec` and options; else as `fan_out`.
            ValueError: as `fan_out`.
        """
        if spec is None:
            spec = FanOutSpec(subgraph=as_sibling_runnable(subgraph), **options)
        elif subgraph is not None or options:
            raise TypeError("FanOutNode takes a spec or a subgraph and its options, not both")
        self.spec = spec
        self.subgraph = spec.subgraph
        self.graph = _build_inner(spec, spec.subgraph)
        sync_runner, async_runner = _build_runner(spec, self.graph)
        super().__init__(sync_runner, afunc=async_runner, name=spec.node_name)

    @property
    def into(self) -> str:
        """The state key that receives the results."""
        return self.spec.into

    def __repr__(self) -> str:
        sub = getattr(self.subgraph, "name", None) or type(self.subgraph).__name__
        return f"FanOutNode(name={self.name!r}, subgraph={sub!r}, into={self.spec.into!r})"


def _build_runner(
    spec: FanOutSpec, inner: Any
) -> tuple[Callable[..., dict[str, Any]], Callable[..., Any]]:
    """The parent-graph node functions, sync and async.

    Both are closures that name `inner`: xray finds the sibling subgraph by
    reading the node function's closure.
    """

    async def run_fan_out(state: Any, config: RunnableConfig) -> dict[str, Any]:
        run = await open_run(spec, state, config)
        try:
            if not run.total:
                return close_empty(spec, run)
            try:
                if spec.executor is not None:
                    out = await _run_remote(spec, run, config)
                else:
                    lent = _lend_parent(current_sibling())
                    try:
                        out = await inner.ainvoke({"items": run.items}, child_config(run, config))
                    except Exception:
                        await _take_back(lent)
                        raise
                    await _take_back(lent)
            finally:
                close_run(run)
            return collect_results(spec, run, out)
        finally:
            await run.flush_events()

    def run_fan_out_sync(state: Any, config: RunnableConfig) -> dict[str, Any]:
        # Sync graphs (`graph.invoke`) run nodes in threads. The run's gate and
        # the siblings' model calls live on the shared background loop, where
        # the sync model calls meet their scheduler. The inner graph runs there
        # too when the checkpointer has an async API (InMemorySaver,
        # AsyncSqliteSaver, none); a sync-only one (SqliteSaver) makes it run
        # here, with `invoke`, one thread per running sibling.
        loop = background_loop()
        run = loop.run(open_run(spec, state, config))
        try:
            if not run.total:
                return close_empty(spec, run)
            child = child_config(run, config)
            try:
                if spec.executor is not None:
                    out = loop.run(_run_remote(spec, run, config))
                    return collect_results(spec, run, out)
                lent = loop.call(_lend_parent, current_sibling())
                try:
                    try:
                        out = loop.run(inner.ainvoke({"items": run.items}, child))
                    except NotImplementedError:
                        # Raised by the checkpointer before any sibling started (the
                        # inner graph reads its checkpoint first): nothing ran yet.
                        if run.started:
                            raise
                        logger.debug(
                            "fan_out %s: sync-only checkpointer, threads run siblings", run.node
                        )
                        run.threads = True
                        out = inner.invoke({"items": run.items}, thread_config(run, child))
                except Exception:
                    loop.run(_take_back(lent))
                    raise
                loop.run(_take_back(lent))
            finally:
                close_run(run, loop=loop)
            return collect_results(spec, run, out)
        finally:
            loop.run(run.flush_events())

    return run_fan_out_sync, run_fan_out


def _lend_parent(parent: SiblingInfo | None) -> tuple[SiblingInfo, SiblingAdmission] | None:
    """A run nested in a fan_out sibling (`parent`) takes over its place and KV booking.

    The parent waits on this run's siblings: holding its booking while they
    wait for room would deadlock once the outer bookings fill the budget
    (`SiblingAdmission.lend`). Returns the parent and the gate it must ask
    for its place again when this run is over (None: it held none, or this
    run is not nested). Called in the gate's loop.
    """
    gate = parent.admission if parent is not None else None
    if parent is None or not isinstance(gate, SiblingAdmission) or not gate.lend(parent):
        return None
    return parent, gate


async def _take_back(lent: tuple[SiblingInfo, SiblingAdmission] | None) -> None:
    """The nested run is over: its parent asks for its place again (ahead of fresh siblings)."""
    if lent is not None:
        parent, gate = lent
        await gate.acquire(parent, returning=True)


async def _run_remote(spec: FanOutSpec, run: FanOutRun, config: RunnableConfig) -> dict[str, Any]:
    """The siblings on `spec.executor` (see `_remote`): same records as the inner graph's."""
    assert spec.executor is not None  # only called for a spec with an executor
    result = spec.result
    if run.meter is not None:
        # The model calls ran elsewhere: count the answers in the final states.
        result = _metered(run.meter, spec.result, batch=getattr(spec.executor, "batch_api", False))
    records = await run_remote(
        spec.executor,
        spec.subgraph,
        run.items,
        run,
        config,
        make_input=spec.make_input or _default_input,
        result=result,
        error_record=lambda exc, i, item: SiblingError.from_exception(
            exc, index=i, item=item
        ).to_dict(),
    )
    return {"results": records}


def _metered(
    meter: CostMeter, result: Callable[[Any], Any] | None, *, batch: bool
) -> Callable[[Any], Any]:
    """`result`, counting first the usage of the answers in a final state (or an answer).

    A provider batch (`batch`) answers once, last: the messages before it are the
    sibling's input (few-shot answers included) and cost nothing here.
    """

    def count(final: Any) -> Any:
        messages = final.get("messages") if isinstance(final, dict) else [final]
        messages = messages if isinstance(messages, list) else []
        for message in messages[-1:] if batch else messages:
            if getattr(message, "type", None) == "ai":
                meter.add_message(message, batch=batch)
        return result(final) if result is not None else final

    return count


class SyncUnsupportedError(TypeError):
    """The sibling subgraph cannot run synchronously where fan_out must run it so.

    A sync graph (`graph.invoke`) whose checkpointer has no async API
    (`SqliteSaver`) runs its siblings with `subgraph.invoke`; a subgraph with
    async-only nodes cannot. Use `await graph.ainvoke(...)` with an async
    checkpointer (`AsyncSqliteSaver`), or give those nodes sync functions.

    Raised for the whole fan_out (not one sibling's `SiblingError`): every
    sibling would fail the same way.
    """


def _build_inner(spec: FanOutSpec, subgraph: Any) -> Any:
    """The inner graph: one Send task per item, each running `subgraph` (a closure variable)."""

    def dispatch(state: _InnerState) -> list[Send]:
        return [
            Send("sibling", _SiblingPayload(index=i, item=item))
            for i, item in enumerate(state.get("items") or [])
        ]

    async def sibling(payload: _SiblingPayload, config: RunnableConfig) -> dict[str, Any]:
        run, info, child = _sibling_setup(payload, config)
        index, item = payload["index"], payload["item"]
        try:
            sibling_input = (spec.make_input or _default_input)(item, index)
            with sibling_scope(info):
                run.count_started()
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
            return _sibling_failed(run, index, item, exc)
        return _sibling_finished(run, info, value)

    def sibling_sync(payload: _SiblingPayload, config: RunnableConfig) -> dict[str, Any]:
        # Only when the parent graph runs synchronously with a sync-only
        # checkpointer (see run_fan_out_sync): this thread is the sibling's.
        run, info, child = _sibling_setup(payload, config)
        index, item = payload["index"], payload["item"]
        loop = background_loop()
        try:
            sibling_input = (spec.make_input or _default_input)(item, index)
            with sibling_scope(info):
                run.count_started()
                loop.run(run.admission.acquire(info, returning=False))
                try:
                    run.emit("sibling_started", index=index)
                    final = subgraph.invoke(sibling_input, child)
                finally:
                    loop.call(run.admission.finish, info)
            value = spec.result(final) if spec.result is not None else final
        except GraphBubbleUp:
            raise
        except TypeError as exc:
            if str(exc).startswith("No synchronous function provided"):
                raise SyncUnsupportedError(
                    f"fan_out {spec.node_name!r}: the graph runs synchronously (graph.invoke) with "
                    f"a checkpointer that has no async API, so siblings run with "
                    f"subgraph.invoke, but the sibling subgraph has async-only nodes ({exc}). "
                    f"Use the async API (await graph.ainvoke(...), with AsyncSqliteSaver "
                    f"instead of SqliteSaver), or give those nodes sync functions."
                ) from None
            return _sibling_failed(run, index, item, exc)
        except Exception as exc:
            return _sibling_failed(run, index, item, exc)
        return _sibling_finished(run, info, value)

    builder = StateGraph(_InnerState)
    # Called directly (`_direct`): RunnableLambda's per-call work delays every
    # sibling's first model call; the task's own run is the sibling's trace.
    builder.add_node("sibling", DirectLambda(sibling_sync, afunc=sibling, name="sibling"))
    builder.add_conditional_edges(START, dispatch, ["sibling"])
    return builder.compile(name=f"{getattr(subgraph, 'name', None) or 'fan_out'}_siblings")


def _sibling_setup(
    payload: _SiblingPayload, config: RunnableConfig
) -> tuple[FanOutRun, SiblingInfo, RunnableConfig]:
    run: FanOutRun = (config.get("configurable") or {})[RUN_KEY]
    index = payload["index"]
    info = SiblingInfo(
        group=run.group,
        index=index,
        total=run.total,
        admission=run.admission,
        run_id=run.run_id,
        left=run.left,
        expected_wait=run.admission.forecast.expected_wait,
    )
    child = merge_configs(
        config,
        {
            "configurable": {"lgb_sibling_group": run.group, "lgb_sibling_index": index},
            "metadata": {"lgb_sibling_group": run.group, "lgb_sibling_index": index},
        },
    )
    return run, info, child


def _sibling_failed(run: FanOutRun, index: int, item: Any, exc: Exception) -> dict[str, Any]:
    err = SiblingError.from_exception(exc, index=index, item=item)
    run.count_done(failed=True)
    # The exception's message may quote anything (a URL with credentials, a
    # tool's input): the log names the type only; the SiblingError in the
    # results carries the message.
    logger.warning(
        "fan_out %s: sibling %d failed: %s (retryable: %s); its SiblingError holds the message",
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
    return {"results": [[index, ERR, err.to_dict()]]}


def _sibling_finished(run: FanOutRun, info: SiblingInfo, value: Any) -> dict[str, Any]:
    run.count_done(failed=False)
    run.emit("sibling_finished", index=info.index, turns=info.turn)
    return {"results": [[info.index, OK, value]]}


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
    kv_headroom: float = KV_HEADROOM,
    executor: SiblingExecutor | None = None,
    prices: PriceTable | None = None,
    cost_into: str | None = None,
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
            any Runnable with `ainvoke`, or a plain function, async or sync,
            taking the sibling's input (and `config`, when it names it), as a
            `Send` target would: it is called directly, without
            `RunnableLambda`'s per-call work.
        items: the state key holding the items, or `callable(state) -> sequence`.
        into: the state key that receives the list of results, in input order.
            Give it no reducer (or one that accepts a list) in the parent state.
        make_input: `(item, index) -> sibling input`; default: the item itself,
            which must then be a mapping (any item, for a plain function).
        result: `final_sibling_state -> value` to collect; default: the final state.
        on_error: `"collect"` (a `SiblingError` takes the failed sibling's
            place) or `"raise"` (`SiblingFailedError` once every sibling has
            finished, with all errors attached). A failed sibling counts as
            finished: resuming the thread does not run it again.
        max_active: most siblings ACTIVE (not waiting, not in a tool) at once
            (default: no cap; the scheduler's decode cap bounds what runs on
            the engine). With a known KV capacity (`Scheduler.kv_capacity()`,
            from the server's metrics) the run admits whole siblings by KV:
            every started sibling books its context plus one turn's growth
            (learned from the run), tool waits included, and a fresh one
            starts only while that fits `kv_capacity * kv_headroom` beside
            everything booked on the server. When contexts outgrow it, the
            siblings waiting on tools give up their bookings (long waits
            first, then the latest started) and resume, before fresh ones,
            when room is back. Siblings back from a tool with their booking
            are never held back by the budget.
        scheduler: the `Scheduler` (or its registry name) the siblings' models
            use: the source of KV capacity and of the stats in progress events.
        name: the node's name (default `fan_out[<subgraph name>]`).
        sibling_tokens: estimated KV tokens of one sibling's first call (its
            prompt and answer), used until the run's first calls teach the
            gate a measured one.
        kv_headroom: share of the KV capacity the resident siblings may fill.
        executor: run the siblings elsewhere (None: in this process), e.g.
            `langgraph_batch.distributed.RedisExecutor` on `langgraph-batch
            worker` processes. `make_input`, `result`, input order, `on_error`
            and progress events are as in-process; `max_active`, `scheduler`
            and the KV options are the workers' (`--concurrency`).
            `langgraph_batch.batch_api.ProviderBatch` sends single-call siblings
            through a provider's batch API (half price, answers within hours).
        prices: a `langgraph_batch.pricing.PriceTable`: the run counts every
            model call's usage (cache reads and writes apart) and prices it;
            every progress event carries the running summary as `cost`.
        cost_into: the state key that receives the run's summary
            (`{"usage": {...}, "cost": {...} | None, "unpriced_models": [...]}`);
            without `prices` it holds the token counts only. Declare it in the
            parent state. A resumed run counts the calls it made itself.

    Returns:
        A `FanOutNode` to add with `builder.add_node("name", node)`.

    Raises:
        TypeError: if `subgraph` is neither a Runnable nor a function, `items` is
            neither a key nor a callable, `make_input`/`result` is not
            callable, or `scheduler` is not a Scheduler or a name.
        ValueError: for a bad `into`, `on_error`, `max_active`, `name`,
            `sibling_tokens` or `kv_headroom`.
        TypeError: for an `executor` without a `run` method.

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
        spec=FanOutSpec(
            subgraph=as_sibling_runnable(subgraph),
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
            executor=executor,
            prices=prices,
            cost_into=cost_into,
        )
    )
