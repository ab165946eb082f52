"""Where siblings spend their time: per-sibling timelines and the breakdown of a run.

The contender records, per sibling, when it started and each model and tool
call's start and end (client side, `Recorder.events`); the server reports,
summed over the run's requests, how long they queued, prefilled and decoded
(vLLM's `/metrics` histograms; the emulator exports the same). The mean
sibling's latency then splits into:

- `not_started`: from the run's start to the sibling's first step (admission,
  fan-out scheduling);
- `client_queue`: inside model calls but not on the server (the client's
  scheduler queue, connection waits, HTTP, the server's request path);
- `server_queue`, `prefill`, `decode`: the server's phases of its requests;
- `tool`: inside tool calls (coalescing waits included);
- `hold`: back from its tools but not yet in its next model call (a
  fan_out's admission holding the sibling until the KV budget has room or
  a place frees, and the graph's step to the model node);
- `other`: the rest (graph steps between nodes, client CPU).

`split_gaps` is the one definition of tool, hold and other time between two
model calls: this breakdown and the replay's fidelity (`replay_run`) read it.

Server phases come as run totals, so the split of `llm` is per mean sibling,
not per sibling. Times are emulated seconds (wall x time scale; engine
seconds on the server side).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ("BREAKDOWN_KEYS", "breakdown", "per_sibling", "split_gaps")

BREAKDOWN_KEYS = (
    "not_started",
    "client_queue",
    "server_queue",
    "prefill",
    "decode",
    "tool",
    "hold",
    "other",
)


def per_sibling(
    events: Sequence[Sequence[Any]], completions: Sequence[float | None], *, scale: float
) -> dict[str, list[list[Any]]]:
    """Each sibling's timeline, `{index: [[t, what], ...]}`, finish included (`done`)."""
    out: dict[str, list[list[Any]]] = {}
    for t, index, what in events:
        out.setdefault(str(index), []).append([round(t * scale, 4), what])
    for index, done in enumerate(completions):
        if done is not None:
            out.setdefault(str(index), []).append([round(done * scale, 4), "done"])
    return out


def split_gaps(events: Sequence[Sequence[Any]]) -> list[dict[str, float]]:
    """Each wait of one sibling between a model call's end and its next call's start, split.

    - `tool`: inside its tool calls (the union of their spans: parallel calls
      overlap), coalescing waits included;
    - `hold`: from its last tool's end to the next model call's start: back
      from its tools, held (a fan_out's admission until the KV budget has room
      or a place frees) or stepping through the graph;
    - `other`: from the model call's end to its first tool's start (graph
      steps); a wait without any tool call is all `other`.

    Args:
        events: one sibling's timeline, `[[t, what], ...]` in time order.

    Returns:
        One `{"tool", "hold", "other", "gap"}` dict (seconds) per wait.
    """
    out: list[dict[str, float]] = []
    opened: float | None = None  # the last model call's end, while waiting
    first = last = 0.0  # first tool start, last tool end of this wait
    inside, since, tool = 0, 0.0, 0.0
    for t, what in events:
        if what == "llm_end":
            opened, first, last, inside, tool = t, -1.0, -1.0, 0, 0.0
        elif opened is None:
            continue
        elif what == "tool_start":
            if inside == 0:
                since = t
                first = t if first < 0 else first
            inside += 1
        elif what == "tool_end" and inside:
            inside -= 1
            if inside == 0:
                tool += t - since
                last = t
        elif what == "llm_start":
            gap = t - opened
            if first < 0:
                out.append({"tool": 0.0, "hold": 0.0, "other": gap, "gap": gap})
            else:
                hold = t - last
                out.append({"tool": tool, "hold": hold, "other": gap - tool - hold, "gap": gap})
            opened = None
    return out


def _spans(events: list[list[Any]], start: str, end: str) -> float:
    total, opened = 0.0, []
    for t, what in events:
        if what == start:
            opened.append(t)
        elif what == end and opened:
            total += t - opened.pop()
    return total


def breakdown(
    timeline: Mapping[str, list[list[Any]]], server: Mapping[str, float] | None
) -> dict[str, Any] | None:
    """The mean sibling's latency split into `BREAKDOWN_KEYS` (seconds), or None.

    Args:
        timeline: `per_sibling` output (emulated seconds).
        server: the run's `/metrics` delta (`queue_time_s`, `prefill_time_s`,
            `decode_time_s`, summed over requests); None or missing keys:
            the model-call time stays unsplit (`client_queue` is all of it).
    """
    rows = []
    for events in timeline.values():
        done = [t for t, what in events if what == "done"]
        if not done:
            continue
        starts = [t for t, what in events if what in ("start", "llm_start")]
        start = min(starts) if starts else done[0]
        gaps = split_gaps(events)
        rows.append(
            (
                done[0],
                start,
                _spans(events, "llm_start", "llm_end"),
                sum(g["tool"] for g in gaps),
                sum(g["hold"] for g in gaps),
            )
        )
    if not rows:
        return None
    n = len(rows)
    latency = statistics.fmean(r[0] for r in rows)
    not_started = statistics.fmean(r[1] for r in rows)
    llm = statistics.fmean(r[2] for r in rows)
    tool = statistics.fmean(r[3] for r in rows)
    hold = statistics.fmean(r[4] for r in rows)
    server = server or {}
    phases = {
        "server_queue": server.get("queue_time_s"),
        "prefill": server.get("prefill_time_s"),
        "decode": server.get("decode_time_s"),
    }
    split = all(v is not None for v in phases.values())
    out: dict[str, Any] = {"siblings": n, "latency": latency, "not_started": not_started}
    for key, total in phases.items():
        out[key] = (total or 0.0) / n if split else None
    on_server = sum(out[k] for k in phases) if split else 0.0
    out["client_queue"] = llm - on_server
    out["llm"] = llm
    out["tool"] = tool
    out["hold"] = hold
    out["other"] = latency - not_started - llm - tool - hold
    out["server_phases"] = "metrics" if split else None
    return out
