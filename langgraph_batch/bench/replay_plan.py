"""What a replay of a recording must reproduce, per sibling and turn (`plan`).

`plan(recording)` reads, per sibling and turn, the prompt, cached and output
tokens, the tool calls, how long the sibling waited on its tools, and two
things a conversation does besides growing by appending:

- **Resets and compactions.** A turn keeps only part of the sibling's
  previous context when its `prefix_tokens` (the prompt tokens it shares with
  the sibling's previous call) is less than that call's prompt plus output
  tokens; when `prefix_tokens` is unknown (None, as in the Recorder's own
  files), when its `prefix_messages` is fewer than that call's `messages`.
  Then `TurnPlan.kept_tokens` says how many prompt tokens it kept: exactly
  `prefix_tokens`, or an estimate (`kept_estimated`): the turn's prompt
  tokens in proportion to the characters of the kept messages (the sizes in
  `new`, tracked message by message from the sibling's first call).
- **Start offsets.** `SiblingPlan.start_s`: when the sibling's first call
  started, after the recording's earliest call (seconds).

`recorded_figures` measures the recorded run the way the replay measures its
own; `bench.timeline.split_gaps` is the one definition of the time between
two model calls (tool, hold, other).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph_batch._estimates import typical_tokens
from langgraph_batch.record import LLMCall, Recording

__all__ = (
    "ReplayPlan",
    "SiblingPlan",
    "TurnPlan",
    "kept_prefix",
    "plan",
    "recorded_figures",
    "tool_gaps",
)

_DC: dict[str, bool] = {"slots": True, "kw_only": True}


@dataclass(**_DC)
class TurnPlan:
    """One model call to reproduce (tokens as the recorded server counted them)."""

    prompt_tokens: int
    cached_tokens: int | None
    output_tokens: int
    calls: tuple[str, ...] = ()
    """Digests of the tool calls this turn made (none on the answer)."""
    wait_s: float = 0.0
    """How long the tool calls after this turn took (0 after the answer)."""
    kept_tokens: int | None = None
    """A reset or compaction: the prompt tokens kept of the sibling's previous call
    (None: the conversation grew by appending)."""
    kept_estimated: bool = False
    """`kept_tokens` is an estimate (no `prefix_tokens` recorded; see the module docstring)."""


@dataclass(**_DC)
class SiblingPlan:
    """One recorded conversation."""

    index: int
    turns: list[TurnPlan]
    key: str = ""
    """The replayed tool-call key (shared by siblings with identical recorded calls)."""
    start_s: float = 0.0
    """The recorded start offset: its first call's start after the recording's earliest (s)."""


@dataclass(**_DC)
class ReplayPlan:
    """What a replay reproduces, and the recorded figures it is compared with."""

    siblings: list[SiblingPlan]
    shared_tokens: int
    tool_name: str
    recorded: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def _waits(recording: Recording) -> dict[tuple[int, int], float]:
    """Tool latency per (sibling, turn): the longest run the turn's calls made (in parallel)."""
    out: dict[tuple[int, int], float] = {}
    for run in recording.tools:
        if run.sibling >= 0 and run.turn >= 0:
            key = (run.sibling, run.turn)
            out[key] = max(out.get(key, 0.0), run.latency_s)
    return out


def _by_digest(recording: Recording) -> dict[str, float]:
    """The executed latency of each tool call digest (median when it ran several times)."""
    runs: dict[str, list[float]] = {}
    for run in recording.tools:
        runs.setdefault(run.args_hash, []).append(run.latency_s)
    return {h: statistics.median(v) for h, v in runs.items()}


def _turn_waits(recording: Recording) -> dict[tuple[int, int], float]:
    """The tool time after each non-final turn, per (sibling, turn), tools only.

    The turn's executed runs (the longest, as parallel calls overlap); a call
    that ran no tool of its own (it shared another sibling's run) its digest's
    latency; with no tool run recorded at all, the sibling's wait between its
    two model calls (then holds and graph steps are in it: nothing says less).
    """
    waits, latency = _waits(recording), _by_digest(recording)
    out: dict[tuple[int, int], float] = {}
    for sid, calls in recording.siblings().items():
        for a, b in itertools.pairwise(calls):
            wait = waits.get((sid, a.turn), 0.0)
            if not wait:
                known = [latency[h] for _, h in a.tool_calls if h in latency]
                wait = max(known) if known else max(0.0, b.start_s - a.end_s)
            out[(sid, a.turn)] = wait
    return out


