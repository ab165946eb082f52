"""What the scheduler logs about retries, and what a failure teaches the in-flight limit.

Whether a failed call is sent again, and when, is `BatchPolicy.retry`'s
decision (a `RetryPolicy`: `should_retry`, `interval`), with the call's own
budget when it has one; a stream that already delivered content or tool-call
chunks is never replayed (`Delivery`), since the caller has shown them.

Logging (logger `langgraph_batch.scheduler._retry`): every retry at INFO, and
every call that fails for good at WARNING, each with the request id, the
sibling index inside a fan_out, the error type and the attempt, also as
`extra=` fields (`request_id`, `sibling_index`, `sibling_id`, `error_type`,
`attempt`).
Messages never carry credentials: errors hold URLs and request ids only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from langgraph_batch._context import SiblingInfo
from langgraph_batch.errors import BackendRateLimitError, BackendServerError
from langgraph_batch.scheduler._item import Outcome

__all__ = ("log_failure", "log_retry", "outcome_of")

logger = logging.getLogger(__name__)


def _fields(
    request_id: str, sibling: SiblingInfo | None, exc: BaseException, attempt: int
) -> dict[str, Any]:
    return {
        "request_id": request_id or None,
        "sibling_index": sibling.index if sibling is not None else None,
        "sibling_id": sibling.sibling_id if sibling is not None else None,
        "error_type": type(exc).__name__,
        "attempt": attempt,
    }


def _who(request_id: str, sibling: SiblingInfo | None) -> str:
    rid = request_id or "<no id>"
    return rid if sibling is None else f"{rid} (sibling {sibling.index})"


def log_retry(
    scheduler: str,
    request_id: str,
    sibling: SiblingInfo | None,
    exc: BaseException,
    *,
    attempt: int,
    max_retries: int,
    delay: float,
) -> None:
    """INFO: retry `attempt` of `max_retries` after `exc`, in `delay` seconds."""
    logger.info(
        "scheduler %r: request %s failed with %s; retry %d of %d in %.3f s",
        scheduler,
        _who(request_id, sibling),
        type(exc).__name__,
        attempt,
        max_retries,
        delay,
        extra=_fields(request_id, sibling, exc, attempt),
    )


def log_failure(
    scheduler: str,
    request_id: str,
    sibling: SiblingInfo | None,
    exc: BaseException,
    *,
    attempt: int,
    delivered: int = 0,
) -> None:
    """WARNING: the call failed for good (out of retries, not retryable, or already streamed)."""
    if delivered:
        why = "after streaming content (not retried)"
    elif attempt and getattr(exc, "is_retryable", False):
        why = f"after {attempt} retries"
    else:
        why = "(not retried)"
    logger.warning(
        "scheduler %r: request %s failed with %s %s: %s",
        scheduler,
        _who(request_id, sibling),
        type(exc).__name__,
        why,
        exc,
        extra=_fields(request_id, sibling, exc, attempt),
    )


def outcome_of(exc: BaseException) -> Outcome:
    """How a failed call ended, as the in-flight limit learns from it."""
    if isinstance(exc, asyncio.CancelledError):
        return Outcome.CANCELLED
    if isinstance(exc, BackendRateLimitError):
        return Outcome.RATE_LIMITED
    if isinstance(exc, BackendServerError) and exc.status_code == 503:
        return Outcome.OVERLOADED
    return Outcome.ERROR
