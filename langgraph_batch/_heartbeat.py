"""LangGraph's idle timeout, fed while the library holds a caller.

LangGraph 1.2 times node attempts out with `TimeoutPolicy(run_timeout,
idle_timeout, refresh_on)` (on `add_node(..., timeout=...)` or
`Send(..., timeout=...)`). `idle_timeout` fires when the attempt shows no
progress for that long; progress is any callback event (`refresh_on="auto"`)
or an explicit `runtime.heartbeat()` (the only signal under
`refresh_on="heartbeat"`).

A model call parked in the scheduler's queue, and a fan_out sibling waiting
for its admission, emit nothing while the library holds them, though they
are not idle: they wait their turn. `held()` wraps such a wait: it calls the
current node's `runtime.heartbeat` when the hold starts, every
`HEARTBEAT_INTERVAL_S` while it lasts (one pump task per event loop beats for
every hold at once), and when it ends. Outside a LangGraph run, or in a node
with no idle timeout, it does nothing (LangGraph's heartbeat is then a no-op,
recognised and skipped). Time the server spends on a call is not a hold: a
hung server is the client timeout's to catch, not the heartbeat's to hide.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import weakref
from collections.abc import Callable, Iterator

__all__ = ("HEARTBEAT_INTERVAL_S", "current_heartbeat", "held")

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 0.2
"""Seconds between heartbeats of a hold (an idle timeout shorter than this may still fire)."""

Heartbeat = Callable[[], None]


def current_heartbeat() -> Heartbeat | None:
    """The running LangGraph node's `runtime.heartbeat`, or None (not in a run, or a no-op)."""
    try:
        from langgraph import runtime as lg_runtime
    except ImportError:  # pragma: no cover - langgraph is a dependency
        return None
    try:
        beat = lg_runtime.get_runtime().heartbeat
    except (RuntimeError, KeyError, AttributeError):  # outside a runnable context
        return None
    if beat is getattr(lg_runtime, "_no_op_heartbeat", None):
        return None
    return beat


class _Pump:
    """Beats every registered heartbeat each interval while any is registered."""

    def __init__(self) -> None:
        self.beats: dict[int, Heartbeat] = {}
        self.task: asyncio.Task[None] | None = None
        self._ids = itertools.count()

    def add(self, beat: Heartbeat) -> int:
        token = next(self._ids)
        self.beats[token] = beat
        _beat(beat)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name="lgb-heartbeat")
        return token

    def remove(self, token: int) -> None:
        beat = self.beats.pop(token, None)
        if beat is not None:
            _beat(beat)

    async def _run(self) -> None:
        while self.beats:
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)
            # Many holds share one node's heartbeat (a fan_out's siblings): beat each once.
            for beat in {id(b): b for b in self.beats.values()}.values():
                _beat(beat)


def _beat(beat: Heartbeat) -> None:
    try:
        beat()
    except Exception:  # a heartbeat must never fail the call it keeps alive
        logger.debug("runtime.heartbeat() raised; ignored", exc_info=True)


_PUMPS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pump] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def held(beat: Heartbeat | None = None) -> Iterator[None]:
    """Keep the current node's idle timeout fed for the duration of the block.

    Args:
        beat: the heartbeat to call (default: `current_heartbeat()`, read here).

    Example:
        ```python
        with held():
            await future  # parked until the scheduler grants a slot
        ```
    """
    if beat is None:
        beat = current_heartbeat()
    if beat is None:
        yield
        return
    loop = asyncio.get_running_loop()
    pump = _PUMPS.get(loop)
    if pump is None:
        pump = _PUMPS[loop] = _Pump()
    token = pump.add(beat)
    try:
        yield
    finally:
        pump.remove(token)
