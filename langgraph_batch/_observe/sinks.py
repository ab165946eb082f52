"""The one observation seam: what the scheduler, fan_out and the tools report.

The library records its own events in three places: the scheduler's
`StatsRecorder` (each call answered, failed, retried, cancelled; each batch
sent), `FanOutRun` (each sibling started, finished, failed) and the tool
counters. Each of them also calls the functions here, which hand the event to
the sinks that are subscribed (`langgraph_batch.metrics` is one). With no
sink subscribed, every function is one module-global truth test: the
observation costs nothing until someone asks for it.

A sink implements any subset of `Sink`'s methods; the ones it lacks are not
called. Sinks run inline on the caller's thread (often the event loop): they
must be quick and must not raise (an exception is logged once and the sink
is dropped, so observation can never break a run).

Example:
    ```python
    from langgraph_batch._observe import sinks

    class Printer:
        def on_call(self, call: sinks.CallRecord) -> None:
            print(call.scheduler, call.queue_wait, call.latency)

    sinks.subscribe(Printer())
    ```
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from langgraph_batch.backends.base import Usage

__all__ = (
    "CallRecord",
    "Sink",
    "active",
    "batch",
    "call",
    "dispatch",
    "failure",
    "retry",
    "sibling",
    "subscribe",
    "unsubscribe",
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One scheduled call that returned a response."""

    scheduler: str
    """The scheduler's name (never a credential: see `Scheduler.name`)."""
    queue_wait: float
    """Seconds from submit to the slot grant (all attempts)."""
    latency: float
    """Seconds from submit to the response, retries and backoff included."""
    usage: Usage | None
    """What the server reported, if it did."""


class Sink(Protocol):
    """What a subscriber may implement (every method is optional)."""

    def on_dispatch(self, scheduler: str) -> None: ...
    def on_call(self, call: CallRecord) -> None: ...
    def on_failure(self, scheduler: str, error_type: str) -> None: ...
    def on_retry(self, scheduler: str, error_type: str) -> None: ...
    def on_batch(self, scheduler: str, size: int) -> None: ...
    def on_sibling(self, node: str, event: str) -> None: ...


_sinks: tuple[Any, ...] = ()
_ACTIVE = False


def active() -> bool:
    """Whether any sink is subscribed (callers skip building records otherwise)."""
    return _ACTIVE


def subscribe(sink: Any) -> None:
    """Add `sink` (idempotent: a sink already subscribed is not added twice)."""
    global _sinks, _ACTIVE
    if not any(s is sink for s in _sinks):
        _sinks = (*_sinks, sink)
    _ACTIVE = True


def unsubscribe(sink: Any) -> None:
    """Remove `sink` (no-op when it is not subscribed)."""
    global _sinks, _ACTIVE
    _sinks = tuple(s for s in _sinks if s is not sink)
    _ACTIVE = bool(_sinks)


def _deliver(method: str, *args: Any) -> None:
    for sink in _sinks:
        fn = getattr(sink, method, None)
        if fn is None:
            continue
        try:
            fn(*args)
        except Exception:
            logger.warning(
                "observation sink %r failed in %s and was unsubscribed",
                type(sink).__name__,
                method,
                exc_info=True,
            )
            unsubscribe(sink)


def dispatch(scheduler: str) -> None:
    """A scheduled call's attempt goes on the wire."""
    if _ACTIVE:
        _deliver("on_dispatch", scheduler)


def call(scheduler: str, queue_wait: float, latency: float, usage: Usage | None) -> None:
    """A scheduled call returned a response."""
    if _ACTIVE:
        _deliver("on_call", CallRecord(scheduler, queue_wait, latency, usage))


def failure(scheduler: str, exc: BaseException) -> None:
    """A scheduled call raised to its caller (after its retries)."""
    if _ACTIVE:
        _deliver("on_failure", scheduler, type(exc).__name__)


def retry(scheduler: str, exc: BaseException) -> None:
    """A scheduled call failed and will be retried."""
    if _ACTIVE:
        _deliver("on_retry", scheduler, type(exc).__name__)


def batch(scheduler: str, size: int) -> None:
    """The scheduler sent `size` requests as one batch."""
    if _ACTIVE:
        _deliver("on_batch", scheduler, size)


def sibling(node: str, event: str) -> None:
    """A fan_out sibling `started`, `finished` or `failed` (node: the fan_out node)."""
    if _ACTIVE:
        _deliver("on_sibling", node, event)
