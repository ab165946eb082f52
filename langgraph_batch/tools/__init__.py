"""Tool coalescing for sibling agents: `coalesce`, `BatchToolNode`, `BatchMiddleware`.

Siblings of a fan_out often call the same tool with the same arguments (the
same search, the same lookup). A tool marked with `coalesce(tool)` runs once
for every group of identical calls, and each caller gets the result as a
`ToolMessage` carrying its own `tool_call_id`. Tools are shared only when
marked: a tool with side effects must never be.

Sharing stays within one run: a fan_out run or, outside fan_out, one
LangGraph root run (`scope="global"` is the tool author's explicit choice to
share across runs). A tool whose result depends on its caller declares what
it reads (`caller_key`) or is refused.

The hooks (`BatchToolNode` for graphs built on `ToolNode`, `BatchMiddleware`
for `langchain.agents.create_agent`) also mark the calling sibling as inside a
tool while any tool runs, which releases its admission place
(`SiblingInfo.tool_enter` / `tool_exit`), and count tool calls requested and
executed (`tool_stats`).

Coalescing and the sibling marking apply to async runs (`ainvoke`, `astream`,
which is how `fan_out` runs siblings). A synchronous `invoke` executes tools
exactly as a plain `ToolNode` would.

The subpackage, one concern per module: `_coalesce` (what is shared with
whom: `coalesce`, the policy, a frozen value, and each `coalesce()` call's
runtime, `ToolCoalescing`, which holds its coalescer; run scopes),
`_singleflight` (single flight and kept results; Redis plugs in through
`set_flight_store`), `_once` (`at_most_once` tools and where their calls
are recorded: `set_once_store`), `_hooks` (the hook both nodes compose), `_stats`
(counters), `_middleware` (`BatchMiddleware`, needs `langchain`); this
module is the public face. Imports only go from here
down to them, never back up (`tests/unit/test_module_graph.py`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import (
    AsyncToolCallWrapper,
    ToolCallRequest,
    ToolCallWrapper,
)

from langgraph_batch.tools._coalesce import CoalescePolicy, coalesce, coalesce_policy
from langgraph_batch.tools._coalesce import coalescing as coalescing
from langgraph_batch.tools._coalesce import forget_run as _forget_coalesced
from langgraph_batch.tools._hooks import Execute, ToolResult, coalesced_call, in_tool_call
from langgraph_batch.tools._once import ONCE_DONE as ONCE_DONE
from langgraph_batch.tools._once import ONCE_RUN as ONCE_RUN
from langgraph_batch.tools._once import ONCE_TAKEN as ONCE_TAKEN
from langgraph_batch.tools._once import MemoryOnceStore as MemoryOnceStore
from langgraph_batch.tools._once import OnceStore as OnceStore
from langgraph_batch.tools._once import at_most_once, forget_once
from langgraph_batch.tools._once import set_once_store as set_once_store
from langgraph_batch.tools._singleflight import set_flight_store as set_flight_store
from langgraph_batch.tools._stats import ToolStats, reset_tool_stats, tool_stats

if TYPE_CHECKING:
    from langgraph_batch.tools._middleware import BatchMiddleware

# Also importable from here, for the library's other packages (fan_out, the distributed worker)
# and the soak benchmark, and not part of `__all__` (no user API): coalescing (a coalesced
# tool's runtime: its coalescer), forget_run, set_flight_store, and for the distributed
# hosts' stores of at_most_once calls: set_once_store, OnceStore, MemoryOnceStore, ONCE_*.
__all__ = (
    "BatchMiddleware",
    "BatchToolNode",
    "CoalescePolicy",
    "ToolStats",
    "at_most_once",
    "coalesce",
    "coalesce_policy",
    "reset_tool_stats",
    "tool_stats",
)


def forget_run(run_id: str) -> None:
    """Drop what coalesced tools and `at_most_once` calls kept for the run `run_id`.

    `fan_out` and the distributed hosts call it when a run ends.

    Example:
        ```python
        forget_run(sibling.run_id)
        ```
    """
    _forget_coalesced(run_id)
    forget_once(run_id)


class _BatchToolHook:
    """ToolNode `awrap_tool_call`: in-tool marking, the user's wrapper, then coalescing."""

    def __init__(
        self,
        awrap_tool_call: AsyncToolCallWrapper | None,
        wrap_tool_call: ToolCallWrapper | None,
    ) -> None:
        self.user_awrap = awrap_tool_call
        self.user_wrap = wrap_tool_call

    async def __call__(self, request: ToolCallRequest, execute: Execute) -> ToolResult:
        async def coalesced(req: ToolCallRequest) -> ToolResult:
            return await coalesced_call(req, execute)

        return await in_tool_call(request, lambda req: self._user_layer(req, coalesced))

    async def _user_layer(self, request: ToolCallRequest, coalesced: Execute) -> ToolResult:
        if self.user_awrap is not None:
            return await self.user_awrap(request, coalesced)
        if self.user_wrap is None:
            return await coalesced(request)
        # A sync-only user wrapper: run it in a thread (ToolNode would run it on the
        # loop, blocking it) and bridge its `execute` back to the loop.
        loop = asyncio.get_running_loop()
        user_wrap = self.user_wrap
        started: list[concurrent.futures.Future[ToolResult]] = []
        gone = threading.Event()

        async def run(req: ToolCallRequest) -> ToolResult:
            return await coalesced(req)

        def sync_execute(req: ToolCallRequest) -> ToolResult:
            future = asyncio.run_coroutine_threadsafe(run(req), loop)
            started.append(future)
            # Checked after the append: a cancellation either sees this future
            # in `started` or has set `gone` before this line.
            if gone.is_set():
                future.cancel()
            return future.result()

        try:
            return await asyncio.to_thread(user_wrap, request, sync_execute)
        except asyncio.CancelledError:
            # The thread cannot be cancelled, but what it started on the loop
            # can: never let an execution outlive its cancelled caller.
            gone.set()
            for future in started:
                future.cancel()
            raise


