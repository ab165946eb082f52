"""The public surface is written out here: a change to it must be deliberate."""

from __future__ import annotations

import pytest

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
}


def test_all_is_exactly_the_public_surface() -> None:
    assert set(langgraph_batch.__all__) == EXPECTED_TOP_LEVEL
    assert list(langgraph_batch.__all__) == sorted(langgraph_batch.__all__)


def test_every_exported_name_resolves() -> None:
    for name in langgraph_batch.__all__:
        assert getattr(langgraph_batch, name) is not None, name


def test_the_top_level_imports_its_parts_on_first_use() -> None:
    """`import langgraph_batch.emulator` (the emulator server, started by every
    integration test) does not import LangChain; a name is its home's object."""
    import subprocess
    import sys

    code = (
        "import sys, langgraph_batch.emulator; "
        "print(sorted(m for m in ('langchain_core', 'langgraph') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    from langgraph_batch.errors import SchedulerDeadError
    from langgraph_batch.nodes import fan_out

    assert langgraph_batch.fan_out is fan_out
    assert langgraph_batch.SchedulerDeadError is SchedulerDeadError
    assert set(dir(langgraph_batch)) >= EXPECTED_TOP_LEVEL
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = langgraph_batch.no_such_name


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
    assert {
        "Backend",
        "DynamoBackend",
        "OpenAICompatibleBackend",
        "VLLMBackend",
        "SGLangBackend",
    } <= set(backends.__all__)
    assert set(scheduler.__all__) == {
        "BatchPolicy",
        "KVLedger",
        "RateLimitPolicy",
        "RetryPolicy",
        "Scheduler",
        "SchedulerState",
        "SchedulerStats",
        "find_scheduler",
        "register_scheduler",
        "scheduler_for",
    }
    from langgraph_batch import nodes, tools

    assert set(nodes.__all__) == {"FanOutNode", "SiblingError", "fan_out"}
    assert set(tools.__all__) == {
        "BatchMiddleware",
        "at_most_once",
        "BatchToolNode",
        "CoalescePolicy",
        "ToolStats",
        "coalesce",
        "coalesce_policy",
        "reset_tool_stats",
        "tool_stats",
    }
    assert "make_request_id" not in backends.__all__


@pytest.mark.parametrize(
    ("name", "home"),
    [
        ("FanOutNode", "langgraph_batch.nodes"),
        ("ProgressBar", "langgraph_batch._observe.progress"),
        ("SchedulerState", "langgraph_batch.scheduler"),
        ("SchedulerStats", "langgraph_batch.scheduler"),
        ("ToolStats", "langgraph_batch.tools"),
    ],
)
def test_names_that_left_the_top_level_still_import_with_a_warning(name: str, home: str) -> None:
    import importlib

    with pytest.warns(DeprecationWarning, match=f"import it from {home}"):
        obj = getattr(langgraph_batch, name)
    assert obj is getattr(importlib.import_module(home), name)
    with pytest.raises(AttributeError):
        langgraph_batch.NoSuchName  # noqa: B018


def test_deprecated_names_of_the_in_flight_limit_and_the_registry_lookup() -> None:
    import dataclasses

    from langgraph_batch.scheduler import BatchPolicy, Scheduler, find_scheduler, registry
    from tests.fakes.backends import InstantBackend

    with pytest.warns(DeprecationWarning, match="inflight_limit"):
        old = BatchPolicy(max_inflight=7, priority="fifo")
    assert old == BatchPolicy(inflight_limit=7, priority="fifo")
    with pytest.warns(DeprecationWarning, match="inflight_limit"):
        assert Scheduler(InstantBackend(), policy=old).stats().max_inflight == 7
    with pytest.warns(DeprecationWarning, match="inflight_limit"):
        assert old.max_inflight == 7
    with pytest.warns(DeprecationWarning, match="inflight_limit"):
        assert BatchPolicy.from_dict({"max_inflight": 3}).inflight_limit == 3
    with (
        pytest.raises(TypeError, match="inflight_limit= only"),
        pytest.warns(DeprecationWarning, match="inflight_limit"),
    ):
        BatchPolicy(max_inflight=3, inflight_limit=4)  # type: ignore[call-arg]
    # The alias is no dataclass field: replace() and fields() never see it.
    assert "max_inflight" not in {f.name for f in dataclasses.fields(BatchPolicy)}
    assert dataclasses.replace(old, priority="las").inflight_limit == 7
    with pytest.warns(DeprecationWarning, match="find_scheduler"), pytest.raises(KeyError):
        registry.get_scheduler("no-such-scheduler")
    with pytest.raises(KeyError):
        find_scheduler("no-such-scheduler")


def test_batch_policy_is_the_dataclass_it_declares() -> None:
    # The deprecated keywords go through the metaclass, not a patched __init__:
    # what @dataclass generated is what runs, and what tools read.
    import copy
    import dataclasses
    import inspect
    import pickle

    from langgraph_batch.scheduler import BatchPolicy, RetryPolicy

    init = BatchPolicy.__dict__["__init__"]
    assert init.__qualname__ == "BatchPolicy.__init__"
    assert not hasattr(init, "__signature__")  # nothing assigned over the generated one
    params = inspect.signature(BatchPolicy).parameters
    assert list(params) == [f.name for f in dataclasses.fields(BatchPolicy)]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    policy = BatchPolicy(inflight_limit=7, retry=RetryPolicy(max_attempts=5))
    assert pickle.loads(pickle.dumps(policy)) == policy == copy.deepcopy(policy)
    assert hash(policy) == hash(BatchPolicy(inflight_limit=7, retry=RetryPolicy(max_attempts=5)))
    assert repr(policy).startswith("BatchPolicy(inflight_limit=7, min_inflight=1,")
    assert dataclasses.replace(policy, priority="las").retry.max_attempts == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.inflight_limit = 8  # type: ignore[misc]
    with pytest.raises(TypeError):
        BatchPolicy(7)  # type: ignore[misc]
    # A deprecated keyword warns at the caller's line.
    with pytest.warns(DeprecationWarning, match="initial_interval") as caught:
        old = BatchPolicy(backoff_base_s=0.5)  # type: ignore[call-arg]
    assert caught[0].filename == __file__
    assert old.retry.initial_interval == 0.5
    with pytest.warns(DeprecationWarning, match="max_interval") as caught:
        assert old.backoff_max_s == 8.0
    assert caught[0].filename == __file__


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
    "RayExecutor",
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


def test_record_surface() -> None:
    from langgraph_batch import record

    assert set(record.__all__) == {
        "FORMAT",
        "FORMAT_VERSION",
        "LLMCall",
        "Recorder",
        "Recording",
        "ToolRun",
        "import_trace",
        "read_recording",
    }
    assert list(record.__all__) == sorted(record.__all__)
    assert record.FORMAT_VERSION == 1
