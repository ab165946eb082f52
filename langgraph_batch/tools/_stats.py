"""Tool-call counters: requested vs executed, per tool name, per fan_out run, per process.

`BatchToolNode` and `BatchMiddleware` count every tool call of an async run;
`fan_out` progress events and the benchmarks read them with `tool_stats()`
(with coalescing, "executed" equals the number of distinct call keys).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ("ToolStats", "reset_tool_stats", "tool_stats")


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolStats:
    """Tool calls requested vs executed (a snapshot).

    `requested - shared` calls ran the tool themselves; with coalescing,
    `executed` equals the number of distinct call keys.

    Example:
        ```python
        stats = tool_stats(group=sibling.group)
        print(stats.requested, stats.executed, stats.by_tool["search"].shared)
        ```
    """

    requested: int = 0
    """Tool calls that reached the hook."""
    executed: int = 0
    """Times a tool actually ran."""
    shared: int = 0
    """Calls answered by another call's execution (in flight or stored)."""
    errors: int = 0
    """Executions that raised or returned an error `ToolMessage`."""
    by_tool: Mapping[str, ToolStats] = field(default_factory=dict)
    """The same counters per tool name (their `by_tool` is empty)."""


_FIELDS = ("requested", "executed", "shared", "errors")


class _Counters:
    def __init__(self) -> None:
        self.by_tool: dict[str, list[int]] = {}

    def add(self, tool: str, index: int) -> None:
        row = self.by_tool.get(tool)
        if row is None:
            row = self.by_tool[tool] = [0, 0, 0, 0]
        row[index] += 1

    def snapshot(self) -> ToolStats:
        totals = [0, 0, 0, 0]
        per_tool: dict[str, ToolStats] = {}
        for name, row in self.by_tool.items():
            per_tool[name] = _stats_of(row, {})
            totals = [a + b for a, b in zip(totals, row, strict=True)]
        return _stats_of(totals, per_tool)


def _stats_of(row: list[int], by_tool: dict[str, ToolStats]) -> ToolStats:
    return ToolStats(
        requested=row[0], executed=row[1], shared=row[2], errors=row[3], by_tool=by_tool
    )


class _StatsRegistry:
    max_groups = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()  # loops in several threads may count at once
        self.total = _Counters()
        self.groups: OrderedDict[str, _Counters] = OrderedDict()

    def add(self, tool: str, group: str | None, what: str) -> None:
        index = _FIELDS.index(what)
        with self._lock:
            self.total.add(tool, index)
            if group is None:
                return
            counters = self.groups.get(group)
            if counters is None:
                counters = self.groups[group] = _Counters()
                while len(self.groups) > self.max_groups:
                    self.groups.popitem(last=False)
            counters.add(tool, index)

    def snapshot(self, group: str | None) -> ToolStats:
        with self._lock:
            if group is None:
                return self.total.snapshot()
            counters = self.groups.get(group)
            return counters.snapshot() if counters is not None else ToolStats()

    def reset(self) -> None:
        with self._lock:
            self.total = _Counters()
            self.groups.clear()


STATS = _StatsRegistry()
"""The process-wide counters (the hooks add to them)."""


def tool_stats(group: str | None = None) -> ToolStats:
    """Tool calls requested, executed, shared and failed, for one run or the process.

    Counted for every tool call that goes through `BatchToolNode` or
    `BatchMiddleware` in an async run, coalesced or not.

    Args:
        group: A fan_out run (`SiblingInfo.group`); None for process totals.

    Returns:
        A snapshot; an empty one for an unknown group.

    Example:
        ```python
        stats = tool_stats()
        saved = stats.requested - stats.executed
        ```
    """
    return STATS.snapshot(group)


def reset_tool_stats() -> None:
    """Zero every tool counter (process totals and runs).

    Example:
        ```python
        reset_tool_stats()
        assert tool_stats().requested == 0
        ```
    """
    STATS.reset()
