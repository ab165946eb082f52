"""At-most-once tools: a call a sibling made is never made again when the sibling runs again.

A distributed fan_out runs a sibling again when its worker or node dies
(at-least-once: nothing is lost). For most tools that is harmless; for one
with an effect outside (a payment, an email, a ticket) it is not. A tool
marked with `at_most_once(tool)` records each call before it runs, in a
store every host of the run reaches (in memory in one process; the run's
Redis keys under `RedisExecutor`; the cluster's ledger actor under
`RayExecutor`), and when the sibling runs again, the same call:

- returns the recorded result, if the earlier attempt finished it (the
  result survives JSON), without running the tool;
- raises `ToolAlreadyRanError` otherwise: the earlier attempt died while the
  tool ran (`outcome="unknown"`: it may or may not have taken effect), the
  tool failed then (`"failed"`), or its result is not JSON (`"unreplayable"`).

"The same call" is the sibling's `n`-th call of that tool with those
arguments (canonical JSON), so a sibling that replays its conversation
meets its earlier calls in order, and two identical calls in one attempt
are two calls. Outside a fan_out (no sibling), the tool just runs: nothing
can run it again. Records are kept per run, until the run ends
(`forget_run`) or for the store's time to live.

The store is a process setting (`set_once_store`), installed by the
distributed hosts for the runs they serve; `OnceStore` is its protocol.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from typing import Any, Protocol

from langchain_core.tools import BaseTool, StructuredTool

from langgraph_batch._context import SiblingInfo, current_sibling
from langgraph_batch.errors import ToolAlreadyRanError
from langgraph_batch.tools._coalesce import _config_params, _fields

__all__ = ("MemoryOnceStore", "OnceStore", "at_most_once", "forget_once", "set_once_store")

logger = logging.getLogger("langgraph_batch.tools")

ONCE_RUN = "run"
"""`OnceStore.claim`: this attempt holds the call now; run the tool, then `settle`."""
ONCE_DONE = "done"
"""`OnceStore.claim`: an earlier attempt finished the call; its record comes along."""
ONCE_TAKEN = "taken"
"""`OnceStore.claim`: an earlier attempt took the call and never settled it."""


class OnceStore(Protocol):
    """Where `at_most_once` calls are recorded, reachable from every host of a run."""

    async def claim(self, run: str, key: str, attempt: str) -> tuple[str, str | None]:
        """Take call `key` of `run` for `attempt`: `(ONCE_RUN|ONCE_TAKEN, None)`, `(ONCE_DONE, r)`.

        Atomic: of two attempts that claim the same call, one gets `ONCE_RUN`.
        The attempt that holds the call gets `ONCE_RUN` again if it asks again.
        """
        ...

    async def settle(self, run: str, key: str, record: str) -> None:
        """Record how call `key` of `run` ended (a JSON record, see `_record`)."""
        ...

    def forget(self, run: str) -> None:
        """Drop the records of `run` (it ended); a remote store may keep them to their expiry."""
        ...


class MemoryOnceStore:
    """An `OnceStore` in this process: for a fan_out whose siblings all run here.

    Keeps the records of the `max_runs` most recently used runs.
    """

    def __init__(self, max_runs: int = 256) -> None:
        self.max_runs = max_runs
        self._runs: OrderedDict[str, dict[str, tuple[str, str | None]]] = OrderedDict()

    def __repr__(self) -> str:
        return f"MemoryOnceStore(runs={len(self._runs)})"

    def _run(self, run: str) -> dict[str, tuple[str, str | None]]:
        calls = self._runs.get(run)
        if calls is None:
            calls = self._runs[run] = {}
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)
        self._runs.move_to_end(run)
        return calls

    async def claim(self, run: str, key: str, attempt: str) -> tuple[str, str | None]:
        return self.take(run, key, attempt)

    async def settle(self, run: str, key: str, record: str) -> None:
        self.keep(run, key, record)

    def take(self, run: str, key: str, attempt: str) -> tuple[str, str | None]:
        """`claim`, synchronously."""
        calls = self._run(run)
        held = calls.get(key)
        if held is None:
            calls[key] = (attempt, None)
            return ONCE_RUN, None
        holder, record = held
        if record is not None:
            return ONCE_DONE, record
        return (ONCE_RUN, None) if holder == attempt else (ONCE_TAKEN, None)

    def keep(self, run: str, key: str, record: str) -> None:
        """`settle`, synchronously."""
        calls = self._run(run)
        holder = calls.get(key, ("", None))[0]
        calls[key] = (holder, record)

    def forget(self, run: str) -> None:
        self._runs.pop(run, None)


_store: OnceStore = MemoryOnceStore()


def set_once_store(store: OnceStore | None) -> OnceStore:
    """Record `at_most_once` calls in `store` (None: this process's memory); the previous store.

    Example:
        ```python
        previous = set_once_store(RedisOnceStore(...))
        try:
            ...
        finally:
            set_once_store(previous)
        ```
    """
    global _store
    previous, _store = _store, store if store is not None else MemoryOnceStore()
    return previous


def forget_once(run: str) -> None:
    """Drop the records of the run `run` (`fan_out` calls it when a run ends)."""
    _store.forget(run)


def call_key(info: SiblingInfo, tool: str, args: dict[str, Any]) -> str:
    """`<index>:<tool>:<digest of the arguments>:<n>`, n counting this attempt's equal calls."""
    canonical = json.dumps(args, sort_keys=True, default=repr, separators=(",", ":"))
    digest = hashlib.blake2b(canonical.encode(), digest_size=12).hexdigest()
    base = f"{info.index}:{tool}:{digest}"
    n = info.calls_seen.get(base, 0)
    info.calls_seen[base] = n + 1
    return f"{base}:{n}"


def _record(kind: str, value: Any = None) -> str:
    if kind == "ok":
        try:
            return json.dumps({"k": "ok", "v": value})
        except (TypeError, ValueError):
            return json.dumps({"k": "unreplayable"})
    return json.dumps({"k": kind})


def _replay(record: str, tool: str, info: SiblingInfo) -> Any:
    data = json.loads(record)
    if data.get("k") == "ok":
        return data.get("v")
    outcome = str(data.get("k", "unknown"))
    raise ToolAlreadyRanError(
        f"tool {tool!r} already ran for sibling {info.index} in an earlier attempt "
        f"({outcome}); it is not run again",
        tool=tool,
        index=info.index,
        outcome=outcome,
    )


async def run_once(tool: BaseTool, args: dict[str, Any]) -> Any:
    """Run `tool` with `args` at most once per sibling call (see the module)."""
    info = current_sibling()
    if info is None:
        return await tool.ainvoke(args)
    run = info.run_id or info.group
    key = call_key(info, tool.name, args)
    store = _store
    state, record = await store.claim(run, key, info.attempt)
    if state == ONCE_DONE and record is not None:
        logger.info("at_most_once %r: sibling %s replays an earlier result", tool.name, info.index)
        return _replay(record, tool.name, info)
    if state != ONCE_RUN:
        logger.warning(
            "at_most_once %r: sibling %s ran it before, outcome unknown", tool.name, info.index
        )
        raise ToolAlreadyRanError(
            f"tool {tool.name!r} was started for sibling {info.index} by an earlier attempt "
            "that did not finish; it is not run again (its effect is unknown)",
            tool=tool.name,
            index=info.index,
            outcome="unknown",
        )
    try:
        result = await tool.ainvoke(args)
    except BaseException as exc:
        if not isinstance(exc, Exception):
            raise  # cancelled: the call stays taken, its outcome unknown
        await store.settle(run, key, _record("failed"))
        raise
    await store.settle(run, key, _record("ok", result))
    return result


def _injected(tool: BaseTool) -> list[str]:
    """The tool's inputs the model does not give (injected ones, a `RunnableConfig`)."""
    found = set(_config_params(tool))
    try:
        schema, shown = tool.get_input_schema(), tool.tool_call_schema
    except Exception:  # a tool with a JSON-schema dict: nothing can be injected
        return sorted(found)
    if not isinstance(shown, dict):
        found |= set(_fields(schema)) - set(_fields(shown))
    return sorted(found)


def at_most_once(tool: BaseTool) -> BaseTool:
    """Mark a tool whose calls a sibling that runs again must not make again.

    Returns a tool with the same name, description and arguments, which
    records each call before running it (see the module for what a second
    attempt gets). Use it for tools with effects outside: payments, emails,
    tickets, writes. A tool with injected arguments (`InjectedState`,
    `ToolRuntime`, ...) is refused: the wrapper passes only the model's
    arguments.

    Example:
        ```python
        from langchain_core.tools import tool
        from langgraph_batch.tools import BatchToolNode, at_most_once

        @tool
        async def refund(order_id: str) -> str:
            \"\"\"Refund an order.\"\"\"
            return await payments.refund(order_id)

        tools = BatchToolNode([at_most_once(refund)])
        ```

    Raises:
        TypeError: `tool` is not a LangChain tool, or it takes injected arguments.
    """
    if not isinstance(tool, BaseTool):
        raise TypeError(f"at_most_once takes a LangChain tool, got {type(tool).__name__}")
    if _injected(tool):
        raise TypeError(
            f"at_most_once: tool {tool.name!r} takes injected arguments "
            f"({', '.join(_injected(tool))}); it gets only the model's"
        )

    async def call(**kwargs: Any) -> Any:
        return await run_once(tool, kwargs)

    return StructuredTool.from_function(
        coroutine=call,
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        return_direct=tool.return_direct,
        metadata={**(tool.metadata or {}), "lgb_at_most_once": True},
    )
