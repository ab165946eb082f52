"""The one place that imports redis-py (lazily) and builds clients.

`redis` is an optional dependency (`pip install 'langgraph-batch[redis]'`):
importing `langgraph_batch.distributed` works without it, and the first
client built says what to install.

Clients retry a command a few times on a dropped connection (redis-py's
`Retry`). A retried write may therefore run twice: every write the
distributed mode makes is idempotent by construction (job ids, HSETNX,
holder ids), never a counter.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = (
    "CLEANUP_ERRORS",
    "CONNECTION_ERRORS",
    "RESPONSE_ERRORS",
    "connect",
    "raise_if_cancel_requested",
    "redis_asyncio",
)


def redis_asyncio() -> Any:
    """The `redis.asyncio` module, or an ImportError that says what to install."""
    try:
        import redis.asyncio as aioredis
    except ImportError:
        raise ImportError(
            "distributed fan_out needs redis-py: pip install 'langgraph-batch[redis]'"
        ) from None
    return aioredis


def _connection_errors() -> tuple[type[BaseException], ...]:
    try:
        import redis.exceptions as rex
    except ImportError:
        return (OSError,)
    return (rex.ConnectionError, rex.TimeoutError, OSError)


CONNECTION_ERRORS: tuple[type[BaseException], ...] = _connection_errors()
"""Errors that mean "Redis did not answer" (worth retrying), not "Redis said no"."""

CLEANUP_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, *CONNECTION_ERRORS)
"""What a time-limited cleanup call may raise."""


def raise_if_cancel_requested() -> None:
    """Raise `CancelledError` when this task was asked to stop and the request got lost.

    Seen in the suite: a task cancelled during a redis-py call went on with
    the call's normal reply and `Task.cancelling() == 1`, so a polling loop
    (waiting for a lease) polled forever and its canceller waited forever. Every
    loop that waits on Redis again calls this first: a pending cancellation
    request always ends the loop.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _response_errors() -> tuple[type[BaseException], ...]:
    try:
        import redis.exceptions as rex
    except ImportError:
        return ()
    return (rex.ResponseError,)


RESPONSE_ERRORS: tuple[type[BaseException], ...] = _response_errors()
"""Errors Redis answered with (e.g. a stream or consumer group that no longer exists)."""


def _redis_version() -> str:
    import redis

    return str(getattr(redis, "__version__", "0"))


def connect(url: str, *, socket_timeout: float = 5.0, **options: Any) -> Any:
    """A `redis.asyncio.Redis` client for `url` with bounded timeouts and a few retries.

    Args:
        url: `redis://[user:password@]host:port/db` or `rediss://...` (TLS;
            `?ssl_ca_certs=/path/ca.pem` and the other redis-py URL options
            apply), or `unix:///path/redis.sock`.
        socket_timeout: seconds a command may take on the wire; blocking
            reads use shorter blocks than this.
        **options: passed to `redis.asyncio.Redis.from_url`.

    Returns:
        The client (connects on first use; close it with `aclose()`).
    """
    aioredis = redis_asyncio()
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialWithJitterBackoff

    options.setdefault("socket_connect_timeout", socket_timeout)
    # Left unset, redis-py looks its own version up in the installed package
    # metadata (file I/O) for every new connection, inside the event loop.
    try:
        from redis.driver_info import DriverInfo

        options.setdefault("driver_info", DriverInfo(lib_version=_redis_version()))
    except ImportError:  # redis-py < 7
        options.setdefault("lib_version", _redis_version())
    options.setdefault("health_check_interval", 10)
    options.setdefault("retry", Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries=3))
    return aioredis.Redis.from_url(url, socket_timeout=socket_timeout, **options)
