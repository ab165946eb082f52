"""The public surface is written out here: a change to it must be deliberate."""

from __future__ import annotations

import langgraph_batch
from langgraph_batch import backends, scheduler

EXPECTED_TOP_LEVEL = {
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
    "FanOutNode",
    "LangGraphBatchError",
    "MalformedToolCallError",
    "ModelNotFoundError",
    "ProgressBar",
    "Scheduler",
    "SchedulerClosedError",
    "SchedulerDeadError",
    "SchedulerError",
    "SchedulerState",
    "SchedulerStats",
    "SiblingError",
    "SiblingFailedError",
    "ToolStats",
    "__version__",
    "coalesce",
    "fan_out",
    "render_progress",
    "tool_stats",
}


def test_all_is_exactly_the_public_surface() -> None:
    assert set(langgraph_batch.__all__) == EXPECTED_TOP_LEVEL
    assert list(langgraph_batch.__all__) == sorted(langgraph_batch.__all__)


def test_every_exported_name_resolves() -> None:
    for name in langgraph_batch.__all__:
        assert getattr(langgraph_batch, name) is not None, name


def test_lazy_batch_middleware_is_the_tools_class() -> None:
    from langgraph_batch.tools._middleware import BatchMiddleware

    assert langgraph_batch.BatchMiddleware is BatchMiddleware


def test_backend_errors_are_langchain_model_errors() -> None:
    from langchain_core.exceptions import ModelError, ModelRateLimitError

    assert issubclass(langgraph_batch.BackendRateLimitError, ModelRateLimitError)
    assert langgraph_batch.BackendRateLimitError.is_retryable
    assert not langgraph_batch.ContextLengthExceededError.is_retryable
    for name in langgraph_batch.__all__:
        obj = getattr(langgraph_batch, name)
        if isinstance(obj, type) and issubclass(obj, langgraph_batch.BackendError):
            assert issubclass(obj, langgraph_batch.LangGraphBatchError)
            # Retryable errors must not derive from builtins LangGraph refuses to retry.
            if obj.is_retryable:
                assert not issubclass(obj, (TimeoutError, OSError, RuntimeError, ValueError))
            if obj is not langgraph_batch.BackendError and obj.__name__ != "MalformedToolCallError":
                assert issubclass(obj, ModelError), name


def test_subpackages_export_their_pieces() -> None:
    assert {"Backend", "OpenAICompatibleBackend", "VLLMBackend", "SGLangBackend"} <= set(
        backends.__all__
    )
    assert {"Scheduler", "BatchPolicy", "SchedulerStats", "SchedulerState"} <= set(
        scheduler.__all__
    )


EXPECTED_DISTRIBUTED = {
    "ACL_RULES",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "ClusterLimitedBackend",
    "DeadLetteredError",
    "DistributedError",
    "DistributedTimeoutError",
    "InputValidationError",
    "PayloadRejectedError",
    "PayloadTooLargeError",
    "RedisExecutor",
    "RedisFlightStore",
    "RedisSemaphore",
    "RedisUnavailableError",
    "RemoteEvent",
    "SiblingExecutor",
    "Worker",
    "load_graph",
}


def test_distributed_surface_and_errors() -> None:
    from langgraph_batch import distributed, errors

    assert set(distributed.__all__) == EXPECTED_DISTRIBUTED
    for name in distributed.__all__:
        obj = getattr(distributed, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, errors.DistributedError), name
            assert name in errors.__all__, name
            if obj.is_retryable:
                assert not issubclass(obj, (TimeoutError, OSError, RuntimeError, ValueError))
