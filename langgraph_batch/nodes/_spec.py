"""The options of one `FanOutNode`, and what a run does with them before siblings start.

`FanOutSpec` names, types, defaults and checks every option once (a frozen
value, like LangGraph's `CachePolicy`); its methods read the items, find the
scheduler and the server's KV ledger, and build a run's admission gate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, Literal

from langgraph_batch._estimates import CONTEXT_TOKENS_PRIOR, KV_HEADROOM
from langgraph_batch.nodes._admission import SiblingAdmission
from langgraph_batch.nodes._remote import SiblingExecutor
from langgraph_batch.pricing import PriceTable
from langgraph_batch.scheduler import KVLedger
from langgraph_batch.scheduler.registry import find_scheduler, loop_schedulers, scheduler_created

__all__ = ("DEFAULT_SIBLING_TOKENS", "FanOutSpec")

logger = logging.getLogger("langgraph_batch.nodes.fan_out")

DEFAULT_SIBLING_TOKENS = CONTEXT_TOKENS_PRIOR
"""Estimated KV tokens of one sibling's first call before any sibling has shown its own:
the library's one prior, `_estimates.CONTEXT_TOKENS_PRIOR`."""


_DISCOVER_TIMEOUT_S = 1.0
"""How long after its first sibling started a fan_out without `scheduler=` waits for the
scheduler its siblings' models create (admitting one sibling meanwhile)."""


def loop_scheduler() -> Any:
    """The one open scheduler the model calls created in the running loop, if exactly one."""
    found = loop_schedulers()
    return found[0] if len(found) == 1 else None


async def _discover_scheduler(admission: SiblingAdmission, run_done: asyncio.Event) -> Any:
    """The one scheduler of the running loop, once a model creates it (None: gave up).

    The registry announces each scheduler it creates (`scheduler_created`):
    nothing polls. A loop with several schedulers is ambiguous (None at the
    deadline), as is one where no model of the run creates any.
    """
    loop = asyncio.get_running_loop()
    ended = loop.create_task(run_done.wait())
    started = loop.create_task(admission.first_resident.wait())
    deadline: asyncio.Task[None] | None = None
    created: asyncio.Future[Any] | None = None
    try:
        while True:
            found = loop_scheduler()
            if found is not None:
                return found
            created = scheduler_created()
            waits: set[asyncio.Future[Any]] = {created, ended}
            waits.add(deadline if deadline is not None else started)
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if ended in done or (deadline is not None and deadline in done):
                return None
            if deadline is None and started in done:
                # The grace period starts when the first sibling runs.
                deadline = loop.create_task(asyncio.sleep(_DISCOVER_TIMEOUT_S))
    finally:
        for task in (ended, started, deadline, created):
            if task is not None and not task.done():
                task.cancel()