def _seen_waits(recording: Recording) -> list[float]:
    """The tool time each non-final turn waited, as the sibling saw it (tools only).

    Its own runs' (the longest); a call that ran no tool of its own joined
    another sibling's run of the same digest (coalesced): it waited from its
    model call's end until that run ended; else `_turn_waits`'s figure. Never
    more than the wait between its two model calls.
    """
    own = _waits(recording)
    runs: dict[str, list[tuple[float, float]]] = {}
    for run in recording.tools:
        runs.setdefault(run.args_hash, []).append((run.start_s, run.end_s))
    fallback = _turn_waits(recording)
    out: list[float] = []
    for sid, calls in recording.siblings().items():
        for a, b in itertools.pairwise(calls):
            gap = max(0.0, b.start_s - a.end_s)
            wait = own.get((sid, a.turn), 0.0)
            if not wait:
                ends = [
                    end - a.end_s
                    for _, h in a.tool_calls
                    for start, end in runs.get(h, ())
                    if start <= b.start_s and end >= a.end_s
                ]
                wait = max(ends) if ends else fallback[(sid, a.turn)]
            out.append(min(wait, gap))
    return out


def recorded_figures(recording: Recording) -> dict[str, Any]:
    """The recorded run's totals, measured as the replay measures its own (see `compare`).

    `tool_wait_mean_s` is the mean tool time between two model calls (tools
    only, `_seen_waits`); `hold_mean_s` the rest of the wait between them
    (the recorded run's admission holds and graph steps): the replay reports
    the same two apart (`bench.timeline.split_gaps`).
    """
    calls = recording.calls
    prompt = sum(c.prompt_tokens or 0 for c in calls)
    known = [c.cached_tokens for c in calls if c.cached_tokens is not None]
    cached = sum(known) if known else None
    gaps = tool_gaps(recording.siblings().values())
    tools = _seen_waits(recording)
    start = min((c.start_s for c in calls), default=0.0)
    end = max([c.end_s for c in calls] + [t.end_s for t in recording.tools], default=0.0)
    return {
        "siblings": len(recording.siblings()),
        "llm_requests": len(calls),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cache_hit_rate": cached / prompt if prompt and cached is not None else None,
        "generation_tokens": sum(c.output_tokens or 0 for c in calls),
        "tool_calls_requested": sum(len(c.tool_calls) for c in calls),
        "tool_calls_executed": len(recording.tools),
        "tool_latency_mean_s": statistics.fmean(t.latency_s for t in recording.tools)
        if recording.tools
        else None,
        "tool_wait_mean_s": statistics.fmean(tools) if tools else None,
        "tool_wait_total_s": sum(tools),
        "hold_mean_s": statistics.fmean(max(0.0, g - w) for g, w in zip(gaps, tools, strict=True))
        if gaps
        else None,
        "gap_mean_s": statistics.fmean(gaps) if gaps else None,
        "makespan_s": end - start,
        "failures": sum(1 for c in calls if c.error),
    }


def tool_gaps(siblings: Iterable[Sequence[LLMCall]]) -> list[float]:
    """Each sibling's wait between consecutive model calls (its tool calls, seen from it)."""
    out: list[float] = []
    for calls in siblings:
        out.extend(b.start_s - a.end_s for a, b in itertools.pairwise(calls))
    return out


def kept_prefix(calls: Sequence[LLMCall], k: int) -> tuple[int, bool] | None:
    """The prompt tokens turn `k` kept of turn `k - 1`, if it reset; else None.

    Returns `(tokens, estimated)`: `prefix_tokens` when recorded (a reset when
    below the previous prompt plus output tokens), else, when the call kept
    fewer messages than the previous one sent, an estimate: its prompt tokens
    in proportion to the kept messages' characters (see the module docstring).
    """
    call, prev = calls[k], calls[k - 1]
    if call.prefix_tokens is not None:
        whole = (prev.prompt_tokens or 0) + (prev.output_tokens or 0)
        return (call.prefix_tokens, False) if call.prefix_tokens < whole else None
    if call.prefix_messages >= prev.messages:
        return None
    sizes = _message_chars(calls[:k])  # the previous call's messages
    kept = sum(sizes[: call.prefix_messages]) + call.tools_chars
    total = kept + sum(c for _, _, c in call.new)
    if call.prompt_tokens is None or total <= 0:
        return (typical_tokens(kept), True)
    return (round(call.prompt_tokens * kept / total), True)


