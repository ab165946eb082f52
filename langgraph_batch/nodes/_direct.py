"""Calling a sibling's function without LangChain's per-call `RunnableLambda` work.

`RunnableLambda.ainvoke` inspects the function's signature (four times), opens
a traced child run and starts a task for every call. A fan_out of 64 siblings
pays that twice per sibling (the inner graph's `sibling` node, and a user's
function), ~0.4 ms each on the 2-core benchmark machine, all of it before the
sibling's first model call: in a harness of W9's graph, a tick's first model
call came ~95 ms after the last answer with it and ~28 ms without
(`benchmarks/results/experiments/long_horizon_policies.md`).

`DirectLambda` is a `RunnableLambda` (LangGraph's xray still finds graphs among
its function's nonlocals) whose `invoke`/`ainvoke` call the function directly,
as LangGraph calls a plain function node: its signature is read once, and the
task's own run (LangGraph traces every task) is the run its calls belong to.
`as_sibling_runnable` wraps a user's plain function this way, so `fan_out`
takes the function a `Send` would have targeted.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.runnables.config import (
    ensure_config,
    run_in_executor,
    var_child_runnable_config,
)
from langchain_core.runnables.utils import is_async_callable

__all__ = ("DirectLambda", "as_sibling_runnable")


class DirectLambda(RunnableLambda[Any, Any]):
    """A `RunnableLambda` called directly: `f(input)` or `f(input, config)`, untraced.

    The function takes `config` when its signature names it (read once). An
    async call of a sync-only function runs it in a thread with the caller's
    context (`langchain_core`'s `run_in_executor`, as `RunnableLambda` does);
    `invoke` of an async-only one raises `TypeError`
    ("No synchronous function provided", as `RunnableLambda`). The call sees
    its config as the current one (`langchain_core`'s `ensure_config()`,
    LangGraph's `get_config()`).
    """

    def __init__(
        self,
        func: Callable[..., Any] | None = None,
        afunc: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
    ) -> None:
        """Wrap `func` (sync), `afunc` (async), or both; see `RunnableLambda`."""
        if func is None and afunc is None:
            raise TypeError("DirectLambda needs a function")
        if func is not None and is_async_callable(func):  # async def, or async __call__
            func, afunc = None, func
        if func is not None:
            super().__init__(func, afunc=afunc, name=name)
        else:
            super().__init__(afunc, name=name)  # type: ignore[arg-type]
        self._sync = func
        self._async = afunc
        target = func or afunc
        try:
            params = inspect.signature(target).parameters  # type: ignore[arg-type]
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        self._takes_config = "config" in params

    def _args(self, input: Any, config: RunnableConfig) -> tuple[Any, ...]:
        return (input, config) if self._takes_config else (input,)

    def invoke(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Any:
        if self._sync is None:
            raise TypeError(
                f'No synchronous function provided to "{self.name}".\n'
                "Either initialize with a synchronous function or invoke via the async API"
            )
        config = ensure_config(config)
        token = var_child_runnable_config.set(config)
        try:
            return self._sync(*self._args(input, config))
        finally:
            var_child_runnable_config.reset(token)

    async def ainvoke(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Any:
        config = ensure_config(config)
        if self._async is None:
            # In a thread, with this context (the sibling's identity, the run's config).
            return await run_in_executor(None, self.invoke, input, config)
        token = var_child_runnable_config.set(config)
        try:
            return await self._async(*self._args(input, config))
        finally:
            var_child_runnable_config.reset(token)


def as_sibling_runnable(subgraph: Any) -> Any:
    """`subgraph` as fan_out runs it: a Runnable as given, a plain function as a `DirectLambda`.

    Any object with `ainvoke` (a compiled graph, a Runnable) is returned
    unchanged. A plain function, sync or async, taking the sibling's input
    (and `config`, when its signature names it) becomes a `DirectLambda`
    named after it. Anything else is returned unchanged for `FanOutSpec` to
    refuse.
    """
    if callable(getattr(subgraph, "ainvoke", None)) or not callable(subgraph):
        return subgraph
    name = getattr(subgraph, "__name__", None)
    return DirectLambda(subgraph, name=name if name and name != "<lambda>" else None)
