"""Import agent traces in other formats as a `Recording` (`bench --replay FILE --format F`).

`import_trace(path, format=...)` reads a Mooncake, kvtrace or TraceLab
file (`_trace_formats`) and builds the `Recording` that `Recorder` would
have written for a run of that shape: one sibling per session (sub-agents
included), one `LLMCall` per request with its exact prompt and output
tokens, the cached tokens and the prefix kept from the sibling's previous
call that the hash ids (or TraceLab's `prefix_len`) imply, one synthetic
tool call per non-final turn whose `ToolRun` lasts the trace's wait, and a
`summary` whose `shared_prefix.tokens` is the prefix common to the
siblings' first requests. The rules and what each format cannot express are
in `docs/measure-your-own-job.md` ("Traces in other formats").
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from langgraph_batch.record._format import FORMAT, FORMAT_VERSION, LLMCall, Recording, ToolRun
from langgraph_batch.record._format import parse_lines as _parse_lines
from langgraph_batch.record._trace_formats import (
    MOONCAKE_BLOCK,
    TraceRequest,
    TraceSession,
    estimated_duration,
    read_kvtrace,
    read_mooncake,
    read_tracelab,
    sniff,
)

__all__ = ("TRACE_FORMATS", "TraceFormat", "import_trace", "recording_from_sessions")

TraceFormat = Literal["record", "mooncake", "kvtrace", "tracelab"]
TRACE_FORMATS: tuple[TraceFormat, ...] = ("record", "mooncake", "kvtrace", "tracelab")
"""The formats `import_trace` reads (`record`: the `Recorder`'s own)."""
TOOL_NAME = "trace_tool"
"""The name of the synthetic tool call that stands for a turn's wait."""


def import_trace(
    path: str | Path,
    *,
    format: TraceFormat | None = None,
    max_gap_s: float | None = None,
    block_size: int | None = None,
) -> Recording:
    """Read an agent trace as a `Recording` that `bench --replay` can replay.

    Args:
        path: the trace file.
        format: `mooncake`, `kvtrace`, `tracelab` or `record` (a `Recorder`
            file); None detects it from the first line (a file that looks
            like none of them is read as a `record`).
        max_gap_s: cap every wait between a sibling's calls (tool or human
            time) at this many seconds; 0 drops the waits; None keeps them.
            Not applied to `record` files (their waits are measured).
        block_size: tokens per hash id of a Mooncake trace (default 512);
            kvtrace files say theirs (`block_size`, default 64).

    Returns:
        The recording; `header["imported_from"]` names the format.

    Raises:
        ValueError: an unknown or undetectable format, a bad option, or a
            malformed file (the message names the line, row or request, never
            its content).
        OSError: the file cannot be read.

    ```python
    from langgraph_batch.record import import_trace

    recording = import_trace("trace.jsonl", format="mooncake", max_gap_s=30)
    ```
    """
    if max_gap_s is not None and not max_gap_s >= 0:
        raise ValueError(f"max_gap_s must be a number of seconds >= 0, not {max_gap_s!r}")
    if block_size is not None and (isinstance(block_size, bool) or block_size < 1):
        raise ValueError(f"block_size must be a whole number >= 1, not {block_size!r}")
    text = Path(path).read_text(encoding="utf-8")
    chosen = format if format is not None else sniff(text)
    if chosen is None:  # the default: our own format, whose reader says what is wrong
        try:
            return _parse_lines(text.splitlines())
        except ValueError as exc:
            raise ValueError(
                f"{exc}; a trace in another format needs --format ({', '.join(TRACE_FORMATS[1:])})"
            ) from None
    if chosen not in TRACE_FORMATS:
        raise ValueError(f"unknown trace format {chosen!r}; choose from {', '.join(TRACE_FORMATS)}")
    if chosen == "record":
        recording = _parse_lines(text.splitlines())
        if max_gap_s is None:
            return recording
        note = "max_gap_s (--max-gap) not applied: a Recorder file's waits are measured"
        return replace(recording, warnings=(*recording.warnings, note))
    if chosen == "mooncake":
        sessions = read_mooncake(text, block_size=block_size or MOONCAKE_BLOCK)
    elif chosen == "kvtrace":
        sessions = read_kvtrace(text)
    else:
        sessions = read_tracelab(text)
    return recording_from_sessions(sessions, source=chosen, max_gap_s=max_gap_s)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading hash ids `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _prefix_tokens(prev: TraceRequest, req: TraceRequest, block: int) -> int:
    """Tokens `req` keeps of the sibling's previous call (see the docs' rules)."""
    if req.prefix_len is not None:  # TraceLab says it
        return min(req.prefix_len, req.prompt_tokens)
    old, new = prev.hash_ids or (), req.hash_ids or ()
    common = _common(old, new)
    # Every full block of the previous prompt kept (only its partial tail block may differ,
    # as it now holds more tokens): the conversation grew by appending, reply included.
    if common >= max(1 if old else 0, prev.prompt_tokens // block):
        return min(prev.prompt_tokens + prev.output_tokens, req.prompt_tokens)
    return min(common * block, req.prompt_tokens)


def _timeline(
    sessions: Sequence[TraceSession], max_gap_s: float | None
) -> tuple[list[list[tuple[float, float, float]]], int]:
    """Per session and request: (start, end, wait after), with waits capped; and how many were."""
    out: list[list[tuple[float, float, float]]] = []
    capped = 0
    for session in sessions:
        t = session.offset_s
        rows: list[tuple[float, float, float]] = []
        for k, req in enumerate(session.requests):
            took = req.duration_s
            if took is None:
                took = estimated_duration(req.prompt_tokens, req.output_tokens)
            wait = req.wait_after_s if k + 1 < len(session.requests) else 0.0
            if max_gap_s is not None and wait > max_gap_s:
                wait, capped = max_gap_s, capped + 1
            rows.append((t, t + took, wait))
            t += took + wait
        out.append(rows)
    return out, capped


def recording_from_sessions(
    sessions: Sequence[TraceSession], *, source: str, max_gap_s: float | None = None
) -> Recording:
    """The `Recording` of parsed trace sessions (the rules: see the module docstring).

    Raises:
        ValueError: no session holds a request.
    """
    sessions = [s for s in sessions if s.requests]
    if not sessions:
        raise ValueError("the trace holds no request")
    # Siblings are numbered by their first call's start (the trace's order on ties).
    order = sorted(range(len(sessions)), key=lambda i: (sessions[i].offset_s, i))
    sessions = [sessions[i] for i in order]
    times, capped = _timeline(sessions, max_gap_s)
    cached = _cached(sessions, times)
    calls: list[LLMCall] = []
    tools: list[ToolRun] = []
    resets = 0
    for sid, (session, rows) in enumerate(zip(sessions, times, strict=True)):
        last = len(session.requests) - 1
        for k, (req, (start, end, wait)) in enumerate(zip(session.requests, rows, strict=True)):
            prefix = None
            if k:
                prev = session.requests[k - 1]
                prefix = _prefix_tokens(prev, req, session.block_size or 1)
                resets += prefix < min(prev.prompt_tokens + prev.output_tokens, req.prompt_tokens)
            digest = f"{sid}.{k}"
            calls.append(
                LLMCall(
                    sibling=sid,
                    turn=k,
                    start_s=start,
                    end_s=end,
                    prompt_tokens=req.prompt_tokens,
                    cached_tokens=cached[sid][k],
                    output_tokens=req.output_tokens,
                    messages=0,
                    prefix_messages=0,
                    first_messages=0,
                    new=(),
                    tool_calls=((TOOL_NAME, digest),) if k < last else (),
                    finish_reason=req.finish_reason or ("tool_calls" if k < last else "stop"),
                    model=req.model,
                    prefix_tokens=prefix,
                )
            )
            if k < last:
                tools.append(
                    ToolRun(
                        sibling=sid,
                        turn=k,
                        name=TOOL_NAME,
                        args_hash=digest,
                        start_s=end,
                        end_s=end + wait,
                        latency_s=wait,
                        result_chars=0,
                    )
                )
    warnings = [f"imported from a {source} trace: {len(sessions)} sessions as siblings"]
    if capped:
        warnings.append(f"{capped} waits capped at {max_gap_s} s (--max-gap)")
    if resets:
        warnings.append(
            f"{resets} calls keep less than the previous prompt and reply (reset or compaction)"
        )
    shared = _shared_prefix(sessions)
    makespan = max([c.end_s for c in calls] + [t.end_s for t in tools]) - min(
        c.start_s for c in calls
    )
    summary: dict[str, Any] = {
        "type": "summary",
        "siblings": len(sessions),
        "llm_calls": len(calls),
        "tool_calls": len(tools),
        "prompt_tokens": sum(c.prompt_tokens or 0 for c in calls),
        "cached_tokens": sum(c.cached_tokens or 0 for c in calls),
        "output_tokens": sum(c.output_tokens or 0 for c in calls),
        "makespan_s": makespan,
        "shared_prefix": {"messages": 0, "chars": 0, "tokens": shared},
    }
    header: dict[str, Any] = {
        "type": "header",
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "imported_from": source,
        "block_size": sessions[0].block_size or None,
        "max_gap_s": max_gap_s,
        "content": False,
    }
    return Recording(
        header=header,
        calls=tuple(calls),
        tools=tuple(tools),
        summary=summary,
        warnings=tuple(warnings),
    )


def _cached(
    sessions: Sequence[TraceSession], times: Sequence[Sequence[tuple[float, float, float]]]
) -> list[list[int]]:
    """Cached tokens per session and request, in start order under an unbounded cache.

    Hash ids: the request's leading blocks that an earlier request (started
    before it, or at the same time earlier in the trace) already had, times
    the block size, at most the prompt. TraceLab: `prefix_len`, except on the
    trace's first request (nothing was cached yet).
    """
    out = [[0] * len(s.requests) for s in sessions]
    events = sorted(
        ((rows[k][0], i, k) for i, rows in enumerate(times) for k in range(len(rows))),
    )
    seen: set[tuple[int, int]] = set()
    for n, (_, i, k) in enumerate(events):
        session, req = sessions[i], sessions[i].requests[k]
        if req.hash_ids is None:
            out[i][k] = 0 if n == 0 else min(req.prefix_len or 0, req.prompt_tokens)
            continue
        keys = [(session.namespace, h) for h in req.hash_ids]
        hits = sum(1 for _ in itertools.takewhile(seen.__contains__, keys))
        out[i][k] = min(hits * session.block_size, req.prompt_tokens)
        seen.update(keys)
    return out


def _shared_prefix(sessions: Sequence[TraceSession]) -> int:
    """Tokens common to every sibling's first request (0 with one sibling).

    Hash ids: the leading blocks all first requests share (in one namespace),
    times the block size. TraceLab: the least round-0 `prefix_len`.
    """
    if len(sessions) < 2:
        return 0
    firsts = [s.requests[0] for s in sessions]
    floor = min(r.prompt_tokens for r in firsts)
    if any(r.hash_ids is None for r in firsts):
        return min(min(r.prefix_len or 0 for r in firsts), floor)
    if len({s.namespace for s in sessions}) > 1:
        return 0
    ref = firsts[0].hash_ids or ()
    blocks = min(_common(ref, r.hash_ids or ()) for r in firsts[1:])
    return min(blocks * sessions[0].block_size, floor)
