"""`SchedulerState` and `Lifecycle`: where a `Scheduler` is in its life, shared by its parts.

The scheduler's parts (`_dispatch.DispatchLoop`, `_attempt.RequestAttempts`)
each receive the one `Lifecycle` of their scheduler: they read its state, set
it when the runner dies or its loop shuts down, and refuse work with its
`refusal()`.
"""

from __future__ import annotations

import enum

from langgraph_batch.errors import SchedulerClosedError, SchedulerDeadError, SchedulerError

__all__ = ("Lifecycle", "SchedulerState")


class SchedulerState(enum.Enum):
    """Where a `Scheduler` is in its lifecycle (like `httpx`'s `ClientState`).

    Example:
        ```python
        s = Scheduler(backend)
        assert s.state is SchedulerState.UNOPENED
        async with s:
            assert s.state is SchedulerState.OPENED
        assert s.state is SchedulerState.CLOSED
        ```
    """

    UNOPENED = 1
    """Created; the runner starts on `__aenter__` or the first `submit`."""
    OPENED = 2
    """Running in its event loop."""
    CLOSED = 3
    """`aclose()` was called (or its event loop shut down); cannot be reopened."""
    DEAD = 4
    """The runner died; every request fails with `SchedulerDeadError`."""


class Lifecycle:
    """One scheduler's state, the cause of its death, and the error that refuses work.

    Args:
        name: the scheduler's name (for messages).
    """

    __slots__ = ("dead_cause", "name", "state")

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = SchedulerState.UNOPENED
        self.dead_cause: BaseException | None = None
        """What killed the runner (set with `SchedulerState.DEAD`)."""

    @property
    def opened(self) -> bool:
        """True while the scheduler runs and takes work."""
        return self.state is SchedulerState.OPENED

    def refusal(self) -> SchedulerError:
        """The error for work the scheduler cannot take: dead (with its cause) or closed."""
        if self.state is SchedulerState.DEAD:
            cause = self.dead_cause
            err: SchedulerError = SchedulerDeadError(
                f"scheduler {self.name!r} is dead: its runner failed with {cause!r}. "
                "Create a new Scheduler (scheduler_for(...) replaces dead ones).",
                cause=cause,
            )
            err.__cause__ = cause
            return err
        return SchedulerClosedError(
            f"scheduler {self.name!r} is closed and cannot be reopened or take work; "
            "create a new Scheduler (scheduler_for(...) replaces closed ones)."
        )