class BatchToolNode(ToolNode):
    """A drop-in `ToolNode` that coalesces marked tools and marks siblings in-tool.

    Behaves exactly like `ToolNode` (same arguments, error handling via
    `handle_tool_errors`, `Command` results, injected state/store/runtime,
    sync tools), plus, in async runs:

    - calls of tools marked with `coalesce` are shared (see `coalesce`);
    - the calling fan_out sibling is marked as inside a tool while any tool
      runs, which releases its admission place;
    - calls are counted (`tool_stats`).

    A user `awrap_tool_call` (or sync `wrap_tool_call`) is kept: it runs
    inside the in-tool marking and around the coalesced execution, so its
    retries and argument rewrites are coalesced too.

    Example:
        ```python
        from langgraph.prebuilt import tools_condition
        from langgraph_batch.tools import BatchToolNode, coalesce

        builder.add_node("tools", BatchToolNode([coalesce(search), send_email]))
        builder.add_conditional_edges("agent", tools_condition)
        ```
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        wrap_tool_call: ToolCallWrapper | None = None,
        awrap_tool_call: AsyncToolCallWrapper | None = None,
        **kwargs: Any,
    ) -> None:
        """Create the node.

        Args:
            tools: The tools, coalesced or not.
            wrap_tool_call: Sync wrapper, as for `ToolNode` (used by sync runs
                as is; in async runs it runs in a worker thread).
            awrap_tool_call: Async wrapper, as for `ToolNode`.
            **kwargs: Any other `ToolNode` argument (`name`, `tags`,
                `handle_tool_errors`, `messages_key`).
        """
        super().__init__(
            tools,
            wrap_tool_call=wrap_tool_call,
            awrap_tool_call=_BatchToolHook(awrap_tool_call, wrap_tool_call),
            **kwargs,
        )


def __getattr__(name: str) -> Any:
    # BatchMiddleware needs the optional `langchain` package: import it on first use.
    if name == "BatchMiddleware":
        from langgraph_batch.tools._middleware import BatchMiddleware

        return BatchMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
