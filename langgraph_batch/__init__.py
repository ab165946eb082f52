"""langgraph-batch: run many sibling LangGraph agents against vLLM/SGLang at GPU speed.

Two drop-ins change how a graph's LLM and tool calls reach the hardware:
`BatchedChatModel` (a LangChain chat model whose calls go through a shared,
batching, priority-aware `Scheduler`) and `fan_out` (a graph node that runs N
sibling subgraphs with failure isolation, tool coalescing and progress).

```python
from langgraph_batch import BatchedChatModel, BatchToolNode, coalesce, fan_out

llm = BatchedChatModel(model="my-model", base_url="vllm://127.0.0.1:8000")
```

Which module owns which decision:

    chat_model, _request      a LangChain call -> ChatRequest (route_key, sibling, turn),
                              run through the scheduler; _tokens counts (TokenCounter)
    _retry_policy             RetryPolicy: every retry (the scheduler, the pool's
                              failover through Delivery, the waits on Redis)
    _estimates                every size guessed before a server counts: tokens of
                              a text (typical, generous), the KV prior per agent,
                              the KV headroom; read by every estimator, the
                              scheduler's starting limit and fan_out's bookings
    _redact, _process         a URL fit to show (no password) in reprs, logs and
                              errors; stopping a child process (term, kill, reap)
    _rate_budget              a provider's rate budget per key (stated, or learned from
                              its limit headers); scheduler/_pacing waits on it
    scheduler/_policy         what goes next: plan(now), pure; composes
      _limit _decode_gate     the in-flight limit (slow start, AIMD); the decode cap
      _warming _priority      the prefix-warming gate; priority key functions
      _gather                 a burst of known conversations goes out in order
    scheduler/_runner         the Scheduler: lifecycle; its collaborators _attempt (one
                              request in its caller's task), _dispatch (performs the
                              plans), _state.Lifecycle (the state they share)
    scheduler/_capacity       the server's KV capacity and the KVLedger every
                              fan_out run books (admission is pushed, not polled)
    scheduler/registry        schedulers by key and name; announces new ones
    backends/_transport       the HTTP seam: sharded connections
    backends/_errormap        the one error map: transport errors and the HTTP status
                              table, for every backend path (LangChainBackend too)
    backends/_batching, pool  batched prompts shared by vllm/sglang; replica routing
    backends/dynamo           dynamo://: session headers, nvext agent hints (_dynamo_hints)
    backends/_prompt_cache    hosted prompt caches: Anthropic breakpoints, OpenAI keys
    tools/                    coalescing, single-flight, ToolNode hook, middleware;
                              _once: at_most_once calls and where they are recorded
    nodes/fan_out             the node; _spec its options (FanOutSpec, frozen, checked
                              once), _admission the gate (program-level KV
                              admission, pauses), _forecast what a run learns of its
                              contexts and tool waits, _run one run's state,
                              _results results in order, _remote siblings elsewhere
    distributed/              Redis and Ray execution; _redis_wait: every wait on an
                              unreachable Redis (one cap, one give-up rule); _sibling:
                              the body both run; _redis_once, RayOnceStore: at_most_once
    emulator/                 the emulated vLLM/SGLang server; _serving its engine
                              and the request plumbing every route receives; _batch_api the
                              providers' batch APIs (OpenAI Batch, Message Batches);
                              _anthropic_api, _openai_cache the hosted flavours;
                              _ratelimit the providers' limits and headers
    pricing                   user price tables, cache/batch pricing rules, CostMeter
                              (fan_out's prices=, bench --replay --price)
    batch_api/                ProviderBatch: single-call siblings through a provider's
                              batch API (_openai, _anthropic: the SDK calls; _outcome:
                              items that never ran)

A package's private modules are imported from inside it only; what other
packages need, its public module exposes (`tests/unit/test_module_graph.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langgraph_batch._observe.progress import render_progress
from langgraph_batch._version import __version__
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
from langgraph_batch.tools import BatchToolNode, coalesce, tool_stats

if TYPE_CHECKING:
    from langgraph_batch.tools import BatchMiddleware

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


def __getattr__(name: str) -> Any:
    # BatchMiddleware needs the optional `langchain` package (create_agent):
    # import it on first use so the core install does not require it.
    if name == "BatchMiddleware":
        from langgraph_batch.tools import BatchMiddleware

        return BatchMiddleware
    home = _MOVED.get(name)
    if home is not None:
        import importlib
        import warnings

        warnings.warn(
            f"langgraph_batch.{name} is deprecated at the top level: import it from {home}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
