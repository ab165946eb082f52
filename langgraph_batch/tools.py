"""Tool coalescing for sibling agents: `coalesce`, `BatchToolNode`, `BatchMiddleware`.

Siblings of a fan_out often call the same tool with the same arguments (the
same search, the same lookup). A tool marked with `coalesce(tool)` runs once
for every group of identical calls, and each caller gets the result as a
`ToolMessage` carrying its own `tool_call_id`. Tools are shared only when
marked: a tool with side effects must never be.

The hooks (`BatchToolNode` for graphs built on `ToolNode`, `BatchMiddleware`
for `langchain.agents.create_agent`) also mark the calling sibling as inside a
tool while any tool runs, which releases its admission place
(`SiblingInfo.tool_enter` / `tool_exit`), and count tool calls requested and
executed (`tool_stats`).

Coalescing and the sibling marking apply to async runs (`ainvoke`, `astream`,
which is how `fan_out` runs siblings). A synchronous `invoke` executes tools
exactly as a plain `ToolNode` would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId
from langchain_core.tools import tool as as_tool
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import (
    AsyncToolCallWrapper,
    ToolCallRequest,
    ToolCallWrapper,
)
from langgraph.types import Command

from langgraph_batch._coalesce import Coalescer
from langgraph_batch._context import current_sibling
from langgraph_batch._tool_stats import STATS, ToolStats, reset_tool_stats, tool_stats

if TYPE_CHECKING:
    from langgraph_batch._middleware import BatchMiddleware

__all__ = (
    "BatchMiddleware",
    "BatchToolNode",
    "CoalescePolicy",
    "ToolStats",
    "coalesce",
    "coalesce_policy",
    "coalesced_call",
    "forget_run",
    "in_tool_call",
    "reset_tool_stats",
    "tool_stats",
)

logger = logging.getLogger(__name__)

METADATA_KEY = "langgraph_batch_coalesce"
"""Key of a coalesced tool's policy summary in its `metadata` (a JSON-safe dict
with the policy's `id`; metadata reaches tracers, so it holds no live objects)."""

ToolResult = ToolMessage | Command[Any]
Execute = Callable[[ToolCallRequest], Awaitable[ToolResult]]

_POLICIES: dict[str, CoalescePolicy] = {}
"""Every policy `coalesce()` made, by id (one per coalesce() call: a handful)."""


# ---------------------------------------------------------------------------------------
# The policy and `coalesce`
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class CoalescePolicy:
    """How calls of one coalesced tool are shared and limited (see `coalesce`).

    Each policy owns its runtime state (in-flight executions, stored results,
    the concurrency and rate limits), so two tools never share limits.

    Example:
        ```python
        policy = coalesce_policy(coalesce(search, ttl=300.0))
        assert policy is not None and policy.ttl == 300.0
        ```
    """

    scope: Literal["run", "inflight"] = "run"
    """`"run"`: reuse in-flight and completed results within one fan_out run;
    `"inflight"`: share only calls that overlap in time."""
    ttl: float | None = None
    """Keep successful results process-wide for this many seconds (across runs)."""
    key: Callable[[dict[str, Any]], Hashable] | None = None
    """Maps the call's arguments to what makes two calls identical; default:
    canonical JSON (sorted keys, no whitespace)."""
    max_concurrency: int | None = None
    """At most this many executions of the tool at once, across all siblings."""
    rate_limit: float | None = None
    """At most this many executions of the tool start per second."""
    share_errors: bool = True
    """Give a failed shared execution's error to every caller waiting on it
    (False: each of them runs the tool itself)."""
    coalescer: Coalescer[ToolResult] = field(init=False, repr=False)
    """The runtime state behind this policy."""

    def __post_init__(self) -> None:
        if self.scope not in ("run", "inflight"):
            raise ValueError(f'scope must be "run" or "inflight", got {self.scope!r}')
        if self.key is not None and not callable(self.key):
            raise ValueError(f"key must be a callable(args) -> hashable, got {self.key!r}")
        coalescer: Coalescer[ToolResult] = Coalescer(
            ttl=self.ttl,
            max_concurrency=self.max_concurrency,
            rate_limit=self.rate_limit,
            share_errors=self.share_errors,
        )
        object.__setattr__(self, "coalescer", coalescer)

    def call_key(self, tool_name: str, args: Mapping[str, Any]) -> Hashable:
        """What makes a call identical to another: `(tool name, key(args))`.

        Args:
            tool_name: The tool's name.
            args: The arguments the model gave.

        Returns:
            A hashable key.

        Raises:
            TypeError: If the arguments are not JSON-serialisable and no `key` is set.
        """
        if self.key is not None:
            return (tool_name, self.key(dict(args)))
        return (
            tool_name,
            json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False),
        )


