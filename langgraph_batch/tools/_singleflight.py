"""Single-flight coalescing, result reuse and per-key-space limits, independent of LangGraph.

`Coalescer.run(key, fn, scope=...)` runs `fn` once for every group of callers
that ask for the same `key` in the same `scope` at the same time (single
flight). A scope is a partition: calls of two scopes never share an
execution or a result (`langgraph_batch.tools` uses one scope per fan_out run
or LangGraph root run, so nothing crosses runs, threads or users). With
`keep=True` the successful result is also kept for later callers of the same
scope, for at most `ttl` seconds when a `ttl` is set. Executions are capped
by an optional semaphore (`max_concurrency`) and an optional rate limiter
(`rate_limit`, calls per second), both asynchronous and shared by all scopes
(they protect the tool's backend, not a caller).

Cancellation: the execution runs in its own task and every caller awaits it
through `asyncio.shield`, so a cancelled caller (the one that started it
included) never fails the others; when the last caller is cancelled, the
execution is cancelled too.

Across processes: `set_flight_store(store)` makes every execution whose
result is kept (`keep=True`) go through `store.run(...)` (the distributed
worker installs a Redis single flight there, so identical calls of one run
execute once across its workers; the store shares only within the run, even
for a `"global"` scope); the in-process single flight still happens first.
Calls that keep nothing (in-flight sharing only) never leave the process.

`langgraph_batch.tools` builds the ToolNode and `create_agent` hooks on this.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

__all__ = (
    "ANY_SCOPE",
    "Coalescer",
    "FlightStore",
    "RateLimiter",
    "check_limits",
    "set_flight_store",
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[Any]]

_MISS: Any = object()

ANY_SCOPE: Any = object()
"""`Coalescer.waiting(key, scope=ANY_SCOPE)`: count the callers of every scope."""


def check_limits(
    *, ttl: float | None, max_concurrency: int | None, rate_limit: float | None
) -> None:
    """Refuse out-of-range limits (`Coalescer` and `CoalescePolicy` both check with this).

    Raises:
        ValueError: naming the limit and its value.
    """
    if ttl is not None and not ttl > 0:
        raise ValueError(f"ttl must be > 0 seconds or None, got {ttl!r}")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency!r}")
    if rate_limit is not None and not rate_limit > 0:
        raise ValueError(f"rate_limit must be > 0 calls per second or None, got {rate_limit!r}")


class FlightStore(Protocol):
    """Shares one execution of a kept call beyond this process (see `set_flight_store`)."""

    async def run(
        self,
        scope: Hashable,
        key: Hashable,
        fn: Callable[[], Awaitable[Any]],
        storable: Callable[[Any], bool],
        *,
        ttl: float | None = None,
    ) -> Any:
        """Return another process's result for `(scope, key)`, or run `fn` and share it.

        Only results for which `storable(result)` is true may be shared, for
        at most `ttl` seconds when it is set.
        """
        ...


_flight_store: FlightStore | None = None


def set_flight_store(store: FlightStore | None) -> FlightStore | None:
    """Route every kept execution of every `Coalescer` through `store` (None: stop).

    Returns:
        The store installed before.

    Example:
        ```python
        previous = set_flight_store(RedisFlightStore(...))
        try:
            ...
        finally:
            set_flight_store(previous)
        ```
    """
    global _flight_store
    previous, _flight_store = _flight_store, store
    return previous


class RateLimiter:
    """Asynchronous rate limiter: at most `rate` starts per second, `burst` at once.

    A virtual-scheduling token bucket (GCRA): each `acquire()` reserves the
    next free start time and sleeps until then with the injected `sleep`
    (`asyncio.sleep` by default), so waiting never blocks the event loop and
    callers start in arrival order.

    Example:
        ```python
        limiter = RateLimiter(5.0)  # 5 starts per second, evenly spaced
        await limiter.acquire()
        ```
    """

    def __init__(
        self,
        rate: float,
        *,
        burst: int = 1,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """Create a limiter.

        Args:
            rate: Starts per second, `> 0`.
            burst: Starts allowed back to back before spacing applies, `>= 1`.
            clock: Monotonic clock in seconds (injectable for tests).
            sleep: Async sleep (injectable for tests).

        Raises:
            ValueError: If `rate <= 0` or `burst < 1`.
        """
        if not rate > 0:
            raise ValueError(f"rate_limit must be > 0 calls per second, got {rate!r}")
        if burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst!r}")
        self.rate = float(rate)
        self.burst = burst
        self._interval = 1.0 / self.rate
        self._tolerance = (burst - 1) * self._interval
        self._clock = clock
        self._sleep = sleep
        self._tat: float | None = None  # theoretical arrival time of the next start

    def reserve(self) -> float:
        """Reserve the next start; return how many seconds to wait for it (pure, sync)."""
        now = self._clock()
        tat = now if self._tat is None else max(self._tat, now)
        wait = tat - self._tolerance - now
        self._tat = tat + self._interval
        return max(0.0, wait)

    async def acquire(self) -> None:
        """Wait until this caller may start.

        A caller cancelled while it waits gives its start back when no later
        caller has reserved one since (a start cannot be given back from the
        middle of the queue without moving everyone behind it).
        """
        wait = self.reserve()
        if wait > 0:
            reserved = self._tat
            try:
                await self._sleep(wait)
            except asyncio.CancelledError:
                if self._tat == reserved and reserved is not None:
                    self._tat = reserved - self._interval
                raise


@dataclass(eq=False)
class _Flight:
    task: asyncio.Task[Any]
    waiters: int = 0


@dataclass(eq=False)
class _LoopState:
    flights: dict[tuple[Hashable, Hashable], _Flight] = field(default_factory=dict)
    semaphore: asyncio.Semaphore | None = None
    limiter: RateLimiter | None = None


class Coalescer(Generic[T]):
    """Share one execution among identical concurrent (and, optionally, later) calls.

    Each call names a hashable `key` and a `scope`; calls with equal keys in
    the same scope that overlap in time share one execution of the first
    caller's `fn`. With `keep=True`, a caller that arrives after a successful
    execution of its scope gets the stored result (within `ttl` seconds of
    it, when a `ttl` is set). Errors and unshareable results are never stored,
    and nothing is ever shared between two scopes.

    In-flight executions, the semaphore and the rate limiter belong to the
    running event loop (one set per loop); stored results are kept per scope,
    for the `max_scopes` most recently used scopes.

    Example:
        ```python
        coalescer: Coalescer[str] = Coalescer(ttl=60.0, max_concurrency=4)

        async def fetch() -> str:
            return await http_get("https://example.com/weather?city=Paris")

        # 50 siblings of one run asking at once -> one fetch, 50 identical answers
        results = await asyncio.gather(
            *(coalescer.run(("weather", "Paris"), fetch, scope="run-1", keep=True)
              for _ in range(50))
        )
        ```
    """

    MISS: Any = _MISS
    """Returned by `lookup` when nothing is stored."""

    def __init__(
        self,
        *,
        ttl: float | None = None,
        max_concurrency: int | None = None,
        rate_limit: float | None = None,
        share_errors: bool = True,
        max_scopes: int = 256,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """Create a coalescer.

        Args:
            ttl: Reuse a kept result for at most this many seconds (`> 0`);
                None: as long as its scope is kept.
            max_concurrency: At most this many executions at once (`>= 1`).
            rate_limit: At most this many execution starts per second (`> 0`).
            share_errors: When the shared execution fails, give its error to
                every caller waiting on it. False: each waiting caller runs
                its own execution instead (again single-flight among them).
            max_scopes: Scopes whose results are kept; the least recently
                used scope is forgotten beyond this (`>= 1`).
            clock: Monotonic clock for the TTL and the rate limiter.
            sleep: Async sleep for the rate limiter.

        Raises:
            ValueError: If a limit is out of range.
        """
        check_limits(ttl=ttl, max_concurrency=max_concurrency, rate_limit=rate_limit)
        if max_scopes < 1:
            raise ValueError(f"max_scopes must be >= 1, got {max_scopes!r}")
        self.ttl = ttl
        self.max_concurrency = max_concurrency
        self.rate_limit = rate_limit
        self.share_errors = share_errors
        self.max_scopes = max_scopes
        self._clock = clock
        self._sleep = sleep
        # scope -> key -> (expiry or None, value)
        self._scopes: OrderedDict[Hashable, dict[Hashable, tuple[float | None, T]]] = OrderedDict()
        self._inserts = 0
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )

    # -- stored results -------------------------------------------------------------

    def lookup(self, key: Hashable, *, scope: Hashable = None) -> Any:
        """The result kept for `key` in `scope` (unexpired), or the `MISS` sentinel."""
        stored = self._scopes.get(scope)
        if stored is None:
            return _MISS
        entry = stored.get(key)
        if entry is None:
            return _MISS
        expires, value = entry
        if expires is not None and self._clock() >= expires:
            del stored[key]
            return _MISS
        self._scopes.move_to_end(scope)
        return value

    def _store(self, key: Hashable, scope: Hashable, value: T) -> None:
        stored = self._scopes.get(scope)
        if stored is None:
            stored = self._scopes[scope] = {}
            while len(self._scopes) > self.max_scopes:
                self._scopes.popitem(last=False)
        else:
            self._scopes.move_to_end(scope)
        now = self._clock()
        stored[key] = (None if self.ttl is None else now + self.ttl, value)
        self._inserts += 1
        if self.ttl is not None and self._inserts % 256 == 0:
            # A long-lived scope (scope="global") would otherwise keep every
            # expired key: sweep them now and then.
            for k in [k for k, (exp, _) in stored.items() if exp is not None and exp <= now]:
                del stored[k]

    def forget_scope(self, scope: Hashable) -> None:
        """Drop the results kept for `scope` (e.g. when its fan_out run ends)."""
        self._scopes.pop(scope, None)

    def clear(self) -> None:
        """Drop every stored result (in-flight executions are not affected)."""
        self._scopes.clear()

    def stored_scopes(self) -> int:
        """How many scopes have kept results."""
        return len(self._scopes)

    # -- execution ------------------------------------------------------------------

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = self._loops[loop] = _LoopState()
            if self.max_concurrency is not None:
                state.semaphore = asyncio.Semaphore(self.max_concurrency)
            if self.rate_limit is not None:
                state.limiter = RateLimiter(self.rate_limit, clock=self._clock, sleep=self._sleep)
        return state

    def inflight(self) -> int:
        """Executions running (or waiting for a limit) in the current loop."""
        return len(self._state().flights)

    def waiting(self, key: Hashable, *, scope: Hashable = ANY_SCOPE) -> int:
        """Callers (the ones that started executions included) awaiting executions for `key`.

        Args:
            key: The call key.
            scope: Count only this scope's callers; default: every scope's.
        """
        flights = self._state().flights
        if scope is not ANY_SCOPE:
            flight = flights.get((scope, key))
            return 0 if flight is None else flight.waiters
        return sum(f.waiters for (_, k), f in flights.items() if k == key)

    async def _limited(self, fn: Callable[[], Awaitable[T]], state: _LoopState) -> T:
        if state.semaphore is None:
            if state.limiter is not None:
                await state.limiter.acquire()
            return await fn()
        async with state.semaphore:
            if state.limiter is not None:
                await state.limiter.acquire()
            return await fn()

    async def _execute(
        self,
        fk: tuple[Hashable, Hashable],
        flight_ref: list[_Flight],
        fn: Callable[[], Awaitable[T]],
        state: _LoopState,
        storable: Callable[[T], bool],
        keep: bool,
    ) -> T:
        value: T
        try:
            store = _flight_store
            if store is not None and keep and fk[0] is not None:
                value = await store.run(
                    fk[0], fk[1], lambda: self._limited(fn, state), storable, ttl=self.ttl
                )
            else:
                value = await self._limited(fn, state)
        finally:
            # Leave the in-flight table before the waiters wake up, so that a
            # caller arriving afterwards sees the stored result (or starts anew).
            if flight_ref and state.flights.get(fk) is flight_ref[0]:
                del state.flights[fk]
        if storable(value):
            self._store(fk[1], fk[0], value)
        return value

    async def run(
        self,
        key: Hashable,
        fn: Callable[[], Awaitable[T]],
        *,
        scope: Hashable = None,
        keep: bool = False,
        shareable: Callable[[T], bool] | None = None,
        is_error: Callable[[T], bool] | None = None,
        share_exception: Callable[[BaseException], bool] | None = None,
    ) -> T:
        """Run `fn`, or share the result of an identical execution of the same scope.

        Args:
            key: What makes two calls identical.
            fn: Produces the result; called at most once per execution, in a
                task of its own that copies the caller's context.
            scope: The partition: only calls of the same scope share.
            keep: Keep a successful result for later callers of this scope
                (for at most `ttl` seconds when set).
            shareable: False for a result only its own caller may have (for
                example a LangGraph `Command`): waiting callers then run
                their own execution. Default: every result is shareable.
            is_error: True for a result that reports an error (for example a
                ToolMessage with status "error"): shared like a raised error
                (see `share_errors`) and never stored.
            share_exception: False for an exception that belongs to the
                caller that ran it (for example a LangGraph interrupt); other
                callers then run their own execution. Consulted only when
                `share_errors` is True.

        Returns:
            The result of `fn` (this caller's, or the shared one).

        Raises:
            BaseException: What `fn` raised, when it is this caller's or shared.
            asyncio.CancelledError: When this caller is cancelled.
        """

        def storable(value: T) -> bool:
            return (
                keep
                and (shareable is None or shareable(value))
                and (is_error is None or not is_error(value))
            )

        while True:
            if keep:
                hit = self.lookup(key, scope=scope)
                if hit is not _MISS:
                    return hit  # type: ignore[no-any-return]
            state = self._state()
            fk = (scope, key)
            flight = state.flights.get(fk)
            leader = flight is None
            if flight is None:
                ref: list[_Flight] = []
                task = asyncio.get_running_loop().create_task(
                    self._execute(fk, ref, fn, state, storable, keep)
                )
                task.add_done_callback(_retrieve)
                flight = _Flight(task)
                ref.append(flight)
                state.flights[fk] = flight
            flight.waiters += 1
            try:
                value: T = await asyncio.shield(flight.task)
            except asyncio.CancelledError:
                flight.waiters -= 1
                me = asyncio.current_task()
                if me is not None and me.cancelling():
                    # This caller is cancelled; the last one out cancels the execution.
                    if flight.waiters == 0 and not flight.task.done():
                        flight.task.cancel()
                        if state.flights.get(fk) is flight:
                            del state.flights[fk]
                    raise
                # The execution cancelled itself: nobody's result to share.
                if leader:
                    raise
                continue
            except BaseException as exc:
                flight.waiters -= 1
                if leader:
                    raise
                if self.share_errors and (share_exception is None or share_exception(exc)):
                    raise
                continue
            flight.waiters -= 1
            if leader:
                return value
            if shareable is not None and not shareable(value):
                continue
            if not self.share_errors and is_error is not None and is_error(value):
                continue
            return value


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Done callback of an execution: mark its exception retrieved.

    An execution whose callers all left (cancelled) may still end with an
    error nobody awaits; asyncio would log it at garbage collection as "never
    retrieved". It is logged here at DEBUG instead (its callers were gone).
    """
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.debug("coalesced execution ended with %s", type(exc).__name__)
