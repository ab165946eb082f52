"""Argument checks of `fan_out`: misuse fails at construction, naming the bad value."""

from __future__ import annotations

from typing import Any

__all__ = ("validate_fan_out",)


def validate_fan_out(
    *,
    subgraph: Any,
    items: Any,
    into: Any,
    make_input: Any,
    result: Any,
    on_error: Any,
    max_active: Any,
    scheduler: Any,
    name: Any,
    sibling_tokens: Any,
    kv_headroom: Any,
    executor: Any = None,
) -> None:
    """Refuse bad `fan_out` arguments at construction, naming the bad value."""
    if not callable(getattr(subgraph, "ainvoke", None)):
        raise TypeError(
            f"fan_out needs a compiled graph or Runnable with ainvoke, got {type(subgraph)!r}"
        )
    if isinstance(items, str):
        if not items:
            raise ValueError("items must be a non-empty state key or a callable(state), got ''")
    elif not callable(items):
        raise TypeError(f"items must be a state key or a callable(state), got {items!r}")
    if not isinstance(into, str) or not into:
        raise ValueError(f"into must be a non-empty state key, got {into!r}")
    for label, fn in (("make_input", make_input), ("result", result)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{label} must be a callable or None, got {fn!r}")
    if on_error not in ("collect", "raise"):
        raise ValueError(f"on_error must be 'collect' or 'raise', got {on_error!r}")
    if max_active is not None and not _positive_int(max_active):
        raise ValueError(f"max_active must be a positive int or None, got {max_active!r}")
    if scheduler is not None:
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
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"name must be a non-empty string or None, got {name!r}")
    if not _positive_int(sibling_tokens):
        raise ValueError(f"sibling_tokens must be a positive int, got {sibling_tokens!r}")
    if (
        isinstance(kv_headroom, bool)
        or not isinstance(kv_headroom, int | float)
        or not 0.0 < kv_headroom <= 1.0
    ):
        raise ValueError(f"kv_headroom must be a number in (0, 1], got {kv_headroom!r}")
    if executor is not None and not callable(getattr(executor, "run", None)):
        raise TypeError(
            f"executor must follow the SiblingExecutor protocol (a run() method), "
            f"got {type(executor).__name__}"
        )


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