def _injected_args(tool: BaseTool) -> set[str]:
    """Caller-dependent injected arguments (state, store, runtime).

    `InjectedToolCallId` is allowed: a shared `ToolMessage` gets each caller's
    id anyway, and a `Command` (what such tools usually return) is never shared.
    """
    try:
        schema = tool.get_input_schema()
        shown = tool.tool_call_schema
    except Exception:  # a tool with a JSON-schema dict: nothing can be injected
        return set()
    if isinstance(shown, dict):
        return set()
    fields = _fields(schema)
    hidden = set(fields) - set(_fields(shown))
    return {name for name in hidden if not _is_tool_call_id(fields[name])}


def _fields(schema: Any) -> dict[str, Any]:
    # pydantic v2 models have `model_fields`, v1 models `__fields__`.
    fields = getattr(schema, "model_fields", None)
    if fields is None:
        fields = getattr(schema, "__fields__", {})
    return dict(fields)


def _is_tool_call_id(field_info: Any) -> bool:
    for marker in getattr(field_info, "metadata", ()):
        if marker is InjectedToolCallId or isinstance(marker, InjectedToolCallId):
            return True
    return False


def coalesce(
    tool: BaseTool | Callable[..., Any],
    *,
    scope: Literal["run", "inflight"] = "run",
    ttl: float | None = None,
    key: Callable[[dict[str, Any]], Hashable] | None = None,
    max_concurrency: int | None = None,
    rate_limit: float | None = None,
    share_errors: bool = True,
) -> BaseTool:
    """Mark a tool whose identical calls may be shared among sibling agents.

    Returns a copy of the tool carrying a `CoalescePolicy` in its `metadata`;
    it is still an ordinary tool everywhere. Under `BatchToolNode` or
    `BatchMiddleware`, calls with the same tool name and the same arguments
    (canonical JSON, or `key(args)`) run once; every caller gets the result
    with its own `tool_call_id`.

    What is never shared: a tool returning a `Command` (the result goes to the
    caller that ran it; the others run the tool themselves), an interrupt
    raised inside the tool, and errors when `share_errors=False`. Errors and
    error `ToolMessage`s are shared only among callers waiting at the same
    time, never stored. Tools that take injected state (`InjectedState`,
    `InjectedStore`, `ToolRuntime`) are refused at `coalesce()` time: their
    result depends on the caller. `InjectedToolCallId` is allowed (a shared
    `ToolMessage` gets each caller's id; a `Command` is never shared).

    Args:
        tool: A `BaseTool` (e.g. from `@tool`) or a plain function (converted with `@tool`).
        scope: `"run"` (default) shares in-flight and completed results within
            one fan_out run (`current_sibling().group`; outside a fan_out, only
            concurrent calls); `"inflight"` shares only concurrent calls.
        ttl: Also keep successful results process-wide for this many seconds,
            across runs (monotonic clock).
        key: `callable(args) -> hashable` deciding which calls are identical.
        max_concurrency: At most this many executions at once, across all siblings.
        rate_limit: At most this many executions start per second (async token
            bucket, never blocks the event loop).
        share_errors: Give a failed execution's error to every caller waiting
            on it (default: a retry by each caller would multiply the load).

    Returns:
        The coalesced tool.

    Raises:
        ValueError: If an option is out of range, or the tool takes injected arguments.

    Example:
        ```python
        from langchain_core.tools import tool
        from langgraph_batch.tools import BatchToolNode, coalesce

        @tool
        async def search(query: str) -> str:
            \"\"\"Search the web.\"\"\"
            return await my_search(query)

        node = BatchToolNode([coalesce(search, ttl=600, max_concurrency=8)])
        ```
    """
    base = tool if isinstance(tool, BaseTool) else as_tool(tool)
    if not isinstance(base, BaseTool):  # pragma: no cover - @tool always returns a BaseTool
        raise ValueError(f"cannot make a tool of {tool!r}")
    injected = _injected_args(base)
    if injected:
        raise ValueError(
            f"tool {base.name!r} takes injected arguments {sorted(injected)}: its result "
            "depends on the caller and cannot be shared. Remove the injected arguments, "
            "or do not coalesce this tool."
        )
    policy = CoalescePolicy(
        scope=scope,
        ttl=ttl,
        key=key,
        max_concurrency=max_concurrency,
        rate_limit=rate_limit,
        share_errors=share_errors,
    )
    policy_id = uuid.uuid4().hex
    _POLICIES[policy_id] = policy
    summary = {
        "id": policy_id,
        "scope": scope,
        "ttl": ttl,
        "key": getattr(key, "__qualname__", repr(key)) if key is not None else None,
        "max_concurrency": max_concurrency,
        "rate_limit": rate_limit,
        "share_errors": share_errors,
    }
    metadata = {**(base.metadata or {}), METADATA_KEY: summary}
    return base.model_copy(update={"metadata": metadata})


