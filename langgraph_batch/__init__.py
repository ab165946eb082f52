"""langgraph-batch: run many sibling LangGraph agents against vLLM/SGLang at GPU speed.

Two drop-ins change how a graph's LLM and tool calls reach the hardware:
`BatchedChatModel` (a LangChain chat model whose calls go through a shared,
batching, priority-aware `Scheduler`) and `fan_out` (a graph node that runs N
sibling subgraphs with failure isolation, tool coalescing and progress).
"""

from __future__ import annotations

from langgraph_batch._version import __version__
from langgraph_batch.errors import (
    BackendAuthenticationError,
    BackendBadRequestError,
    BackendConnectionError,
    BackendError,
    BackendRateLimitError,
    BackendServerError,
    BackendStreamError,
    BackendTimeoutError,
    BatchTimeoutError,
    ContextLengthExceededError,
    LangGraphBatchError,
    MalformedToolCallError,
    ModelNotFoundError,
    SchedulerClosedError,
    SchedulerDeadError,
    SchedulerError,
    SiblingFailedError,
)

__all__ = (
    "BackendAuthenticationError",
    "BackendBadRequestError",
    "BackendConnectionError",
    "BackendError",
    "BackendRateLimitError",
    "BackendServerError",
    "BackendStreamError",
    "BackendTimeoutError",
    "BatchTimeoutError",
    "ContextLengthExceededError",
    "LangGraphBatchError",
    "MalformedToolCallError",
    "ModelNotFoundError",
    "SchedulerClosedError",
    "SchedulerDeadError",
    "SchedulerError",
    "SiblingFailedError",
    "__version__",
)
