"""`SchedulerState`: where a `Scheduler` is in its lifecycle."""

from __future__ import annotations

import enum

__all__ = ("SchedulerState",)


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
