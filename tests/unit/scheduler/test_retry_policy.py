"""One retry owner: `RetryPolicy`, `Delivery`, and the one rule for a call's retry budget."""

from __future__ import annotations

import dataclasses
import random
import warnings
from collections.abc import Callable

import pytest

from langgraph_batch import BatchedChatModel, RetryPolicy
from langgraph_batch._retry_policy import REDIS_RETRY, Delivery, default_retry_on
from langgraph_batch.backends import Backend, ChatChunk, ChatRequest, ChatResponse, EndpointPool
from langgraph_batch.errors import (
    BackendBadRequestError,
    BackendConnectionError,
    BackendServerError,
    SchedulerClosedError,
)
from langgraph_batch.scheduler import BatchPolicy, Scheduler
from tests.fakes.backends import request, response

FAST = {"initial_interval": 0.0, "max_interval": 0.0}


# ------------------------------------------------------------------ the value


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"initial_interval": -1}, "initial_interval"),
        ({"max_interval": -0.1}, "max_interval"),
        ({"initial_interval": 2.0, "max_interval": 1.0}, "max_interval"),
        ({"backoff_factor": 0.5}, "backoff_factor"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
    ],
)
def test_bad_values_are_refused_by_name(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RetryPolicy(**kw)  # type: ignore[arg-type]


def test_the_defaults_are_the_schedulers_and_langgraphs_fields() -> None:
    retry = RetryPolicy()
    assert (retry.initial_interval, retry.backoff_factor, retry.max_interval) == (0.25, 2.0, 8.0)
    assert (retry.max_attempts, retry.max_retries, retry.jitter) == (3, 2, True)
    assert retry.retry_on is default_retry_on
    from langgraph.types import RetryPolicy as LangGraphRetryPolicy

    assert set(LangGraphRetryPolicy._fields) == set(RetryPolicy.__dataclass_fields__)
    assert BatchPolicy().retry == retry


def test_interval_is_full_jitter_under_a_doubling_ceiling() -> None:
    retry = RetryPolicy(initial_interval=1.0, max_interval=5.0)
    rng = random.Random(7)
    for n, ceiling in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (40, 5.0)):
        draws = [retry.interval(n, rng) for _ in range(200)]
        assert min(draws) >= 0.0
        assert max(draws) <= ceiling
        assert max(draws) > ceiling * 0.8  # really drawn from the whole range
    exact = RetryPolicy(initial_interval=1.0, max_interval=5.0, jitter=False)
    assert [exact.interval(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]
    assert exact.interval(5000) == 5.0  # a long outage's waits do not overflow
    assert exact.interval(1, retry_after=7.5) == 7.5  # the server's Retry-After wins


def test_should_retry_reads_budget_errors_and_delivery() -> None:
    retry = RetryPolicy(max_attempts=3)
    server = BackendServerError("503")
    assert retry.should_retry(server, attempt=0)
    assert retry.should_retry(server, attempt=1)
    assert not retry.should_retry(server, attempt=2)  # three attempts made
    assert not retry.should_retry(server, attempt=0, max_retries=0)  # the call's own budget
    assert retry.should_retry(server, attempt=4, max_retries=5)
    assert not retry.should_retry(BackendBadRequestError("400"), attempt=0)
    assert not retry.should_retry(SchedulerClosedError("closed"), attempt=0)
    delivered = Delivery()
    delivered.wrap(lambda chunk: None)(ChatChunk(content="hi"))
    assert not retry.should_retry(server, attempt=0, delivery=delivered)
    # retry_on as LangGraph takes it: a class, classes, or a predicate.
    assert RetryPolicy(retry_on=ValueError).should_retry(ValueError(), attempt=0)
    assert RetryPolicy(retry_on=(KeyError, ValueError)).should_retry(KeyError(), attempt=0)
    never: Callable[[BaseException], bool] = lambda exc: False  # noqa: E731
    assert not RetryPolicy(retry_on=never).should_retry(server, attempt=0)


def test_delivery_counts_output_only() -> None:
    seen: list[ChatChunk] = []
    delivery = Delivery()
    forward = delivery.wrap(seen.append)
    forward(ChatChunk(content=""))  # a role-only first chunk
    forward(ChatChunk(finish_reason="stop"))
    assert delivery.replayable
    assert len(seen) == 2
    forward(ChatChunk(content="x"))
    assert not delivery.replayable
    assert delivery.delivered == 1


def test_redis_waits_have_one_cap() -> None:
    assert (REDIS_RETRY.initial_interval, REDIS_RETRY.max_interval) == (0.05, 1.0)
    assert REDIS_RETRY.jitter


# ------------------------------------------------------------------ BatchPolicy holds one


def test_batch_policy_old_retry_keywords_still_work_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="max_retries, backoff_base_s deprecated"):
        policy = BatchPolicy(max_retries=4, backoff_base_s=0.5)  # type: ignore[call-arg]
    assert policy.retry == RetryPolicy(max_attempts=5, initial_interval=0.5)
    with pytest.warns(DeprecationWarning, match="backoff_max_s"):
        assert BatchPolicy(backoff_max_s=1.0).retry.max_interval == 1.0  # type: ignore[call-arg]
    with pytest.warns(DeprecationWarning, match=r"BatchPolicy.max_retries is deprecated"):
        assert policy.max_retries == 4  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match="initial_interval"):
        assert policy.backoff_base_s == 0.5  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match="max_interval"):
        assert policy.backoff_max_s == 8.0  # type: ignore[attr-defined]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match="retry= only"):
            BatchPolicy(retry=RetryPolicy(), max_retries=1)  # type: ignore[call-arg]
        with pytest.raises(ValueError, match="max_retries"):
            BatchPolicy(max_retries=-1)  # type: ignore[call-arg]


