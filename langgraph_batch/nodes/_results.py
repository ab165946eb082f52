"""What a fan_out run returns: each sibling's record, collected in input order.

Records travel through the inner graph's private `results` channel as plain
lists (`[index, "ok", value]` or `[index, "error", {...}]`) so they survive
any checkpoint serializer, strict msgpack included. `collect_results` turns
them into the `into` list (a failed sibling's place holds its
`SiblingError`) and applies `on_error`.
"""

from __future__ import annotations

import traceback as tb
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph_batch.errors import SiblingFailedError
from langgraph_batch.nodes._run import FanOutRun
from langgraph_batch.nodes._spec import FanOutSpec

__all__ = ("ERR", "OK", "SiblingError", "collect_results")

OK = "ok"
ERR = "error"


@dataclass(frozen=True, slots=True, kw_only=True)
class SiblingError:
    """A sibling that raised, in its place among the results of `fan_out`.

    Serialisable: it round-trips through LangGraph's checkpoint serializer.
    Under strict msgpack (`LANGGRAPH_STRICT_MSGPACK=true`) annotate the `into`
    key with `SiblingError` (e.g. `list[Review | SiblingError]`) so the
    graph's allowlist includes it, or it comes back as a dict
    (`SiblingError.from_dict` restores it).
    """

    index: int
    """Position of the sibling's item in the input list."""
    item: Any
    """The item the sibling ran on."""
    error_type: str
    """The exception's class name, e.g. `BackendServerError`."""
    message: str
    """`str(exception)`."""
    retryable: bool = False
    """Whether running the sibling again may succeed (the exception's `is_retryable`)."""
    traceback: str | None = None
    """The formatted traceback, when available."""

    @classmethod
    def from_exception(cls, exc: BaseException, *, index: int, item: Any) -> SiblingError:
        """Describe `exc`, raised by sibling `index` running on `item`."""
        retryable = getattr(exc, "is_retryable", None)
        if not isinstance(retryable, bool):
            retryable = isinstance(exc, ConnectionError | TimeoutError)
        return cls(
            index=index,
            item=item,
            error_type=type(exc).__name__,
            message=str(exc),
            retryable=retryable,
            traceback="".join(tb.format_exception(exc)),
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict."""
        return {
            "index": self.index,
            "item": self.item,
            "error_type": self.error_type,
            "message": self.message,
            "retryable": self.retryable,
            "traceback": self.traceback,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SiblingError:
        """Rebuild from `to_dict()` output (or a checkpoint that stored it as a dict)."""
        return cls(
            index=int(data["index"]),
            item=data.get("item"),
            error_type=str(data["error_type"]),
            message=str(data.get("message", "")),
            retryable=bool(data.get("retryable", False)),
            traceback=data.get("traceback"),
        )


# Checkpoints name a class by module and name (msgpack, pickle), and users
# allowlist it that way for strict msgpack: keep the public path they know,
# `langgraph_batch.nodes.fan_out.SiblingError` (which re-exports it), as its
# identity, as numpy's `set_module` does.
SiblingError.__module__ = "langgraph_batch.nodes.fan_out"


def collect_results(spec: FanOutSpec, run: FanOutRun, out: Mapping[str, Any]) -> dict[str, Any]:
    """Collect the records in input order, announce the end, apply `on_error`."""
    results = _in_order(spec, run, out.get("results") or [])
    errors = [r for r in results if isinstance(r, SiblingError)]
    run.done, run.failed = len(results), len(errors)
    gate = run.admission.stats()
    run.emit("done", peak_active=gate.peak_active, pauses=gate.pauses)
    if errors and spec.on_error == "raise":
        first = errors[0]
        raise SiblingFailedError(
            f"fan_out {spec.node_name!r}: {len(errors)} of {len(results)} siblings failed "
            f"(first: sibling {first.index}: {first.error_type}: {first.message}); "
            f"use on_error='collect' to get SiblingError results instead",
            errors=errors,
            results=results,
        )
    out = {spec.into: results}
    if spec.cost_into is not None and run.meter is not None:
        out[spec.cost_into] = run.meter.summary()
    return out


def _in_order(spec: FanOutSpec, run: FanOutRun, records: Sequence[Sequence[Any]]) -> list[Any]:
    by_index: dict[int, Any] = {}
    for rec in records:
        index, kind, value = int(rec[0]), rec[1], rec[2]
        by_index[index] = SiblingError.from_dict(value) if kind == ERR else value
    missing = [i for i in range(run.total) if i not in by_index]
    if missing:
        # Cannot happen unless the checkpoint was edited: say so clearly.
        raise RuntimeError(
            f"fan_out {spec.node_name!r}: no result for siblings {missing[:10]} "
            f"(of {run.total}); the inner checkpoint is inconsistent"
        )
    return [by_index[i] for i in range(run.total)]
