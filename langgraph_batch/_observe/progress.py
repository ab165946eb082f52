"""Progress events of `fan_out`, and a terminal progress bar that renders them.

`fan_out` writes one custom stream event (a plain, JSON-serialisable dict)
when a run starts, when each sibling starts, finishes or fails, and when the
run is done. They are written as the fan_out node itself (in its graph's
namespace), so `graph.astream(..., stream_mode="custom")` sees them for a
fan_out in the top-level graph, and `subgraphs=True` is needed only for a
fan_out nested in a subgraph; LangGraph Studio shows them too. Every event
carries `"type": "lgb.fan_out"` plus the counters needed to draw a bar:

```python
{"type": "lgb.fan_out", "event": "sibling_finished", "node": "review",
 "group": "3f2a9c1b", "index": 17, "done": 18, "failed": 1, "total": 200,
 "active": 32, "stats": {...scheduler stats...}}
```

The `done` event adds `peak_active` (the most siblings active at once) and
`pauses` (how many times a sibling waiting on a tool gave up its KV booking
because the siblings' contexts outgrew the server's cache). A run with
`fan_out(..., prices=...)` (or `cost_into=`) adds `cost` to every event: the
run's usage and cost so far (`langgraph_batch.pricing.CostMeter.summary`),
which the bar shows in dollars.

For scripts and `make demo`, `render_progress` wraps a stream and draws a
bar on stderr (or any text stream): one line redrawn in place on a TTY,
plain throttled lines otherwise:

```python
async for chunk in render_progress(
    graph.astream(inputs, stream_mode=["custom", "values"], subgraphs=True)
):
    ...  # every chunk passes through unchanged
```
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, TextIO, TypeVar

__all__ = (
    "FAN_OUT_EVENT",
    "ProgressBar",
    "extract_fan_out_event",
    "fan_out_event",
    "render_progress",
)

FAN_OUT_EVENT: Final = "lgb.fan_out"
"""The `type` of every progress event `fan_out` writes to the custom stream."""

_T = TypeVar("_T")


def fan_out_event(event: str, **fields: Any) -> dict[str, Any]:
    """Build one progress event (`event`: started, sibling_started, sibling_finished, ...)."""
    return {"type": FAN_OUT_EVENT, "event": event, **fields}


def extract_fan_out_event(chunk: Any) -> dict[str, Any] | None:
    """Find a fan_out progress event in one item of `astream`, whatever its shape.

    Handles `data`, `(mode, data)`, `(namespace, data)` and
    `(namespace, mode, data)` (the shapes `stream_mode` and `subgraphs`
    produce), and the `event`/`data` shape of the LangGraph SDK.

    Returns:
        The event dict, or None when the item is something else.
    """
    if isinstance(chunk, Mapping):
        if chunk.get("type") == FAN_OUT_EVENT:
            return dict(chunk)
        data = chunk.get("data")
        if isinstance(data, Mapping) and data.get("type") == FAN_OUT_EVENT:
            return dict(data)
        return None
    # The SDK's StreamPart is a NamedTuple(event, data).
    data = getattr(chunk, "data", None)
    if isinstance(data, Mapping) and data.get("type") == FAN_OUT_EVENT:
        return dict(data)
    if isinstance(chunk, tuple) and chunk:
        last = chunk[-1]
        if isinstance(last, Mapping) and last.get("type") == FAN_OUT_EVENT:
            if len(chunk) >= 2 and isinstance(chunk[-2], str) and chunk[-2] != "custom":
                return None
            return dict(last)
    return None


@dataclass(slots=True)
class _GroupState:
    node: str
    total: int = 0
    done: int = 0
    failed: int = 0
    active: int | None = None
    stats: Mapping[str, Any] | None = None
    cost_usd: float | None = None
    finished: bool = False


class ProgressBar:
    """Draws fan_out progress events as a bar on a text stream.

    Feed it events with `update(event)` (or let `render_progress` do it). On a
    TTY one line is redrawn in place; otherwise plain lines are written, at
    most one per `min_interval` seconds plus the start, failures and the end.

    Args:
        stream: where to write; `sys.stderr` by default.
        width: the bar's width in characters.
        min_interval: the least time between two plain (non-TTY) lines, seconds.
        tty: force TTY (True) or plain (False) rendering; default: ask the stream.

    Raises:
        ValueError: if `width` < 1 or `min_interval` < 0.
    """

    def __init__(
        self,
        *,
        stream: TextIO | None = None,
        width: int = 30,
        min_interval: float = 1.0,
        tty: bool | None = None,
    ) -> None:
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width!r}")
        if min_interval < 0:
            raise ValueError(f"min_interval must be >= 0, got {min_interval!r}")
        self._stream = stream
        self._width = width
        self._min_interval = min_interval
        self._tty = tty
        self._groups: dict[str, _GroupState] = {}
        self._last_plain = float("-inf")
        self._dirty_line = False

    @property
    def stream(self) -> TextIO:
        """The text stream being written to."""
        return self._stream if self._stream is not None else sys.stderr

    @property
    def is_tty(self) -> bool:
        """Whether lines are redrawn in place."""
        if self._tty is not None:
            return self._tty
        isatty = getattr(self.stream, "isatty", None)
        try:
            return bool(isatty()) if callable(isatty) else False
        except (ValueError, OSError):  # closed or detached stream
            return False

    def update(self, event: Mapping[str, Any]) -> None:
        """Account for one fan_out event and redraw.

        Events of other types are ignored.
        """
        if event.get("type") != FAN_OUT_EVENT:
            return
        group = str(event.get("group", ""))
        state = self._groups.get(group)
        if state is None:
            state = self._groups[group] = _GroupState(node=str(event.get("node") or "fan_out"))
        for attr in ("total", "done", "failed"):
            value = event.get(attr)
            if isinstance(value, int):
                setattr(state, attr, value)
        if isinstance(event.get("active"), int):
            state.active = event["active"]
        stats = event.get("stats")
        if isinstance(stats, Mapping):
            state.stats = stats
        cost = event.get("cost")
        total = (cost.get("cost") or {}).get("total") if isinstance(cost, Mapping) else None
        if isinstance(total, int | float):
            state.cost_usd = float(total)
        kind = event.get("event")
        if kind == "done":
            state.finished = True
        important = kind in {"started", "done", "sibling_failed"}
        self._draw(state, event, important=important)

    def close(self) -> None:
        """End the redrawn line (TTY) so later output starts on a fresh line."""
        if self._dirty_line:
            self.stream.write("\n")
            self.stream.flush()
            self._dirty_line = False

    def _line(self, state: _GroupState) -> str:
        total = max(state.total, 0)
        frac = (state.done / total) if total else 1.0
        filled = min(self._width, round(frac * self._width))
        bar = "#" * filled + "-" * (self._width - filled)
        parts = [f"{state.node} [{bar}] {state.done}/{total}"]
        if state.failed:
            parts.append(f"{state.failed} failed")
        if state.active is not None and not state.finished:
            parts.append(f"{state.active} active")
        if state.stats:
            parts.extend(
                f"{key} {state.stats[key]}"
                for key in ("queued", "in_flight")  # SchedulerStats' names
                if isinstance(state.stats.get(key), int | float)
            )
        if state.cost_usd is not None:
            parts.append(f"${state.cost_usd:.4f}")
        if state.finished:
            parts.append("done")
        return ", ".join(parts)

    def _draw(self, state: _GroupState, event: Mapping[str, Any], *, important: bool) -> None:
        line = self._line(state)
        out = self.stream
        if self.is_tty:
            if event.get("event") == "sibling_failed":
                # Keep failures on screen: print them above the redrawn bar.
                out.write(
                    f"\r\x1b[2K{state.node}: sibling {event.get('index')} failed: "
                    f"{event.get('error_type')}: {event.get('message')}\n"
                )
            out.write(f"\r\x1b[2K{line}")
            self._dirty_line = True
            if state.finished:
                out.write("\n")
                self._dirty_line = False
            out.flush()
            return
        now = time.monotonic()
        if not important and now - self._last_plain < self._min_interval:
            return
        self._last_plain = now
        if event.get("event") == "sibling_failed":
            line += (
                f" (sibling {event.get('index')} failed: "
                f"{event.get('error_type')}: {event.get('message')})"
            )
        out.write(line + "\n")
        out.flush()


async def render_progress(
    chunks: AsyncIterable[_T],
    *,
    stream: TextIO | None = None,
    width: int = 30,
    min_interval: float = 1.0,
    tty: bool | None = None,
) -> AsyncIterator[_T]:
    """Pass every item of `chunks` through, drawing fan_out progress on `stream`.

    Use with `stream_mode` including `"custom"`; add `subgraphs=True` when
    the fan_out node sits inside a subgraph.

    Args:
        chunks: what `graph.astream(...)` (or the SDK's `runs.stream`) yields.
        stream: where to draw; `sys.stderr` by default.
        width: the bar's width in characters.
        min_interval: the least time between two plain (non-TTY) lines, seconds.
        tty: force TTY (True) or plain (False) rendering; default: ask the stream.

    Yields:
        Each item of `chunks`, unchanged.

    Closing the returned generator early (or cancelling its consumer) closes
    `chunks` too, which stops the graph run that produces them.
    """
    bar = ProgressBar(stream=stream, width=width, min_interval=min_interval, tty=tty)
    try:
        async for chunk in chunks:
            event = extract_fan_out_event(chunk)
            if event is not None:
                bar.update(event)
            yield chunk
    finally:
        bar.close()
        # A consumer that stopped early (break, cancellation) closes this
        # generator: close the stream it wraps too, so the graph run behind it
        # stops now rather than whenever the garbage collector finalises it.
        aclose = getattr(chunks, "aclose", None)
        if callable(aclose):
            await aclose()