@dataclass(frozen=True, slots=True, kw_only=True)
class FanOutSpec:
    """The options of one fan_out node: named, typed, defaulted and checked here, once.

    `fan_out()` builds one and hands it to `FanOutNode`, which builds it from
    its keywords when given none. Frozen: a node's options never change once
    it is built; what a run learns (its scheduler, the server's KV ledger, the
    gate) lives in that run's `FanOutRun`. The arguments are documented in
    `fan_out`.

    Deliberately not a Runnable: LangGraph searches node functions' closures
    for compiled graphs (xray), and a Runnable here would be searched first.

    Raises:
        TypeError: a `subgraph` without `ainvoke`, `items` that is neither a
            key nor a callable, a `make_input`/`result` that is not callable,
            a `scheduler` that is not a Scheduler or a name, an `executor`
            without `run`.
        ValueError: a bad `items` key, `into`, `on_error`, `max_active`,
            `scheduler` name, `name`, `sibling_tokens` or `kv_headroom`.
    """

    subgraph: Any
    """The graph (or Runnable with `ainvoke`) each sibling runs."""
    items: str | Callable[[Any], Sequence[Any]]
    """The state key holding the items, or `callable(state) -> sequence`."""
    into: str
    """The state key that receives the results, in input order."""
    make_input: Callable[[Any, int], Any] | None = None
    """`(item, index) -> sibling input` (None: the item, a mapping)."""
    result: Callable[[Any], Any] | None = None
    """`final sibling state -> value` to collect (None: the final state)."""
    on_error: Literal["collect", "raise"] = "collect"
    """A failed sibling's `SiblingError` takes its place, or `SiblingFailedError` at the end."""
    max_active: int | None = None
    """Most siblings active at once (None: no cap)."""
    scheduler: Any = None
    """The siblings' `Scheduler`, or its registry name (None: found when they create it)."""
    name: str | None = None
    """The node's name as given (None: `fan_out[<subgraph name>]`, see `node_name`)."""
    sibling_tokens: int = DEFAULT_SIBLING_TOKENS
    """The prior for one sibling's first-call KV tokens (`_estimates.CONTEXT_TOKENS_PRIOR`)."""
    kv_headroom: float = KV_HEADROOM
    """Share of the server's KV capacity resident siblings may fill (`_estimates.KV_HEADROOM`)."""
    executor: SiblingExecutor | None = None
    """Runs the siblings elsewhere (a `SiblingExecutor`); None: in this process."""
    prices: PriceTable | None = None
    """Prices the run's model calls (`langgraph_batch.pricing`); None: no cost."""
    cost_into: str | None = None
    """The state key that receives the run's usage and cost summary (None: none)."""

    def __post_init__(self) -> None:
        if not callable(getattr(self.subgraph, "ainvoke", None)):
            got = type(self.subgraph)
            raise TypeError(f"fan_out needs a compiled graph or Runnable with ainvoke, got {got!r}")
        items = self.items
        if isinstance(items, str):
            if not items:
                raise ValueError("items must be a non-empty state key or a callable(state), got ''")
        elif not callable(items):
            raise TypeError(f"items must be a state key or a callable(state), got {items!r}")
        if not isinstance(self.into, str) or not self.into:
            raise ValueError(f"into must be a non-empty state key, got {self.into!r}")
        for label, fn in (("make_input", self.make_input), ("result", self.result)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{label} must be a callable or None, got {fn!r}")
        if self.on_error not in ("collect", "raise"):
            raise ValueError(f"on_error must be 'collect' or 'raise', got {self.on_error!r}")
        if self.max_active is not None and not _positive_int(self.max_active):
            raise ValueError(f"max_active must be a positive int or None, got {self.max_active!r}")
        _check_scheduler(self.scheduler)
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ValueError(f"name must be a non-empty string or None, got {self.name!r}")
        if not _positive_int(self.sibling_tokens):
            raise ValueError(f"sibling_tokens must be a positive int, got {self.sibling_tokens!r}")
        headroom = self.kv_headroom
        if (
            isinstance(headroom, bool)
            or not isinstance(headroom, int | float)
            or not 0.0 < headroom <= 1.0
        ):
            raise ValueError(f"kv_headroom must be a number in (0, 1], got {headroom!r}")
        if self.prices is not None and not isinstance(self.prices, PriceTable):
            raise TypeError(f"prices must be a PriceTable or None, got {type(self.prices)}")
        if self.cost_into is not None and (
            not isinstance(self.cost_into, str) or not self.cost_into or self.cost_into == self.into
        ):
            raise ValueError(
                f"cost_into must be a non-empty state key other than into, got {self.cost_into!r}"
            )
        if self.executor is not None and not callable(getattr(self.executor, "run", None)):
            raise TypeError(
                f"executor must follow the SiblingExecutor protocol (a run() method), "
                f"got {type(self.executor).__name__}"
            )

    @property
    def node_name(self) -> str:
        """The node's name: `name`, else `fan_out[<subgraph name>]`."""
        if self.name is not None:
            return self.name
        return f"fan_out[{getattr(self.subgraph, 'name', None) or 'subgraph'}]"

    def resolve_items(self, state: Any) -> list[Any]:
        if callable(self.items):
            seq = self.items(state)
        else:
            try:
                seq = state[self.items]
            except (KeyError, TypeError):
                raise KeyError(
                    f"fan_out {self.node_name!r}: the state has no key {self.items!r} to read "
                    f"items from; pass items= the right key or a callable(state)"
                ) from None
        if isinstance(seq, Set):
            raise TypeError(
                f"fan_out {self.node_name!r}: items is a {type(seq).__name__}, which has no input "
                f"order, but results come back in input order; pass a list (for example "
                f"sorted(...) of it)"
            )
        if isinstance(seq, str | bytes) or not isinstance(seq, Sequence):
            raise TypeError(
                f"fan_out {self.node_name!r}: items must be a sequence (a list or tuple), "
                f"got {type(seq).__name__}"
            )
        items = list(seq)
        if self.make_input is None:
            for i, item in enumerate(items):
                if not isinstance(item, Mapping):
                    raise TypeError(
                        f"fan_out {self.node_name!r}: item {i} is a {type(item).__name__}, not a "
                        f"mapping; pass make_input=lambda item, index: {{...}} to build each "
                        f"sibling's input"
                    )
        return items

    def resolve_scheduler(self) -> Any:
        sched = self.scheduler
        if isinstance(sched, str):
            try:
                return find_scheduler(sched)
            except Exception:
                logger.debug("fan_out: no scheduler named %s", sched, exc_info=True)
                return None
        return sched

    async def resolve_kv_capacity(self, scheduler: Any) -> int | None:
        """The server's KV capacity in tokens, as its scheduler knows it (None: unknown).

        The scheduler owns it (`Scheduler.kv_capacity`); a custom scheduler
        without that method gives no KV budget.
        """
        ask = getattr(scheduler, "kv_capacity", None)
        if not callable(ask):
            return None
        try:
            capacity = await ask()
        except Exception:  # unknown capacity means no budget, never a failed run
            logger.debug("fan_out: the scheduler could not say its KV capacity", exc_info=True)
            return None
        if isinstance(capacity, int) and not isinstance(capacity, bool) and capacity > 0:
            return capacity
        return None

    async def resolve_kv_ledger(self, scheduler: Any) -> KVLedger | None:
        """The server's shared KV ledger, as its scheduler keeps it (None: no budget).

        Every run on one scheduler books the same ledger (`Scheduler.kv_ledger`),
        so concurrent runs share the server's capacity. A custom scheduler
        that only says its capacity gets a ledger of this run's own.
        """
        ask = getattr(scheduler, "kv_ledger", None)
        if callable(ask):
            try:
                ledger = await ask()
            except Exception:  # unknown capacity means no budget, never a failed run
                logger.debug("fan_out: the scheduler could not give its KV ledger", exc_info=True)
                return None
            return ledger if isinstance(ledger, KVLedger) else None
        capacity = await self.resolve_kv_capacity(scheduler)
        return None if capacity is None else KVLedger(capacity)

    async def size_later(self, admission: SiblingAdmission, run_done: asyncio.Event) -> None:
        """Size the gate from the scheduler the first sibling's model creates.

        Runs while the gate admits one fresh sibling at a time; gives up (no
        budget, as when the capacity is unknown) when no scheduler appears
        within `_DISCOVER_TIMEOUT_S` after the first sibling started, or the
        run ends.
        """
        ledger: KVLedger | None = None
        try:
            found = await _discover_scheduler(admission, run_done)
            if found is not None:
                ledger = await self.resolve_kv_ledger(found)
        finally:
            admission.set_kv_ledger(ledger)

    async def make_admission(self, scheduler: Any) -> SiblingAdmission:
        """The gate of one run: `max_active` plus the server's shared KV budget when known."""
        return SiblingAdmission(
            max_active=self.max_active,
            kv_ledger=await self.resolve_kv_ledger(scheduler),
            kv_headroom=self.kv_headroom,
            sibling_tokens=self.sibling_tokens,
        )


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_scheduler(scheduler: Any) -> None:
    if scheduler is None:
        return
    if isinstance(scheduler, str):
        if not scheduler:
            raise ValueError("scheduler must be a Scheduler, a registry name or None, got ''")
    elif not callable(getattr(scheduler, "stats", None)):
        hint = (
            "; pass model.get_scheduler() for a BatchedChatModel"
            if callable(getattr(scheduler, "get_scheduler", None))
            else ""
        )
        raise TypeError(
            f"scheduler must be a Scheduler, a registry name or None, "
            f"got {type(scheduler).__name__}{hint}"
        )
