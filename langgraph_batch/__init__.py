"""langgraph-batch: run many sibling LangGraph agents against vLLM/SGLang at GPU speed.

Two drop-ins change how a graph's LLM and tool calls reach the hardware:
`BatchedChatModel` (a LangChain chat model whose calls go through a shared,
batching, priority-aware `Scheduler`) and `fan_out` (a graph node that runs N
sibling subgraphs with failure isolation, tool coalescing and progress).

```python
from langgraph_batch import BatchedChatModel, BatchToolNode, coalesce, fan_out

llm = BatchedChatModel(model="my-model", base_url="vllm://127.0.0.1:8000")
```

How the package is laid out:

    chat_model/   BatchedChatModel: a LangChain call becomes a ChatRequest
    scheduler/    what goes to the server and when: Planner.plan(now),
                  pure and synchronous, driven by the async Scheduler
    backends/     how a request reaches a server (the one HTTP seam)
    nodes/        fan_out: sibling subgraphs, isolated, admitted by KV
    tools/        tool coalescing, single flight, at_most_once
    _observe/     what the library reports (metrics.py: the Prometheus sink)
    distributed/, batch_api/   siblings run elsewhere (Redis, Ray, batch APIs)
    record/, pricing.py        a run's shape to replay; what a run costs
    emulator/, bench/          a vLLM/SGLang stand-in with no GPU; benchmarks, demo

Every module, one line each, is in the module map of `docs/development.md`
(`tests/unit/test_module_map.py` keeps it whole). A package's private modules
are imported from inside it only; what other packages need, its public
module exposes (`tests/unit/test_module_graph.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langgraph_batch._version import __version__

if TYPE_CHECKING:
    from langgraph_batch._observe.progress import render_progress
    from langgraph_batch.chat_model import BatchedChatModel
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
    from langgraph_batch.nodes import SiblingError, fan_out
    from langgraph_batch.scheduler import BatchPolicy, RetryPolicy, Scheduler
    from langgraph_batch.tools import BatchMiddleware, BatchToolNode, coalesce, tool_stats

__all__ = (
    "BackendAuthenticationError",
    "BackendBadRequestError",
    "BackendConnectionError",
    "BackendError",
    "BackendRateLimitError",
    "BackendServerError",
    "BackendStreamError",
    "BackendTimeoutError",
    "BatchMiddleware",
    "BatchPolicy",
    "BatchTimeoutError",
    "BatchToolNode",
    "BatchedChatModel",
    "ContextLengthExceededError",
    "LangGraphBatchError",
    "MalformedToolCallError",
    "ModelNotFoundError",
    "RetryPolicy",
    "Scheduler",
    "SchedulerClosedError",
    "SchedulerDeadError",
    "SchedulerError",
    "SiblingError",
    "SiblingFailedError",
    "__version__",
    "coalesce",
    "fan_out",
    "render_progress",
    "tool_stats",
)


# Names that left the top level (0.2.0): still importable from here, with a
# DeprecationWarning naming their home.
_MOVED = {
    "FanOutNode": "langgraph_batch.nodes",
    "ProgressBar": "langgraph_batch._observe.progress",
    "SchedulerState": "langgraph_batch.scheduler",
    "SchedulerStats": "langgraph_batch.scheduler",
    "ToolStats": "langgraph_batch.tools",
}


# Where each public name lives. The top level imports none of them until first
# use, so a process that needs one part (the emulator server, a worker) does not
# pay for LangChain's import (~2.5 s of CPU on 2 cores).
_HOMES = {
    "render_progress": "langgraph_batch._observe.progress",
    "BatchedChatModel": "langgraph_batch.chat_model",
    "SiblingError": "langgraph_batch.nodes",
    "fan_out": "langgraph_batch.nodes",
    "BatchPolicy": "langgraph_batch.scheduler",
    "RetryPolicy": "langgraph_batch.scheduler",
    "Scheduler": "langgraph_batch.scheduler",
    # BatchMiddleware needs the optional `langchain` package (create_agent).
    "BatchMiddleware": "langgraph_batch.tools",
    "BatchToolNode": "langgraph_batch.tools",
    "coalesce": "langgraph_batch.tools",
    "tool_stats": "langgraph_batch.tools",
    "BackendAuthenticationError": "langgraph_batch.errors",
    "BackendBadRequestError": "langgraph_batch.errors",
    "BackendConnectionError": "langgraph_batch.errors",
    "BackendError": "langgraph_batch.errors",
    "BackendRateLimitError": "langgraph_batch.errors",
    "BackendServerError": "langgraph_batch.errors",
    "BackendStreamError": "langgraph_batch.errors",
    "BackendTimeoutError": "langgraph_batch.errors",
    "BatchTimeoutError": "langgraph_batch.errors",
    "ContextLengthExceededError": "langgraph_batch.errors",
    "LangGraphBatchError": "langgraph_batch.errors",
    "MalformedToolCallError": "langgraph_batch.errors",
    "ModelNotFoundError": "langgraph_batch.errors",
    "SchedulerClosedError": "langgraph_batch.errors",
    "SchedulerDeadError": "langgraph_batch.errors",
    "SchedulerError": "langgraph_batch.errors",
    "SiblingFailedError": "langgraph_batch.errors",
}


def __getattr__(name: str) -> Any:
    import importlib

    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value
    home = _MOVED.get(name)
    if home is not None:
        import warnings

        warnings.warn(
            f"langgraph_batch.{name} is deprecated at the top level: import it from {home}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
