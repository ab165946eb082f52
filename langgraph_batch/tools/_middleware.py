"""`BatchMiddleware`: tool coalescing and in-tool marking for `langchain.agents.create_agent`.

Kept apart from `langgraph_batch.tools` because it needs the optional
`langchain` package (`pip install 'langgraph-batch[agents]'`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

try:
    from langchain.agents.middleware import AgentMiddleware
except ImportError:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "BatchMiddleware needs langchain: pip install 'langgraph-batch[agents]'"
    ) from None
from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from langgraph_batch.tools._hooks import coalesced_call, in_tool_call

__all__ = ("BatchMiddleware",)


class BatchMiddleware(AgentMiddleware[Any, Any, Any]):
    """`create_agent` middleware: coalesce marked tools and mark siblings in-tool.

    The tool-side twin of `BatchedChatModel` (which handles the model side, so
    this middleware has no model hook). In async runs, calls of tools marked
    with `coalesce` are shared among siblings, the calling sibling is marked
    as inside a tool while the call runs (releasing its admission place), and
    calls are counted (`tool_stats`). Middleware listed after this one runs
    inside the coalesced execution. Sync runs execute tools unchanged.

    Example:
        ```python
        from langchain.agents import create_agent
        from langgraph_batch.tools import BatchMiddleware, coalesce

        agent = create_agent(llm, [coalesce(search)], middleware=[BatchMiddleware()])
        ```
    """

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """Run the call marked in-tool and through coalescing.

        Args:
            request: The tool call.
            handler: The rest of the middleware chain and the tool.

        Returns:
            This caller's `ToolMessage` (own `tool_call_id`) or `Command`.
        """
        return await in_tool_call(request, lambda req: coalesced_call(req, handler))

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Sync runs (`agent.invoke`): run the tool unchanged.

        Defined so that an agent with this middleware still works when invoked
        synchronously (a middleware with only an async hook cannot be).

        Args:
            request: The tool call.
            handler: The rest of the middleware chain and the tool.

        Returns:
            What `handler` returns.
        """
        return handler(request)