def coalesce_policy(tool: BaseTool | None) -> CoalescePolicy | None:
    """The `CoalescePolicy` of a tool made by `coalesce`, or None for an ordinary tool.

    Args:
        tool: Any tool (or None).

    Returns:
        The policy, or None.

    Example:
        ```python
        assert coalesce_policy(coalesce(search)) is not None
        assert coalesce_policy(search) is None
        ```
    """
    if tool is None or not tool.metadata:
        return None
    summary = tool.metadata.get(METADATA_KEY)
    if not isinstance(summary, dict):
        return None
    return _POLICIES.get(str(summary.get("id")))


def forget_run(group: str) -> None:
    """Drop the results every coalesced tool keeps for the fan_out run `group`.

    `fan_out` calls this when a run ends; results are otherwise kept for the
    256 most recently used runs per tool.

    Args:
        group: The run's `SiblingInfo.group`.

    Example:
        ```python
        forget_run(sibling.group)
        ```
    """
    for policy in list(_POLICIES.values()):
        policy.coalescer.forget_scope(group)


# ---------------------------------------------------------------------------------------
# The hook shared by BatchToolNode and BatchMiddleware
# ---------------------------------------------------------------------------------------


def _shareable(result: ToolResult) -> bool:
    return isinstance(result, ToolMessage)


def _is_error(result: ToolResult) -> bool:
    return isinstance(result, ToolMessage) and result.status == "error"


def _share_exception(exc: BaseException) -> bool:
    # An interrupt belongs to the task that raised it.
    return not isinstance(exc, GraphBubbleUp)


def _for_caller(result: ToolResult, tool_call_id: str | None) -> ToolResult:
    """A shared result as this caller's own message: its tool_call_id, no message id.

    The stored message may have been given a message `id` by the graph that
    first received it (`add_messages` sets missing ids in place); a copy that
    kept it would replace that earlier message instead of being appended.
    """
    if isinstance(result, ToolMessage):
        update: dict[str, Any] = {"id": None}
        if tool_call_id is not None:
            update["tool_call_id"] = tool_call_id
        return result.model_copy(update=update)
    return result


async def coalesced_call(request: ToolCallRequest, execute: Execute) -> ToolResult:
    """Run one tool call through coalescing (if its tool is marked) and the counters.

    The building block of `BatchToolNode` and `BatchMiddleware`; it does not
    mark the sibling as in a tool (`in_tool_call` does).

    Args:
        request: The tool call.
        execute: Runs the call (ToolNode's `execute` or the middleware `handler`).

    Returns:
        The caller's `ToolMessage` (with its own `tool_call_id`) or `Command`.

    Example:
        ```python
        result = await coalesced_call(request, handler)
        ```
    """
    sibling = current_sibling()
    group = sibling.group if sibling is not None else None
    name = request.tool_call["name"]
    STATS.add(name, group, "requested")
    executed = False

    async def run_own() -> ToolResult:
        nonlocal executed
        executed = True
        STATS.add(name, group, "executed")
        try:
            result = await execute(request)
        except GraphBubbleUp:
            raise
        except Exception:
            STATS.add(name, group, "errors")
            raise
        if _is_error(result):
            STATS.add(name, group, "errors")
        return result

    policy = coalesce_policy(request.tool)
    if policy is None:
        return await run_own()
    try:
        key = policy.call_key(name, request.tool_call["args"])
    except TypeError:
        logger.debug("tool %s: arguments are not JSON, call not coalesced", name)
        return await run_own()
    scope = group if policy.scope == "run" else None
    result = await policy.coalescer.run(
        key,
        run_own,
        scope=scope,
        shareable=_shareable,
        is_error=_is_error,
        share_exception=_share_exception,
    )
    if executed:
        return result
    STATS.add(name, group, "shared")
    return _for_caller(result, request.tool_call["id"])


async def in_tool_call(request: ToolCallRequest, call: Execute) -> ToolResult:
    """Run `call(request)` with the calling sibling marked as inside a tool.

    No-op marking outside a fan_out sibling.

    Args:
        request: The tool call.
        call: What runs it.

    Returns:
        What `call` returns.

    Example:
        ```python
        result = await in_tool_call(request, lambda r: coalesced_call(r, handler))
        ```
    """
    sibling = current_sibling()
    if sibling is None:
        return await call(request)
    await sibling.tool_enter()
    try:
        return await call(request)
    finally:
        await sibling.tool_exit()


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

        async def run(req: ToolCallRequest) -> ToolResult:
            return await coalesced(req)

        def sync_execute(req: ToolCallRequest) -> ToolResult:
            return asyncio.run_coroutine_threadsafe(run(req), loop).result()

        return await asyncio.to_thread(user_wrap, request, sync_execute)


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
        from langgraph_batch._middleware import BatchMiddleware

        return BatchMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
