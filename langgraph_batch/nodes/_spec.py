"""The options of one `FanOutNode`: named, typed, defaulted and checked once.

`FanOutSpec` is pure data (a frozen value, like LangGraph's `CachePolicy`).
What a run does with it (read the items, find the scheduler and the server's
KV ledger, build the admission gate) is the run's (`_run.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langgraph_batch._estimates import CONTEXT_TOKENS_PRIOR, KV_HEADROOM
from langgraph_batch.nodes._remote import SiblingExecutor
from langgraph_batch.pricing import PriceTable

__all__ = ("DEFAULT_SIBLING_TOKENS", "FanOutSpec", "check_gate_options")

DEFAULT_SIBLING_TOKENS = CONTEXT_TOKENS_PRIOR
"""Estimated KV tokens of one sibling's first call before any sibling has shown its own:
the library's one prior, `_estimates.CONTEXT_TOKENS_PRIOR`."""


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_gate_options(
    *,
    max_active: int | None = None,
    kv_headroom: float = KV_HEADROOM,
    sibling_tokens: int = CONTEXT_TOKENS_PRIOR,
) -> None:
    """Check a gate's options where they are given (`fan_out`, a worker), once.

    Raises:
        ValueError: a `max_active` or `sibling_tokens` that is not a positive
            int (`max_active` may be None), or a `kv_headroom` outside (0, 1].
    """
    if max_active is not None and not _positive_int(max_active):
        raise ValueError(f"max_active must be a positive int or None, got {max_active!r}")
    if not _positive_int(sibling_tokens):
        raise ValueError(f"sibling_tokens must be a positive int, got {sibling_tokens!r}")
    if (
        isinstance(kv_headroom, bool)
        or not isinstance(kv_headroom, int | float)
        or not 0.0 < kv_headroom <= 1.0
    ):
        raise ValueError(f"kv_headroom must be a number in (0, 1], got {kv_headroom!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class FanOutSpec:
    """The options of one fan_out node: named, typed, defaulted and checked here, once.

    `fan_out()` builds one and hands it to `FanOutNode`, which builds it from
    its keywords when given none. Frozen: a node's options never change once
    it is built; what a run learns (its scheduler, the server's KV ledger, the
    gate) lives in that run's `FanOutRun`, built by `_run.open_run`. The arguments are documented in
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
    """`(item, index) -> sibling input` (None: the item; a mapping, for a graph)."""
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
            raise TypeError(
                f"fan_out needs a compiled graph, a Runnable with ainvoke or a function, "
                f"got {got!r}"
            )
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
        if self.max_active is not None:
            check_gate_options(max_active=self.max_active)
        _check_scheduler(self.scheduler)
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ValueError(f"name must be a non-empty string or None, got {self.name!r}")
        check_gate_options(sibling_tokens=self.sibling_tokens, kv_headroom=self.kv_headroom)
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
