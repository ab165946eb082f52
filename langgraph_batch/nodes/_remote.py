"""fan_out with an executor: the siblings run elsewhere, the parent keeps the semantics.

`fan_out(..., executor=...)` hands the whole run to an object that follows
the `SiblingExecutor` protocol (`langgraph_batch.distributed.RedisExecutor`
runs the siblings on worker processes through Redis). What stays in the
parent, so that results look exactly as in-process ones:

- `make_input(item, index)` runs here; a sibling whose `make_input` raises
  fails alone and is never sent;
- `result(final_state)` runs here on the final state the executor returns;
- results come back in input order, failures as `SiblingError` records,
  and progress events (`sibling_started`, `sibling_finished`,
  `sibling_failed`, done/total) are written as the executor reports them.

This module depends on nothing but the protocol: `fan_out` passes in its run
(progress) and how to describe an error.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from langchain_core.runnables import RunnableConfig

__all__ = ("RemoteEvent", "SiblingExecutor", "run_remote")

logger = logging.getLogger("langgraph_batch.nodes.fan_out")


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteEvent:
    """One thing an executor reports about one sibling."""

    index: int
    """The sibling's position in the input list."""
    kind: Literal["started", "finished", "failed"]
    """`started` (a worker took it), `finished` (with its final state) or `failed`."""
    value: Any = None
    """`finished`: the final state; `failed`: a `SiblingError.to_dict()` mapping."""


@runtime_checkable
class SiblingExecutor(Protocol):
    """Runs a fan_out's siblings somewhere else and reports as they progress.

    `run` is an async generator: it yields `RemoteEvent`s, exactly one
    `finished` or `failed` per input (a `started` before it is optional),
    and returns once every input has an outcome. Closing or cancelling it
    cancels the siblings still running.
    """

    def run(
        self,
        subgraph: Any,
        inputs: Sequence[tuple[int, Any]],
        *,
        total: int,
        config: RunnableConfig,
    ) -> AsyncIterator[RemoteEvent]:
        """Run `subgraph` on each `(index, input)`; `total` counts every sibling of the run."""
        ...


class _RunProgress(Protocol):
    """What a remote executor reports into: the fan_out run's counts and events."""

    node: str
    group: str

    def count_started(self) -> None: ...

    def count_done(self, *, failed: bool) -> None: ...

    def emit(self, event: str, **fields: Any) -> None: ...


ErrorRecord = Callable[[BaseException, int, Any], dict[str, Any]]
"""`(exception, index, item) -> SiblingError.to_dict()`."""


async def run_remote(
    executor: SiblingExecutor,
    subgraph: Any,
    items: Sequence[Any],
    run: _RunProgress,
    config: RunnableConfig,
    *,
    make_input: Callable[[Any, int], Any],
    result: Callable[[Any], Any] | None,
    error_record: ErrorRecord,
) -> list[list[Any]]:
    """Run every sibling through `executor`; return fan_out's records (`[index, kind, value]`).

    Args:
        executor: Where the siblings run.
        subgraph: The graph each sibling runs (the executor may use it to
            check inputs or decode states; it names the graph workers import).
        items: The items, one sibling each.
        run: fan_out's live run (counters and progress events).
        config: The fan_out node's config.
        make_input: `(item, index) -> sibling input`.
        result: `final_state -> value`, or None to keep the final state.
        error_record: Describes an exception as a `SiblingError` dict.

    Returns:
        One `[index, "ok", value]` or `[index, "error", {...}]` record per item.
    """
    records: dict[int, list[Any]] = {}

    def fail(index: int, value: dict[str, Any]) -> None:
        value = {**value, "index": index, "item": items[index]}
        records[index] = [index, "error", value]
        run.count_done(failed=True)
        error_type, retryable = value.get("error_type"), bool(value.get("retryable", False))
        # As in-process: the type only, never the message (it may quote secrets).
        logger.warning(
            "fan_out %s: sibling %d failed: %s (retryable: %s); its SiblingError holds the message",
            run.node,
            index,
            error_type,
            retryable,
            extra={
                "lgb_group": run.group,
                "lgb_index": index,
                "lgb_error_type": error_type,
                "lgb_retryable": retryable,
            },
        )
        run.emit(
            "sibling_failed",
            index=index,
            error_type=error_type,
            message=value.get("message"),
            retryable=retryable,
        )

    inputs: list[tuple[int, Any]] = []
    for index, item in enumerate(items):
        try:
            inputs.append((index, make_input(item, index)))
        except Exception as exc:
            fail(index, error_record(exc, index, item))
    if not inputs:
        return list(records.values())
    started: set[int] = set()
    events = executor.run(subgraph, inputs, total=len(items), config=config)
    async with contextlib.aclosing(events):  # type: ignore[type-var]
        async for event in events:
            index = event.index
            if not 0 <= index < len(items) or index in records:
                continue
            if event.kind == "started":
                if index not in started:
                    started.add(index)
                    run.count_started()
                    run.emit("sibling_started", index=index)
            elif event.kind == "failed":
                fail(index, dict(event.value or {}))
            else:
                try:
                    value = result(event.value) if result is not None else event.value
                except Exception as exc:
                    fail(index, error_record(exc, index, items[index]))
                    continue
                records[index] = [index, "ok", value]
                run.count_done(failed=False)
                run.emit("sibling_finished", index=index)
    return list(records.values())
