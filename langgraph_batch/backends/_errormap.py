"""What a failure becomes in the `langgraph_batch.errors` tree: transport errors and statuses.

**Transport exceptions.** httpcore's exceptions (from the transport's pools)
and httpx's (from a caller-supplied transport, or raised by
`httpx.AsyncClient` itself) map to one library error each, in one function,
as httpx's own `map_httpcore_exceptions` does: `mapped_error` returns it, the
context manager `map_transport_errors` raises it `from` the original. The
phase decides what a broken connection means: before the response (`send`)
it is always safe to send again (`BackendConnectionError`); in a stream the
caller consumes as it arrives (`stream`) it is a `BackendStreamError`
carrying the chunks received.

**HTTP statuses: the one status table** (`STATUS_ERRORS`, read through
`status_error`), as httpx keeps every status in one place and raises from one
(`Response.raise_for_status`). Every backend path reads it:
`error_from_response` for the HTTP backends (a status before a response, a
status before a stream, an error event inside a stream), and
`LangChainBackend` for a provider's exception that carries a status
(`_langchain_errors.map_model_error`). So a status is the same error, equally
retryable, whichever path met it:

| status                     | error                        | retryable |
|----------------------------|------------------------------|-----------|
| 400, 409, 413, 422, other 4xx | `BackendBadRequestError`  | no        |
|   (the message says the prompt does not fit) | `ContextLengthExceededError` | no |
| 401, 403                   | `BackendAuthenticationError` | no        |
| 404, 405                   | `ModelNotFoundError`         | no        |
| 408                        | `BackendTimeoutError`        | yes       |
| 429                        | `BackendRateLimitError`      | yes (`Retry-After` honoured) |
| 500-599 (504 included)     | `BackendServerError`         | yes       |

Decided as the field's clients do (openai-python's `_make_status_error` and
`_should_retry`, the other Stainless SDKs alike; vLLM's server):

- **408 Request Timeout** is the server (or a proxy) giving up on a request
  that came too slowly: nothing ran, sending again may succeed. openai-python
  retries it; so do we (`BackendTimeoutError`), over HTTP as through
  `LangChainBackend` (it was a not-retried bad request over HTTP).
- **405 Method Not Allowed** means the URL is no endpoint for a POST, that is
  a wrong `base_url` or server type, exactly what a route 404 means: both are
  `ModelNotFoundError` ("check base_url"), never retried (it was a bad request
  through `LangChainBackend`). vLLM's batch endpoint probe reads a 405 the same
  way (`is_route_not_found`).
- **504 Gateway Timeout** is a proxy that gave up waiting for the server: the
  server is slow, overloaded or gone, as with 502 and 503. openai-python raises
  its `InternalServerError` for every status >= 500 and retries it; so it is a
  `BackendServerError` on every path (it was a timeout through
  `LangChainBackend` for providers whose errors carry only a status).
- **409 Conflict** stays a bad request: openai-python retries it for lock
  timeouts of OpenAI's own API, which self-hosted inference servers do not have.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, Literal

import httpcore
import httpx

from langgraph_batch._redact import safe_url
from langgraph_batch.backends._errortext import (
    BODY_LIMIT,
    SPACE,
    error_message,
    parse_context_length_message,
    parse_retry_after,
)
from langgraph_batch.backends._pools import CallInfo
from langgraph_batch.errors import (
    BackendAuthenticationError,
    BackendBadRequestError,
    BackendConnectionError,
    BackendError,
    BackendRateLimitError,
    BackendServerError,
    BackendStreamError,
    BackendTimeoutError,
    ContextLengthExceededError,
    ModelNotFoundError,
    PoolTimeoutError,
)

__all__ = (
    "STATUS_ERRORS",
    "Phase",
    "call_context",
    "error_from_response",
    "is_route_not_found",
    "map_transport_errors",
    "mapped_error",
    "status_error",
)

Phase = Literal["send", "body", "stream"]
"""`send`: before the response headers; `body`: reading a body; `stream`: reading a stream."""


# (httpcore class, httpx class) -> what it becomes. Order matters: most specific first.
_TIMEOUTS = (httpcore.TimeoutException, httpx.TimeoutException)
_CONNECT_TIMEOUTS = (httpcore.ConnectTimeout, httpx.ConnectTimeout)
_POOL_TIMEOUTS = (httpcore.PoolTimeout, httpx.PoolTimeout)
_CONNECT_ERRORS = (httpcore.ConnectError, httpx.ConnectError)
_UNSUPPORTED = (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol)
_TRANSPORT_ERRORS = (
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.ProxyError,
    httpx.TransportError,
    ConnectionError,
)


def mapped_error(
    exc: BaseException,
    url: object,
    *,
    request_id: str | None = None,
    read_timeout: float | None = None,
    phase: Phase = "send",
    chunks: int = 0,
) -> BackendError | None:
    """The library error for a transport exception (None: not a transport exception).

    Args:
        exc: what httpcore, httpx or the socket raised.
        url: the URL being called (for the message).
        request_id: the request id sent, if any.
        read_timeout: the read timeout in force (for the message).
        phase: `"send"` until the response headers arrived, then `"body"` (a body
            read whole) or `"stream"` (a stream consumed as it arrives).
        chunks: stream events received before the failure.

    Returns:
        The mapped exception (not raised), or None when `exc` is no transport error.
    """
    where = safe_url(str(url))  # messages never show a password
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, _POOL_TIMEOUTS):
        return PoolTimeoutError(
            f"no connection to {where} became free in time: every connection carries a "
            "request; raise `limits.max_connections` or the pool timeout, or lower max_inflight",
            url=where,
            request_id=request_id,
        )
    if isinstance(exc, _CONNECT_TIMEOUTS):
        return BackendTimeoutError(
            f"connecting to {where} timed out: is the server up and reachable? check base_url",
            url=where,
            request_id=request_id,
        )
    if isinstance(exc, _TIMEOUTS):
        if phase == "stream":
            msg = (
                f"{where} stopped sending for {read_timeout} s after {chunks} chunks: the "
                "server is overloaded or stuck; raise `timeout=` or lower the load"
            )
        else:
            msg = (
                f"{where} did not answer within the read timeout ({read_timeout} s): the "
                "server is overloaded or the generation is long; raise `timeout=` or lower "
                "the load"
            )
        return BackendTimeoutError(msg, url=where, request_id=request_id)
    if isinstance(exc, _CONNECT_ERRORS):
        return BackendConnectionError(
            f"could not connect to {where} ({_describe(exc)}): is the server running? "
            "check base_url",
            url=where,
            request_id=request_id,
        )
    if isinstance(exc, _UNSUPPORTED):
        return BackendConnectionError(
            f"cannot call {where}: {exc}; base_url must start with http:// or https://",
            url=where,
            request_id=request_id,
        )
    if isinstance(exc, httpx.DecodingError):
        return BackendStreamError(
            f"could not decode the response from {where}: {exc}",
            chunks_received=chunks,
            url=where,
            request_id=request_id,
        )
    if isinstance(exc, _TRANSPORT_ERRORS):
        if phase == "body":
            # Nothing reached the caller yet: as safe to retry as a reset.
            return BackendConnectionError(
                f"the connection to {where} dropped while the response was read "
                f"({_describe(exc)}): the server restarted or a proxy cut the response",
                url=where,
                request_id=request_id,
            )
        if phase == "stream":
            return BackendStreamError(
                f"the connection to {where} dropped after the response started ({chunks} "
                f"chunks received; {_describe(exc)}): the server restarted or a proxy cut "
                "the response",
                chunks_received=chunks,
                url=where,
                request_id=request_id,
            )
        # Reset, refused write, "server disconnected without sending a response": no
        # response byte arrived, so the request is always safe to send again.
        return BackendConnectionError(
            f"the connection to {where} failed before a response ({_describe(exc)}): the "
            "server closed or reset it; check that it is still running",
            url=where,
            request_id=request_id,
        )
    return None


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextlib.contextmanager
def map_transport_errors(
    url: object,
    *,
    request_id: str | None = None,
    read_timeout: float | None = None,
    phase: Phase = "send",
) -> Iterator[None]:
    """Translate transport exceptions raised in the block into the error tree.

    Example:
        ```python
        with map_transport_errors(url, request_id="r1", read_timeout=60.0):
            response = await client.get(url)
        ```

    Raises:
        PoolTimeoutError: no connection became free in time.
        BackendTimeoutError: connect, read or write timeout.
        BackendStreamError: the body broke after the response started.
        BackendConnectionError: refused, reset, DNS failure, protocol error.
    """
    try:
        yield
    except Exception as exc:
        mapped = mapped_error(
            exc, url, request_id=request_id, read_timeout=read_timeout, phase=phase
        )
        if mapped is None or mapped is exc:
            raise
        raise mapped from exc


def call_context(request: httpx.Request) -> tuple[str | None, float | None, CallInfo | None]:
    ext = request.extensions
    info = ext.get("lgb")
    timeout = ext.get("timeout")
    read = timeout.get("read") if isinstance(timeout, dict) else None
    if isinstance(info, CallInfo):
        return info.request_id, read, info
    return request.headers.get("x-request-id"), read, None


# ---------------------------------------------------------------------------- status -> error

STATUS_ERRORS: Mapping[int, type[BackendError]] = MappingProxyType(
    {
        401: BackendAuthenticationError,
        403: BackendAuthenticationError,
        404: ModelNotFoundError,
        405: ModelNotFoundError,
        408: BackendTimeoutError,
        429: BackendRateLimitError,
    }
)
"""The statuses whose error is not their family's (other 4xx: `BackendBadRequestError`,
5xx: `BackendServerError`); the module docstring gives the whole table and its reasons."""


def status_error(status: int, message: str = "") -> type[BackendError] | None:
    """The error class of an HTTP status: the one status table, for every backend path.

    Its retryability is the class's `is_retryable`.

    Args:
        status: the HTTP status.
        message: the server's error message, which tells a context-window
            overflow (`ContextLengthExceededError`) from other bad requests.

    Returns:
        The class, or None for a status below 400 (not an error).

    Example:
        ```python
        status_error(408)  # BackendTimeoutError (retryable)
        status_error(504)  # BackendServerError (retryable)
        ```
    """
    if status < 400:
        return None
    cls = STATUS_ERRORS.get(status)
    if cls is not None:
        return cls
    if status >= 500:
        return BackendServerError
    if parse_context_length_message(message)[0]:
        return ContextLengthExceededError
    return BackendBadRequestError


def is_route_not_found(status_code: int, body: bytes) -> bool:
    """True when a 404/405 means "no such endpoint" rather than "no such model".

    Servers answer an unknown model with an OpenAI error object; an unknown
    route gets the web framework's `{"detail": "Not Found"}` or plain text.
    """
    if status_code == 405:
        return True
    if status_code != 404:
        return False
    _, data = error_message(body)
    return not (isinstance(data, dict) and isinstance(data.get("error"), dict | str))


def error_from_response(
    status_code: int,
    body: bytes,
    headers: Mapping[str, str],
    *,
    url: str,
    request_id: str | None = None,
    model: str | None = None,
    available_models: tuple[str, ...] = (),
) -> BackendError:
    """Build the exception for an HTTP error status.

    Args:
        status_code: the HTTP status (>= 400).
        body: the response body.
        headers: the response headers (for `Retry-After`).
        url: the URL called.
        request_id: the request id we sent.
        model: the model asked for (for 404 messages).
        available_models: the models the server lists, when already known.

    Returns:
        The mapped exception (not raised): its class is `status_error`'s.
    """
    url = safe_url(url)  # messages never show a password
    message, _ = error_message(body, headers.get("content-type"))
    message = SPACE.sub(" ", message).strip()
    short = message if len(message) <= 500 else message[:500] + "..."
    body_text = body[:BODY_LIMIT].decode("utf-8", "replace")
    kw: dict[str, Any] = {
        "url": url,
        "status_code": status_code,
        "request_id": request_id,
        "body": body_text,
    }
    cls = status_error(status_code, message)
    if cls is BackendRateLimitError:
        retry_after = parse_retry_after(headers)
        wait = f"retry after {retry_after:.3g} s" if retry_after is not None else "retry later"
        return BackendRateLimitError(
            f"{url} is rate limiting requests (HTTP 429: {short}); {wait} or lower max_inflight",
            retry_after_s=retry_after,
            **kw,
        )
    if cls is BackendServerError:
        return BackendServerError(
            f"{url} failed with HTTP {status_code} ({short}): the server is overloaded, "
            "restarting or crashed; check its logs",
            **kw,
        )
    if cls is BackendTimeoutError:
        return BackendTimeoutError(
            f"{url} gave up waiting for the request (HTTP {status_code}: {short}): the "
            "server or a proxy in front of it timed out; retried",
            **kw,
        )
    if cls is BackendAuthenticationError:
        return BackendAuthenticationError(
            f"{url} refused the request with HTTP {status_code} ({short}): pass the right "
            "`api_key=` (sent as a Bearer token)",
            **kw,
        )
    if cls is ModelNotFoundError:
        if is_route_not_found(status_code, body):
            return ModelNotFoundError(
                f"{url} does not exist on this server (HTTP {status_code}): check base_url "
                "(use http://host:port or http://host:port/v1) and the server type",
                model=model,
                **kw,
            )
        listed = f"; the server serves: {', '.join(available_models)}" if available_models else ""
        return ModelNotFoundError(
            f"the server at {url} does not serve model {model!r} ({short}){listed}; "
            "pass one of its model names as `model=`",
            model=model,
            available=available_models,
            **kw,
        )
    if cls is ContextLengthExceededError:
        _, prompt_tokens, max_model_len = parse_context_length_message(message)
        numbers = []
        if prompt_tokens is not None:
            numbers.append(f"prompt {prompt_tokens} tokens")
        if max_model_len is not None:
            numbers.append(f"max_model_len {max_model_len}")
        detail = f" ({', '.join(numbers)})" if numbers else ""
        return ContextLengthExceededError(
            f"the request does not fit the model's context window{detail}: shorten the "
            f"conversation or lower max_tokens. Server said: {short}",
            prompt_tokens=prompt_tokens,
            max_model_len=max_model_len,
            **kw,
        )
    return BackendBadRequestError(
        f"{url} rejected the request with HTTP {status_code}: {short}",
        **kw,
    )
