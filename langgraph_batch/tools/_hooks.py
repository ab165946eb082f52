"""The tool-call hook shared by `BatchToolNode` and `BatchMiddleware`.

`coalesced_call` runs one call through its tool's `CoalescePolicy` (if any)
and the counters; `in_tool_call` marks the calling fan_out sibling as inside
a tool while the call runs, which releases its admission place. Both hooks
(`langgraph_batch.tools.BatchToolNode`, `langgraph_batch.tools._middleware.
BatchMiddleware`) compose these two; neither imports the other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_batch._context import current_sibling
from langgraph_batch._observe import tracing
from langgraph_batch.tools._coalesce import ToolResult, coalescing
from langgraph_batch.tools._stats import STATS

__all__ = ("Execute", "ToolResult", "coalesced_call", "in_tool_call")

logger = logging.getLogger(__name__)

Execute = Callable[[ToolCallRequest], Awaitable[ToolResult]]


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
    mark the sibling as in a tool (`in_tool_call` does). Calls share only
    within their scope (see `coalesce`); a call with no run to share in (made
    outside any LangGraph run or fan_out) runs on its own.

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

    live = coalescing(request.tool)
    if live is None:
        return await run_own()
    policy, coalescer = live.policy, live.coalescer
    scope = policy.scope_of_call()
    if scope is None:
        logger.debug("tool %s: called outside any run, call not coalesced", name)
        return await run_own()
    try:
        key = policy.request_key(request)
    except TypeError:
        logger.debug("tool %s: arguments are not JSON, call not coalesced", name)
        return await run_own()
    except Exception as exc:
        # The author's caller_key failed: never guess who the caller is.
        logger.warning(
            "tool %s: caller_key raised %s; call not coalesced", name, type(exc).__name__
        )
        return await run_own()

    async def run_traced() -> ToolResult:
        # One span per shared execution, with the identical calls that waited on it.
        with tracing.tool_span(name, request.tool_call.get("id")) as span:
            result = await run_own()
            if span is not None and span.is_recording():
                followers = coalescer.waiting(key, scope=scope) - 1
                span.set_attribute("lgb.coalesce.followers", max(0, followers))
            return result

    result = await coalescer.run(
        key,
        run_traced if tracing.ENABLED and tracing.recording() else run_own,
        scope=scope,
        keep=policy.keeps_results,
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

    No-op marking outside a fan_out sibling. When the call is cancelled the
    sibling leaves the tool without waiting for its admission place again
    (a cancelled sibling must not be held up by the gate).

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
    await sibling.tool_enter(request.tool_call.get("name"))
    try:
        result = await call(request)
    except asyncio.CancelledError:
        sibling.tool_abandon()
        raise
    except BaseException:
        await sibling.tool_exit()
        raise
    await sibling.tool_exit()
    return result
