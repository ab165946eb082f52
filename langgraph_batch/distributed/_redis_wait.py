"""Waiting on an unreachable Redis: the one helper, with one cap and one give-up rule.

redis-py's own `Retry` (`_redis.connect`: 3 retries, 0.05 s up to 1 s)
rides over a dropped connection within one command. When it gives up, the
command raises one of `CONNECTION_ERRORS` ("Redis did not answer"). The loops
that must outlive a longer outage (the parent waiting for its siblings'
results, a worker's loop and its job scripts, a lease on the cluster-wide
in-flight cap) wait through `RedisWait`, and nowhere else:

- **what is retried**: `CONNECTION_ERRORS` only. Any answer, an error reply
  (`ResponseError`) included, ends the wait: Redis is there.
- **the spacing**: `REDIS_RETRY` (`langgraph_batch._retry_policy`, the one
  retry value): 0.05 s doubling to **the cap of 1 s**, each wait drawn from
  [0, ceiling] so that many workers do not come back in step.
- **the give-up rule**: an outage is measured from the first failed command
  to the next answer, across every command of the same `RedisWait` (one
  caller). Once it has lasted longer than `give_up_after` seconds (the
  caller's `unavailable_timeout`), the next failure raises
  `RedisUnavailableError`; `give_up_after=None` waits as long as the caller
  still wants the answer (`abandoned()` false: a worker finishing a job it
  still holds). An abandoned wait returns None.
- **cancellation**: a pending cancellation request ends the wait before every
  command and after every pause (`raise_if_cancel_requested`): a task
  cancelled during a redis-py call may see the call's normal reply, so the
  cancellation must not depend on the next `await` alone.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from langgraph_batch._retry_policy import REDIS_RETRY
from langgraph_batch.distributed._redis import CONNECTION_ERRORS, raise_if_cancel_requested
from langgraph_batch.errors import RedisUnavailableError

__all__ = ("RedisWait",)

T = TypeVar("T")


class RedisWait:
    """One caller's waits on Redis: the spacing, the outage clock and the give-up rule.

    Args:
        what: names the caller in logs and in `RedisUnavailableError`.
        give_up_after: seconds an outage may last before `RedisUnavailableError`
            (None: never give up for time).
        hint: what the user can do, appended to the error's message.
        logger: where outages are logged (WARNING per failure, INFO on recovery).
        quiet: log failures at DEBUG instead (a caller that logs its own outage).
        clock: the outage clock (`time.monotonic`; tests pass their own).

    Example:
        ```python
        wait = RedisWait("run 7", give_up_after=60.0)
        reply = await wait.run(client.xread, {key: last}, 512, 500)
        ```
    """

    __slots__ = (
        "_clock",
        "_logger",
        "_retries",
        "_rng",
        "down_since",
        "give_up_after",
        "hint",
        "quiet",
        "what",
    )

    def __init__(
        self,
        what: str,
        *,
        give_up_after: float | None,
        hint: str = "",
        logger: logging.Logger | None = None,
        quiet: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if give_up_after is not None and not give_up_after > 0:
            raise ValueError(f"give_up_after={give_up_after!r} must be > 0 seconds or None")
        self.what = what
        self.give_up_after = give_up_after
        self.hint = hint
        self.quiet = quiet
        self.down_since: float | None = None
        """When the current outage began (on `clock`); None: Redis answers."""
        self._logger = logger or logging.getLogger(__name__)
        self._clock = clock
        self._retries = 0
        self._rng = random.Random()

    def failed(self, exc: BaseException) -> float:
        """Note a command that got no answer; return the seconds to pause before the next.

        Raises:
            RedisUnavailableError: the outage has lasted past `give_up_after`.
        """
        now = self._clock()
        if self.down_since is None:
            self.down_since = now
        down = now - self.down_since
        if self.give_up_after is not None and down > self.give_up_after:
            raise RedisUnavailableError(
                f"{self.what}: Redis unreachable for {down:.0f} s ({type(exc).__name__}: "
                f"{exc}){'; ' + self.hint if self.hint else ''}",
                down_s=down,
            ) from exc
        self._retries += 1
        level = logging.DEBUG if self.quiet else logging.WARNING
        self._logger.log(level, "%s: Redis unreachable (%s); retrying", self.what, exc)
        return REDIS_RETRY.interval(self._retries, self._rng)

    def answered(self) -> None:
        """Note that Redis answered: the outage, if any, is over."""
        if self.down_since is not None:
            self._logger.info(
                "%s: Redis back after %.1f s", self.what, self._clock() - self.down_since
            )
            self.down_since = None
        self._retries = 0

    async def run(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        abandoned: Callable[[], bool] | None = None,
        **kwargs: Any,
    ) -> T | None:
        """`await fn(*args, **kwargs)` until Redis answers (see the module's rules).

        Args:
            fn: the command (a client method or a registered script).
            *args: its arguments.
            abandoned: asked after each failure: True when the caller no
                longer wants the answer (then None is returned).
            **kwargs: its keyword arguments.

        Returns:
            What `fn` returned, or None when the wait was abandoned.

        Raises:
            RedisUnavailableError: the outage lasted past `give_up_after`.
            asyncio.CancelledError: the task was cancelled (or asked to be).
        """
        while True:
            raise_if_cancel_requested()
            try:
                result = await fn(*args, **kwargs)
            except CONNECTION_ERRORS as exc:
                if abandoned is not None and abandoned():
                    return None
                pause = self.failed(exc)
                await asyncio.sleep(pause)
                continue
            self.answered()
            return result