def test_replace_takes_the_deprecated_keywords_over_the_policys_fields() -> None:
    # `dataclasses.replace` restates every field, `retry` and `inflight_limit`
    # included: the deprecated keyword is the change asked for, not a conflict
    # (`replace(policy, max_retries=5)` worked while max_retries was a field).
    policy = BatchPolicy(retry=RetryPolicy(max_attempts=5, jitter=False), inflight_limit=16)
    with pytest.warns(DeprecationWarning, match="max_retries deprecated"):
        changed = dataclasses.replace(policy, max_retries=1)  # type: ignore[call-arg]
    assert changed.retry == RetryPolicy(max_attempts=2, jitter=False)
    assert changed.inflight_limit == 16
    with pytest.warns(DeprecationWarning, match="backoff_max_s"):
        slower = dataclasses.replace(policy, backoff_max_s=2.0)  # type: ignore[call-arg]
    assert slower.retry == RetryPolicy(max_attempts=5, jitter=False, max_interval=2.0)
    with pytest.warns(DeprecationWarning, match="max_inflight is deprecated"):
        assert dataclasses.replace(policy, max_inflight=8).inflight_limit == 8  # type: ignore[call-arg]


def test_batch_policy_from_json_takes_a_retry_dict() -> None:
    policy = BatchPolicy.from_dict({"retry": {"max_attempts": 5, "jitter": False}})
    assert policy.retry == RetryPolicy(max_attempts=5, jitter=False)
    with pytest.raises(ValueError, match="unknown RetryPolicy field"):
        BatchPolicy.from_dict({"retry": {"attempts": 5}})


# ------------------------------------------------------------------ the precedence rule


class Failing(Backend):
    """Fails every call with a retryable 503; counts the attempts."""

    base_url = "fake://failing"

    def __init__(self) -> None:
        self.calls = 0

    async def chat(
        self, request: ChatRequest, *, on_chunk: Callable[[ChatChunk], None] | None = None
    ) -> ChatResponse:
        self.calls += 1
        raise BackendServerError("503", status_code=503)


async def _attempts(**model_kw: object) -> int:
    backend = Failing()
    llm = BatchedChatModel(model="m", backend=backend, scheduler=None, **model_kw)  # type: ignore[arg-type]
    with pytest.raises(BackendServerError):
        await llm.ainvoke("hi")
    await llm.get_scheduler().aclose()
    return backend.calls


async def test_a_calls_retries_come_from_the_model_when_set_else_the_policy() -> None:
    four = BatchPolicy(retry=RetryPolicy(max_attempts=4, **FAST))
    # Before, the model's default (2 retries) silently won over the policy's.
    assert await _attempts(policy=four) == 4
    assert await _attempts(policy=four, max_retries=0) == 1
    assert await _attempts(policy=four, max_retries=5) == 6
    assert BatchedChatModel(model="m").max_retries is None


async def test_submit_takes_the_calls_budget_else_the_policys() -> None:
    backend = Failing()
    policy = BatchPolicy(retry=RetryPolicy(max_attempts=2, **FAST))
    async with Scheduler(backend, policy=policy) as s:
        with pytest.raises(BackendServerError):
            await s.submit(request("a"))
        assert backend.calls == 2
        with pytest.raises(BackendServerError):
            await s.submit(request("b"), max_retries=3)
        assert backend.calls == 2 + 4


# ------------------------------------------------------------------ the pool's failover


class Replica(Backend):
    """Streams `chunks`, then drops the connection when `drops`; else answers."""

    def __init__(self, name: str, chunks: list[ChatChunk], *, drops: bool) -> None:
        self.base_url = f"http://{name}"
        self.chunks = chunks
        self.drops = drops
        self.calls = 0

    async def chat(
        self, request: ChatRequest, *, on_chunk: Callable[[ChatChunk], None] | None = None
    ) -> ChatResponse:
        self.calls += 1
        if on_chunk is not None:
            for chunk in self.chunks:
                on_chunk(chunk)
        if self.drops:
            raise BackendConnectionError("dropped", url=self.base_url)
        return response(request)


@pytest.mark.parametrize(
    ("first_chunks", "fails_over"),
    [
        ([], True),  # refused before anything
        ([ChatChunk(content="")], True),  # a role-only chunk: nothing shown yet
        ([ChatChunk(content="hal")], False),  # the caller has shown "hal"
    ],
)
async def test_the_pool_fails_over_only_while_nothing_was_delivered(
    first_chunks: list[ChatChunk], fails_over: bool
) -> None:
    replicas = [Replica("a", first_chunks, drops=True), Replica("b", [], drops=False)]
    pool = EndpointPool(replicas, routing="round_robin")
    req = request("r", stream=True)
    if fails_over:
        assert (await pool.chat(req, on_chunk=lambda chunk: None)).request_id == "r"
        assert replicas[1].calls == 1
    else:
        with pytest.raises(BackendConnectionError):
            await pool.chat(req, on_chunk=lambda chunk: None)
        assert replicas[1].calls == 0
