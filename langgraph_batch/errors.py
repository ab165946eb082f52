"""Every exception langgraph-batch raises, in one tree.

```
LangGraphBatchError
├─ SchedulerError
│  ├─ SchedulerClosedError        # used after aclose(), or reopened
│  └─ SchedulerDeadError          # the runner task died; every waiter gets this
├─ BatchTimeoutError              # a request waited/ran past its timeout (retryable)
├─ BackendError                   # anything the inference server did or did not do
│  ├─ BackendConnectionError      # refused, reset, DNS, dropped mid-stream (retryable)
│  ├─ BackendTimeoutError         # connect/read timeout, HTTP 408 (retryable)
│  │  ├─ PoolTimeoutError         # no connection became free in time (retryable)
│  │  └─ StreamChunkTimeoutError  # no stream chunk within stream_chunk_timeout (retryable)
│  ├─ BackendRateLimitError       # HTTP 429, honours Retry-After (retryable)
│  ├─ BackendServerError          # HTTP 5xx (retryable)
│  ├─ BackendStreamError          # broken or truncated SSE (retryable)
│  ├─ BackendAuthenticationError  # HTTP 401/403 (not retryable)
│  ├─ BackendBadRequestError      # other HTTP 4xx (not retryable)
│  │  ├─ ContextLengthExceededError   # prompt does not fit max_model_len
│  │  └─ ModelNotFoundError           # wrong model name / wrong URL (HTTP 404/405)
│  └─ MalformedToolCallError      # tool-call arguments not JSON / not the tool's schema (retryable)
├─ SiblingFailedError             # on_error="raise" in fan_out: carries every SiblingError
└─ DistributedError               # distributed fan_out (langgraph_batch.distributed, Redis)
   ├─ RedisUnavailableError       # Redis unreachable for longer than allowed (retryable)
   ├─ DistributedTimeoutError     # RedisExecutor(timeout=...) ran out (retryable)
   ├─ PayloadTooLargeError        # a job input or result over max_payload_bytes
   ├─ PayloadRejectedError        # a payload the strict serializer refuses (pickle, unlisted types)
   ├─ InputValidationError        # a job input that does not fit the sibling graph's input
   └─ DeadLetteredError           # a job whose worker died max_deliveries times
└─ ProviderBatchError             # a provider batch API (langgraph_batch.batch_api) item
   ├─ BatchItemExpiredError       # not run before the window or deadline ran out (retryable)
   ├─ BatchItemFailedError        # the provider answered the item with an error
   └─ BatchItemCanceledError      # the batch was cancelled before the item ran (retryable)
```

Backend errors also subclass langchain-core's standard model errors
(`ModelConnectionError`, `ModelRateLimitError`, ...), which gives them
`is_retryable`, so LangChain and LangGraph retry helpers treat them
correctly. No retryable error derives from `TimeoutError`, `OSError`,
`RuntimeError` or `ValueError`: LangGraph's `default_retry_on` would not
retry those.

Every error carries structured attributes and a message that says what to
do about it. Which HTTP status becomes which error is one table, read by every
backend path (`langgraph_batch.backends._errormap`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.exceptions import (
    ContextOverflowError,
    ModelAPIError,
    ModelAuthenticationError,
    ModelConnectionError,
    ModelInvalidRequestError,
    ModelRateLimitError,
    ModelTimeoutError,
)
from langchain_core.exceptions import ModelNotFoundError as _LCModelNotFoundError

from langgraph_batch._redact import safe_url

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
    "DeadLetteredError",
    "DistributedError",
    "DistributedTimeoutError",
    "InputValidationError",
    "LangGraphBatchError",
    "MalformedToolCallError",
    "ModelNotFoundError",
    "PayloadRejectedError",
    "PayloadTooLargeError",
    "PoolTimeoutError",
    "RedisUnavailableError",
    "SchedulerClosedError",
    "SchedulerDeadError",
    "SchedulerError",
    "SiblingFailedError",
    "StreamChunkTimeoutError",
    "ToolAlreadyRanError",
)


class LangGraphBatchError(Exception):
    """Base class of every langgraph-batch error."""

    is_retryable: bool = False
    """Whether retrying the same call may succeed (langchain-core's convention)."""


class SchedulerError(LangGraphBatchError):
    """The scheduler cannot take or finish work."""


class SchedulerClosedError(SchedulerError):
    """The scheduler was closed (`aclose()`), or a closed scheduler was reopened.

    Create a new `Scheduler`, or use one from the registry by name: the
    registry replaces closed schedulers on demand.
    """


class SchedulerDeadError(SchedulerError):
    """The scheduler's runner task died; queued and new requests fail with this.

    Attributes:
        cause: the exception that killed the runner.
    """

    def __init__(self, message: str, *, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class BatchTimeoutError(LangGraphBatchError, ModelTimeoutError):
    """A request did not finish within its `timeout` (queue wait included).

    Attributes:
        timeout_s: the timeout that fired, in seconds.
        queued_s: how long the request waited for a slot before it started.
        request_id: the request's id.
    """

    is_retryable = True

    def __init__(
        self,
        message: str,
        *,
        timeout_s: float,
        queued_s: float = 0.0,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.timeout_s = timeout_s
        self.queued_s = queued_s
        self.request_id = request_id


class BackendError(LangGraphBatchError):
    """The inference server failed a request.

    Attributes:
        url: the URL that was called, when known (its password masked).
        status_code: the HTTP status, when there was a response.
        request_id: the request id sent to the server, when known.
        body: the (truncated) response body, when there was one.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        status_code: int | None = None,
        request_id: str | None = None,
        body: str | None = None,
    ) -> None:
        super().__init__(message)
        self.url = safe_url(url) if url else url  # a password in a URL never shows
        self.status_code = status_code
        self.request_id = request_id
        self.body = body


class BackendConnectionError(BackendError, ModelConnectionError):
    """The server could not be reached, or dropped the connection.

    Check the `base_url` (scheme, host, port) and that the server is up.
    """

    is_retryable = True


class BackendTimeoutError(BackendError, ModelTimeoutError):
    """The server did not answer within the transport timeout, or answered HTTP 408."""

    is_retryable = True


class PoolTimeoutError(BackendTimeoutError):
    """No connection to the server became free within the pool timeout.

    Every connection the backend may open (`limits.max_connections`) carries a
    request. Retrying later may succeed; so may a larger `max_connections` or
    `pool_timeout`, or fewer requests in flight (`max_inflight`).

    Attributes:
        pool_timeout_s: how long the request waited, in seconds.
        max_connections: the connection limit that was full (None: unknown).
    """

    def __init__(
        self,
        message: str,
        *,
        pool_timeout_s: float | None = None,
        max_connections: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.pool_timeout_s = pool_timeout_s
        self.max_connections = max_connections


class StreamChunkTimeoutError(BackendTimeoutError):
    """No stream chunk arrived within `stream_chunk_timeout` seconds.

    Like langchain-openai's error of the same name, it measures the gap
    between parsed stream events (SSE keep-alive comments do not reset it),
    but it is not a `TimeoutError`: LangGraph's default retry policy retries
    it. The scheduler retries it when no content had reached the caller yet.

    Attributes:
        timeout_s: the `stream_chunk_timeout` that fired.
        model_name: the model asked for.
        chunks_received: stream events received before the stall.
    """

    def __init__(
        self,
        message: str,
        *,
        timeout_s: float,
        model_name: str | None = None,
        chunks_received: int = 0,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.timeout_s = timeout_s
        self.model_name = model_name
        self.chunks_received = chunks_received


class BackendRateLimitError(BackendError, ModelRateLimitError):
    """HTTP 429: the server asks us to slow down.

    Attributes:
        retry_after_s: the server's `Retry-After`, in seconds, when sent.
    """

    is_retryable = True

    def __init__(self, message: str, *, retry_after_s: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class BackendServerError(BackendError, ModelAPIError):
    """HTTP 5xx (504 included): the server failed (overloaded, restarting or crashed)."""

    is_retryable = True


class BackendStreamError(BackendError, ModelConnectionError):
    """The SSE stream was broken: malformed event, or ended without `[DONE]`.

    Attributes:
        chunks_received: how many chunks arrived before the stream broke.
    """

    is_retryable = True

    def __init__(self, message: str, *, chunks_received: int = 0, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.chunks_received = chunks_received


class BackendBadRequestError(BackendError, ModelInvalidRequestError):
    """HTTP 4xx not mapped elsewhere: the request itself is wrong; retrying won't help.

    Not 401/403 (`BackendAuthenticationError`), 404/405 (`ModelNotFoundError`),
    408 (`BackendTimeoutError`) or 429 (`BackendRateLimitError`).
    """


class BackendAuthenticationError(BackendError, ModelAuthenticationError):
    """HTTP 401/403: the API key was refused. Set `api_key` or its env var."""


class ContextLengthExceededError(BackendBadRequestError, ContextOverflowError):
    """The prompt (plus `max_tokens`) does not fit the model's context window.

    Attributes:
        prompt_tokens: the prompt's length in tokens, when the server said.
        max_model_len: the model's context window, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        prompt_tokens: int | None = None,
        max_model_len: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len


class ModelNotFoundError(BackendBadRequestError, _LCModelNotFoundError):
    """The server does not serve the requested model (or the URL is wrong: HTTP 404, 405).

    Attributes:
        model: the model name that was asked for.
        available: the models the server listed, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        available: Sequence[str] = (),
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.model = model
        self.available = tuple(available)


class MalformedToolCallError(BackendError):
    """The model produced a tool call the bound tools cannot take.

    Its arguments are not JSON, not a JSON object, or break the tool's JSON
    schema (a required property missing, a property of the wrong type), or the
    stream ended inside them (`finish_reason="length"`, a dropped connection).
    This is sampling noise: `BatchedChatModel` retries the request (within
    `max_retries`, counted in `SchedulerStats.malformed_tool_calls`) and raises
    this error when every attempt was malformed. `fan_out` reports it as that
    sibling's `SiblingError`. With `invalid_tool_calls="return"` the model
    returns such calls as `AIMessage.invalid_tool_calls` instead, the way
    `ChatOpenAI` does.

    Attributes:
        tool_name: the tool the model tried to call.
        arguments: the raw argument text (truncated to 2,000 characters).
        reason: what is wrong with it.
        tool_call_id: the call's id.
        finish_reason: the response's finish reason (`"length"`: cut off).
        attempts: how many responses were malformed (retries included).
    """

    is_retryable = True

    def __init__(
        self,
        message: str,
        *,
        tool_name: str,
        arguments: str,
        reason: str = "",
        tool_call_id: str | None = None,
        finish_reason: str | None = None,
        attempts: int = 1,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.tool_name = tool_name
        self.arguments = arguments[:2000]
        self.reason = reason
        self.tool_call_id = tool_call_id
        self.finish_reason = finish_reason
        self.attempts = attempts


class SiblingFailedError(LangGraphBatchError):
    """Raised by `fan_out(on_error="raise")` after all siblings finished.

    Attributes:
        errors: the `SiblingError` of every failed sibling, in input order.
        results: every sibling's result (a `SiblingError` where it failed).
    """

    def __init__(self, message: str, *, errors: Sequence[Any], results: Sequence[Any]) -> None:
        super().__init__(message)
        self.errors = list(errors)
        self.results = list(results)


class ToolAlreadyRanError(LangGraphBatchError):
    """An `at_most_once` tool call was already made by an earlier attempt of this sibling.

    The sibling runs again (its worker or node died) and makes a call that
    its earlier attempt made, whose result cannot be given back: the earlier
    attempt died while the tool ran (`outcome="unknown"`: it may or may not
    have taken effect), the tool failed then (`"failed"`), or its result does
    not survive JSON (`"unreplayable"`). The tool is not run again. The
    message names the tool and the sibling, never the call's arguments.

    Attributes:
        tool: the tool's name.
        index: the sibling's position in its fan_out's items.
        outcome: `"unknown"`, `"failed"` or `"unreplayable"`.
    """

    def __init__(self, message: str, *, tool: str, index: int, outcome: str) -> None:
        super().__init__(message)
        self.tool = tool
        self.index = index
        self.outcome = outcome


class DistributedError(LangGraphBatchError):
    """Distributed fan_out (`langgraph_batch.distributed`) could not run or finish a job."""


class RedisUnavailableError(DistributedError):
    """Redis could not be reached for longer than `unavailable_timeout`.

    The run's keys stay in Redis until their TTL: running the same thread
    again (with a checkpointer) re-attaches to the run and collects what the
    workers finished meanwhile.

    Attributes:
        down_s: how long Redis has been unreachable, in seconds.
    """

    is_retryable = True

    def __init__(self, message: str, *, down_s: float) -> None:
        super().__init__(message)
        self.down_s = down_s


class DistributedTimeoutError(DistributedError):
    """A sibling had no result when `RedisExecutor(timeout=...)` ran out.

    Attributes:
        timeout_s: the executor's timeout, in seconds.
    """

    is_retryable = True

    def __init__(self, message: str, *, timeout_s: float) -> None:
        super().__init__(message)
        self.timeout_s = timeout_s


class PayloadTooLargeError(DistributedError):
    """A job's input or a sibling's result is larger than `max_payload_bytes`.

    Attributes:
        size: the encoded size, in bytes.
        limit: the configured limit, in bytes.
        what: `"input"`, `"result"` or `"tool result"`.
    """

    def __init__(self, message: str, *, size: int, limit: int, what: str) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit
        self.what = what


class PayloadRejectedError(DistributedError):
    """The strict serializer refused a payload (an unknown format, or types not allowed).

    Payloads are LangGraph's msgpack in strict mode: pickle and JSON
    constructors are never accepted, and only types from the sibling graph's
    state schemas (plus `allowed_types`) are rebuilt.

    Attributes:
        blocked: the `module.name` of every type the payload named that is not allowed.
    """

    def __init__(self, message: str, *, blocked: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.blocked = tuple(blocked)


class InputValidationError(DistributedError):
    """A job's input does not fit the sibling graph's input schema (checked on the worker).

    Attributes:
        problems: one line per problem found.
    """

    def __init__(self, message: str, *, problems: Sequence[str]) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


class DeadLetteredError(DistributedError):
    """A job was given up: every worker that took it died before finishing it.

    Attributes:
        deliveries: how many times the job was handed to a worker.
    """

    def __init__(self, message: str, *, deliveries: int) -> None:
        super().__init__(message)
        self.deliveries = deliveries


class ProviderBatchError(LangGraphBatchError):
    """A sibling sent through a provider's batch API (`ProviderBatch`) got no answer.

    Attributes:
        batch_id: the provider's batch id (None: the batch was never created).
        custom_id: the item's `custom_id` in the batch.
    """

    def __init__(self, message: str, *, batch_id: str | None, custom_id: str) -> None:
        super().__init__(message)
        self.batch_id = batch_id
        self.custom_id = custom_id


class BatchItemExpiredError(ProviderBatchError, ModelTimeoutError):
    """The item did not run before the batch's completion window (or `deadline`) ran out.

    OpenAI reports it as `batch_expired` in the error file, Anthropic as an
    `expired` result. Retryable: send it again, in a new batch or synchronously.
    """

    is_retryable = True


class BatchItemFailedError(ProviderBatchError, ModelAPIError):
    """The provider answered the item with an error (its status and message are kept).

    Attributes:
        status: the item's HTTP status, when the provider gave one.
        code: the provider's error code or type (`server_error`, `invalid_request_error`).
    """

    def __init__(
        self,
        message: str,
        *,
        batch_id: str | None,
        custom_id: str,
        status: int | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message, batch_id=batch_id, custom_id=custom_id)
        self.status = status
        self.code = code

    @property
    def is_retryable(self) -> bool:  # type: ignore[override]
        """A server error or a rate limit may succeed again; a bad request will not."""
        if self.status is not None:
            return self.status >= 500 or self.status == 429
        return self.code in ("server_error", "api_error", "overloaded_error", "rate_limit_error")


class BatchItemCanceledError(ProviderBatchError, ModelAPIError):
    """The batch was cancelled before the item ran (retryable: send it again)."""

    @property
    def is_retryable(self) -> bool:  # type: ignore[override]
        """Always: the item never ran."""
        return True
