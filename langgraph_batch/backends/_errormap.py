"""The one table that turns transport exceptions into the `langgraph_batch.errors` tree.

httpcore's exceptions (from the transport's pools) and httpx's (from a
caller-supplied transport, or raised by `httpx.AsyncClient` itself) map to
one library error each, in one function, as httpx's own
`map_httpcore_exceptions` does: `mapped_error` returns it, the context manager
`map_transport_errors` raises it `from` the original. The phase decides what
a broken connection means: before the response (`send`) it is always safe to
send again (`BackendConnectionError`); in a stream the caller consumes as it
arrives (`stream`) it is a `BackendStreamError` carrying the chunks received.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import httpcore
import httpx

from langgraph_batch.backends._pools import CallInfo
from langgraph_batch.errors import (
    BackendConnectionError,
    BackendError,
    BackendStreamError,
    BackendTimeoutError,
    PoolTimeoutError,
)

__all__ = ("Phase", "call_context", "map_transport_errors", "mapped_error")

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
    where = str(url)
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