def _message_chars(calls: Sequence[LLMCall]) -> list[int]:
    """The characters of each message of the last of `calls`, tracked from the first."""
    sizes: list[int] = []
    for call in calls:
        sizes = sizes[: call.prefix_messages] + [c for _, _, c in call.new]
    return sizes


def plan(recording: Recording) -> ReplayPlan:
    """What a replay of `recording` must reproduce, per sibling and turn.

    Raises:
        ValueError: the recording holds no model call.
    """
    siblings = recording.siblings()
    if not siblings:
        raise ValueError("the recording holds no model call: nothing to replay")
    warnings = list(recording.warnings)
    waits = _turn_waits(recording)
    names = [n for c in recording.calls for n, _ in c.tool_calls]
    tool_name = max(set(names), key=names.count) if names else "tool"
    out: list[SiblingPlan] = []
    unknown_usage = 0
    earliest = min(c.start_s for c in recording.calls)
    for sid, calls in sorted(siblings.items()):
        turns: list[TurnPlan] = []
        for k, call in enumerate(calls):
            kept = kept_prefix(calls, k) if k else None
            prompt = call.prompt_tokens
            if prompt is None:  # no usage: the typical estimate of the new texts
                unknown_usage += 1
                base = kept[0] if kept else (turns[-1].prompt_tokens if turns else 0)
                prompt = base + typical_tokens(sum(c for _, _, c in call.new))
            turns.append(
                TurnPlan(
                    prompt_tokens=prompt,
                    cached_tokens=call.cached_tokens,
                    output_tokens=max(1, call.output_tokens or 1),
                    calls=tuple(h for _, h in call.tool_calls) if k + 1 < len(calls) else (),
                    wait_s=waits.get((sid, call.turn), 0.0) if k + 1 < len(calls) else 0.0,
                    kept_tokens=None if kept is None else min(kept[0], prompt),
                    kept_estimated=bool(kept and kept[1]),
                )
            )
        start = calls[0].start_s - earliest
        out.append(SiblingPlan(index=len(out), turns=turns, start_s=start))
    if unknown_usage:
        warnings.append(f"{unknown_usage} model calls without usage: prompt lengths estimated")
    _assign_keys(out)
    prefix = (recording.summary or {}).get("shared_prefix")
    tokens = prefix.get("tokens") if isinstance(prefix, Mapping) else None
    shared_tokens = 0  # a summary without a usable figure: recomputed below
    if isinstance(tokens, int | float) and math.isfinite(tokens):
        shared_tokens = max(0, int(tokens))
    if not shared_tokens:
        from langgraph_batch.record import shared_prefix

        firsts = [calls[0] for calls in siblings.values()]
        shared_tokens = int(shared_prefix(firsts)["tokens"])
    return ReplayPlan(
        siblings=out,
        shared_tokens=shared_tokens,
        tool_name=tool_name,
        recorded=recorded_figures(recording),
        warnings=warnings,
    )


def _assign_keys(siblings: Sequence[SiblingPlan]) -> None:
    """Give siblings whose recorded tool calls agree the same key (see `SiblingPlan.key`).

    The replayed model's n-th call of key k has the argument `k` (then `k.n`),
    so two siblings may share a key only if their calls are equal at every
    turn both made one: each sibling joins the first compatible group that
    starts with its first call, else starts a new one.
    """
    groups: list[tuple[str, list[tuple[str, ...]]]] = []
    for sib in siblings:
        seq = [t.calls for t in sib.turns[:-1]]
        if not seq or not all(seq):
            sib.key = f"s{sib.index}"
            continue
        for key, merged in groups:
            if merged[0] == seq[0] and all(a == b for a, b in zip(merged, seq, strict=False)):
                merged.extend(seq[len(merged) :])
                sib.key = key
                break
        else:
            groups.append((f"g{len(groups)}", list(seq)))
            sib.key = groups[-1][0]
