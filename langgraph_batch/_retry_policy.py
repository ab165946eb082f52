"""`RetryPolicy`: the one value that decides retries, and `Delivery`, what a caller has seen.

Modelled on LangGraph's `RetryPolicy` (`langgraph.types`): a small frozen value
with the same fields, read by everything in the library that tries again:

- the scheduler: `BatchPolicy.retry` says which failed calls are sent again,
  how many times and how long each waits (`should_retry`, `interval`);
- the endpoint pool's failover and the scheduler share `Delivery`: a call that
  already delivered output to its caller is never replayed, on another replica
  or at all (the caller has shown that output);
- the distributed parts wait on Redis with the spacing of `REDIS_RETRY`
  (`langgraph_batch.distributed._redis_wait`), under one give-up rule.

It lives below every package (it imports only `errors`) so that backends,
scheduler and distributed code can all read it; `langgraph_batch` and
`langgraph_batch.scheduler` export it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from langgraph_batch.errors import SchedulerError

__all__ = ("REDIS_RETRY", "Delivery", "RetryOn", "RetryPolicy", "default_retry_on")

RetryOn = type[BaseException] | Sequence[type[BaseException]] | Callable[[BaseException], bool]
"""Which errors are retried: a class, classes, or a predicate (LangGraph's `retry_on`)."""


def default_retry_on(exc: BaseException) -> bool:
    """Retry what says it may succeed again (`is_retryable`, langchain-core's convention).

    Backend errors carry it (`BackendServerError`, `BackendRateLimitError`, ...:
    `langgraph_batch.errors`); scheduler errors never do: a closed or dead
    scheduler is not retried.
    """
    return bool(getattr(exc, "is_retryable", False)) and not isinstance(exc, SchedulerError)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How failed calls are retried: how many times, which errors, how long between.

    The fields are LangGraph's `RetryPolicy`'s, with the scheduler's defaults.
    The wait before retry `n` (1-based) is drawn from
    `[0, min(max_interval, initial_interval * backoff_factor ** (n - 1))]` ("full
    jitter": many siblings failing together do not come back together), or is
    that ceiling without `jitter`; a server's `Retry-After` lengthens it.
    (LangGraph adds up to one second to the ceiling instead.)

    Example:
        ```python
        from langgraph_batch import BatchPolicy, RetryPolicy

        policy = BatchPolicy(retry=RetryPolicy(max_attempts=5, max_interval=2.0))
        ```

    Raises:
        ValueError: a field is out of range (the message names it).

    !!! version-added "Added in version 0.2.0"
    """

    initial_interval: float = 0.25
    """Seconds: the first retry's wait ceiling."""
    backoff_factor: float = 2.0
    """The ceiling is multiplied by this per retry."""
    max_interval: float = 8.0
    """Seconds: the largest ceiling (a server's `Retry-After` may exceed it)."""
    max_attempts: int = 3
    """Attempts in all, the first included (`max_attempts - 1` retries)."""
    jitter: bool = True
    """Draw each wait from [0, ceiling] (full jitter); False: wait the ceiling."""
    retry_on: RetryOn = default_retry_on
    """The errors retried: a class, classes, or a predicate (default: `is_retryable`)."""

    def __post_init__(self) -> None:
        for name in ("initial_interval", "max_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"{name}={value!r} must be >= 0 seconds")
        if self.max_interval < self.initial_interval:
            raise ValueError(
                f"max_interval={self.max_interval!r} must be >= "
                f"initial_interval={self.initial_interval!r}"
            )
        if not self.backoff_factor >= 1:
            raise ValueError(f"backoff_factor={self.backoff_factor!r} must be >= 1")
        attempts = self.max_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"max_attempts={attempts!r} must be an integer >= 1")

    @property
    def max_retries(self) -> int:
        """Retries after the first attempt: `max_attempts - 1`."""
        return self.max_attempts - 1

    def retries_on(self, exc: BaseException) -> bool:
        """Whether `exc` is an error this policy retries (`retry_on`), attempts aside."""
        rule = self.retry_on
        if isinstance(rule, type):
            return isinstance(exc, rule)
        if isinstance(rule, Sequence):
            return isinstance(exc, tuple(rule))
        return bool(rule(exc))

    def should_retry(
        self,
        exc: BaseException,
        *,
        attempt: int,
        delivery: Delivery | None = None,
        max_retries: int | None = None,
    ) -> bool:
        """May the call that failed with `exc` be sent again?

        Args:
            exc: the failure.
            attempt: retries already made (0 after the first attempt failed).
            delivery: what the call delivered to its caller: a call that
                delivered output is never replayed.
            max_retries: the call's own retry budget (None: `max_attempts - 1`).

        Example:
            ```python
            RetryPolicy().should_retry(BackendServerError("503"), attempt=0)  # True
            ```
        """
        budget = self.max_retries if max_retries is None else max_retries
        return (
            attempt < budget and (delivery is None or delivery.replayable) and self.retries_on(exc)
        )

    def interval(
        self, retry: int, rng: random.Random | None = None, *, retry_after: float | None = None
    ) -> float:
        """Seconds to wait before retry `retry` (1-based), at least `retry_after`.

        Args:
            retry: which retry this is (1: the first).
            rng: the random source of the jitter (default: the `random` module's).
            retry_after: the server's `Retry-After`, in seconds, when it sent one.
        """
        try:
            ceiling = min(
                self.max_interval, self.initial_interval * self.backoff_factor ** (retry - 1)
            )
        except OverflowError:  # a long outage's thousandth wait
            ceiling = self.max_interval
        delay = (rng or random).uniform(0.0, ceiling) if self.jitter else ceiling
        if retry_after is not None and retry_after > delay:
            delay = float(retry_after)
        return delay


REDIS_RETRY = RetryPolicy(initial_interval=0.05, backoff_factor=2.0, max_interval=1.0)
"""The spacing of every wait on an unreachable Redis: 0.05 s doubling to a 1 s cap,
jittered (many workers come back after a restart without a stampede). A Redis outage
is bounded by time, not attempts (`langgraph_batch.distributed._redis_wait`), so its
`max_attempts` is not read there."""


class _Output(Protocol):
    """A streamed chunk (`backends.base.ChatChunk`), as far as delivery goes."""

    @property
    def content(self) -> object: ...
    @property
    def tool_call_chunks(self) -> object: ...


_Chunk = TypeVar("_Chunk", bound=_Output)


class Delivery:
    """Counts what a call delivered to its caller; a call that delivered output is never replayed.

    Output is a streamed chunk with content or tool-call fragments: those are
    what a caller shows or acts on. A stream that fails before its first such
    chunk (after a role-only chunk, say) may be sent again like any call. The
    scheduler's retries and the endpoint pool's failover both ask `replayable`.

    Example:
        ```python
        delivery = Delivery()
        response = await backend.chat(request, on_chunk=delivery.wrap(on_chunk))
        ...
        if not delivery.replayable:
            raise  # the caller has seen part of this answer
        ```
    """

    __slots__ = ("delivered",)

    def __init__(self) -> None:
        self.delivered = 0
        """Chunks with output that reached the caller."""

    @property
    def replayable(self) -> bool:
        """True while nothing the caller could show has reached it."""
        return not self.delivered

    def wrap(self, on_chunk: Callable[[_Chunk], None]) -> Callable[[_Chunk], None]:
        """`on_chunk`, counting the output chunks it passes on."""
        forward = on_chunk

        def counted(chunk: _Chunk) -> None:
            if chunk.content or chunk.tool_call_chunks:
                self.delivered += 1
            forward(chunk)

        return counted
