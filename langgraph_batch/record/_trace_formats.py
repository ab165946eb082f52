"""Readers of the agent trace formats `import_trace` accepts: Mooncake, kvtrace, TraceLab.

Each reader turns a file's text into `TraceSession`s (one per conversation:
its requests in order, the first one's start offset, and the namespace its
hash ids live in); `langgraph_batch.record._import` turns those into a
`Recording`. The rules, per format, are in `docs/measure-your-own-job.md`
("Traces in other formats"). Errors name the line, row or request and the
field, never the content (a file given by mistake may hold anything).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from langgraph_batch._estimates import DECODE_S_PER_TOKEN, PREFILL_S_PER_TOKEN

__all__ = (
    "DECODE_S_PER_TOKEN",
    "KVTRACE_BLOCK",
    "MOONCAKE_BLOCK",
    "PREFILL_S_PER_TOKEN",
    "TRACELAB_COLUMNS",
    "TraceRequest",
    "TraceSession",
    "estimated_duration",
    "read_kvtrace",
    "read_mooncake",
    "read_tracelab",
)

MOONCAKE_BLOCK = 512
"""Tokens per hash id in a Mooncake trace (FAST'25: one id per 512-token block)."""
KVTRACE_BLOCK = 64
"""Tokens per hash id in a kvtrace file without `block_size`."""
TRACELAB_COLUMNS = (
    "session_id",
    "round_idx",
    "prefix_len",
    "input_len",
    "output_len",
    "tool_wait_after_ms",
)
_MAX_TOKENS = 1 << 24
_DC: dict[str, bool] = {"slots": True, "kw_only": True}


def estimated_duration(prompt_tokens: int, output_tokens: int) -> float:
    """A model call's duration where the trace gives none: prefill plus decode estimates."""
    return prompt_tokens * PREFILL_S_PER_TOKEN + output_tokens * DECODE_S_PER_TOKEN


@dataclass(**_DC)
class TraceRequest:
    """One model request of a foreign trace, in the units the builder uses."""

    where: str
    """Where it is in the file (`line 3`, `row 4`, `trace 0 request 2`), for messages."""
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None = None
    """Block hash ids (hash-id formats), else None."""
    prefix_len: int | None = None
    """Tokens the trace says are reused (TraceLab), else None."""
    duration_s: float | None = None
    """How long the call took, when the trace says (kvtrace `api_time`)."""
    wait_after_s: float = 0.0
    """Seconds between this call's end and the sibling's next call."""
    finish_reason: str | None = None
    model: str | None = None


@dataclass(**_DC)
class TraceSession:
    """One conversation: a sibling of the replay."""

    where: str
    offset_s: float
    """When its first request starts, in seconds from the trace's start."""
    requests: list[TraceRequest] = field(default_factory=list)
    namespace: int = 0
    """Hash ids are equal only within one namespace (kvtrace's `hash_id_scope: local`)."""
    block_size: int = 0
    """Tokens per hash id (0: the format has no hash ids)."""


# -- field checks: the messages name the field, never the value ---------------------------------


def _number(value: Any, key: str, where: str) -> float:
    """A field's number: a JSON number or a numeric string (CSV), never a bool."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{where}: field {key!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: field {key!r} is not a number")
    return value


def _whole(row: Mapping[str, Any], key: str, where: str, *, low: int = 0) -> int:
    if key not in row:
        raise ValueError(f"{where}: field {key!r} is missing")
    value = _number(row[key], key, where)
    if not math.isfinite(value) or value != int(value) or not low <= value <= _MAX_TOKENS:
        raise ValueError(f"{where}: field {key!r} is not a whole number in [{low}, 2^24]")
    return int(value)


def _seconds(row: Mapping[str, Any], key: str, where: str, scale: float = 1.0) -> float | None:
    """An optional, finite, non-negative time (`scale` converts to seconds)."""
    value = row.get(key)
    if value is None:
        return None
    value = _number(value, key, where)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: field {key!r} is not a finite, non-negative time")
    return float(value) * scale


def _hash_ids(row: Mapping[str, Any], where: str) -> tuple[int, ...]:
    ids = row.get("hash_ids")
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise ValueError(f"{where}: field 'hash_ids' is not a list of whole numbers")
    return tuple(ids)


def _object(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:  # the position, not the text
        raise ValueError(f"{where}: not JSON (column {exc.colno}: {exc.msg})") from None


def _check_blocks(req: TraceRequest, block: int) -> None:
    ids = req.hash_ids or ()
    if len(ids) * block < req.prompt_tokens or (len(ids) - 1) * block >= max(1, req.prompt_tokens):
        raise ValueError(
            f"{req.where}: {len(ids)} hash ids of {block} tokens do not cover "
            f"{req.prompt_tokens} input tokens (expected {math.ceil(req.prompt_tokens / block)})"
        )


# -- Mooncake -------------------------------------------------------------------------------------


def read_mooncake(text: str, *, block_size: int = MOONCAKE_BLOCK) -> list[TraceSession]:
    """Mooncake JSONL (`timestamp` ms, `input_length`, `output_length`, `hash_ids`).

    Sessions are inferred: in timestamp order, a request continues the
    session whose latest request's hash ids are a prefix of its own (the
    longest such; the most recent on ties), else it starts a new session.
    The wait after a request is the time to the session's next request less
    the request's estimated duration (`estimated_duration`), at least 0.

    Raises:
        ValueError: a malformed line (named by its number).
    """
    rows: list[tuple[float, int, TraceRequest]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"line {number}"
        row = _object(line, where)
        if not isinstance(row, dict):
            raise ValueError(f"{where}: not a JSON object")
        stamp = _seconds(row, "timestamp", where, scale=1e-3)
        if stamp is None:
            raise ValueError(f"{where}: field 'timestamp' is missing")
        req = TraceRequest(
            where=where,
            prompt_tokens=_whole(row, "input_length", where, low=1),
            output_tokens=_whole(row, "output_length", where, low=1),
            hash_ids=_hash_ids(row, where),
        )
        _check_blocks(req, block_size)
        rows.append((stamp, number, req))
    if not rows:
        raise ValueError("no request in the trace")
    rows.sort(key=lambda r: (r[0], r[1]))
    t0 = rows[0][0]
    sessions: list[TraceSession] = []
    starts: list[list[float]] = []
    tails: dict[tuple[int, ...], int] = {}  # a session's latest hash ids -> its index
    lengths: dict[int, int] = {}  # how many tails have each length
    for stamp, _, req in rows:
        ids = req.hash_ids or ()
        found = None
        for n in sorted((n for n in lengths if 0 < n <= len(ids)), reverse=True):
            found = tails.get(ids[:n])
            if found is not None:
                break
        if found is None:
            found = len(sessions)
            sessions.append(
                TraceSession(where=req.where, offset_s=stamp - t0, block_size=block_size)
            )
            starts.append([])
        else:
            old = sessions[found].requests[-1].hash_ids or ()
            del tails[old]
            lengths[len(old)] -= 1
            if not lengths[len(old)]:
                del lengths[len(old)]
        # Equal tails: the most recent session wins, as the rule says (ties).
        if ids in tails:
            lengths[len(ids)] -= 1
        tails[ids] = found
        lengths[len(ids)] = lengths.get(len(ids), 0) + 1
        sessions[found].requests.append(req)
        starts[found].append(stamp - t0)
    for session, times in zip(sessions, starts, strict=True):
        reqs = session.requests
        for k in range(len(reqs) - 1):
            end = times[k] + estimated_duration(reqs[k].prompt_tokens, reqs[k].output_tokens)
            reqs[k].wait_after_s = max(0.0, times[k + 1] - end)
    return sessions


# -- kvtrace --------------------------------------------------------------------------------------


def read_kvtrace(text: str) -> list[TraceSession]:
    """Read kvtrace JSON: a trace object, a JSON array of them, or JSON Lines of them.

    A trace: `requests` (each `in`, `out`, `hash_ids`; optional `t` seconds
    since the trace's start, `api_time` seconds, `think_time` seconds before
    the next request, `stop`, `model`), optional `block_size` (default 64),
    `hash_id_scope` (`local`, the default: ids are equal only within the
    trace and its sub-agents; `global`: across traces), `start` (seconds) and
    `subagents` (traces with `start` relative to their parent's start).

    Raises:
        ValueError: malformed JSON or a malformed trace (named by its place).
    """
    stripped = text.strip()
    if not stripped:
        raise ValueError("no trace in the file")
    try:
        data = json.loads(stripped)
        items = [
            (f"trace {i}", t) for i, t in enumerate(data if isinstance(data, list) else [data])
        ]
    except json.JSONDecodeError:
        items = [
            (f"line {n}", _object(line, f"line {n}"))
            for n, line in enumerate(text.splitlines(), 1)
            if line.strip()
        ]
    sessions: list[TraceSession] = []
    block: int | None = None
    for index, (where, trace) in enumerate(items):
        if not isinstance(trace, dict):
            raise ValueError(f"{where}: not a JSON object")
        size = _whole(trace, "block_size", where, low=1) if "block_size" in trace else KVTRACE_BLOCK
        if block is not None and size != block:
            raise ValueError(f"{where}: block_size differs from the first trace's ({block})")
        block = size
        scope = trace.get("hash_id_scope", "local")
        if scope not in ("local", "global"):
            raise ValueError(f"{where}: field 'hash_id_scope' is neither 'local' nor 'global'")
        start = _seconds(trace, "start", where) or 0.0
        _kv_session(trace, where, start, index + 1 if scope == "local" else 0, size, sessions, 0)
    return sessions


def _kv_session(
    trace: Mapping[str, Any],
    where: str,
    start: float,
    namespace: int,
    block: int,
    out: list[TraceSession],
    depth: int,
) -> None:
    if depth > 16:
        raise ValueError(f"{where}: sub-agents nested more than 16 deep")
    raw = trace.get("requests")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where}: field 'requests' is not a non-empty list")
    session = TraceSession(where=where, offset_s=start, namespace=namespace, block_size=block)
    times: list[float | None] = []
    explicit: list[bool] = []
    for j, row in enumerate(raw):
        at = f"{where} request {j}"
        if not isinstance(row, dict):
            raise ValueError(f"{at}: not a JSON object")
        stop = row.get("stop")
        model = row.get("model")
        req = TraceRequest(
            where=at,
            prompt_tokens=_whole(row, "in", at, low=1),
            output_tokens=_whole(row, "out", at, low=1),
            hash_ids=_hash_ids(row, at),
            duration_s=_seconds(row, "api_time", at),
            wait_after_s=_seconds(row, "think_time", at) or 0.0,
            finish_reason=stop if isinstance(stop, str) else None,
            model=model if isinstance(model, str) else None,
        )
        _check_blocks(req, block)
        t_now = _seconds(row, "t", at)
        if j and not explicit[-1]:  # the previous request gave no think_time: its `t` gap
            prev, t_prev = session.requests[-1], times[-1]
            if t_prev is not None and t_now is not None:
                took = prev.duration_s
                if took is None:
                    took = estimated_duration(prev.prompt_tokens, prev.output_tokens)
                prev.wait_after_s = max(0.0, t_now - t_prev - took)
        explicit.append("think_time" in row)
        times.append(t_now)
        session.requests.append(req)
    if times[0]:
        session.offset_s += times[0]
    out.append(session)
    subs = trace.get("subagents") or []
    if not isinstance(subs, list):
        raise ValueError(f"{where}: field 'subagents' is not a list")
    for k, sub in enumerate(subs):
        at = f"{where} subagent {k}"
        if not isinstance(sub, dict):
            raise ValueError(f"{at}: not a JSON object")
        offset = start + (_seconds(sub, "start", at) or 0.0)
        _kv_session(sub, at, offset, namespace, block, out, depth + 1)


# -- TraceLab -------------------------------------------------------------------------------------


def read_tracelab(text: str) -> list[TraceSession]:
    """TraceLab's replay CSV (`TRACELAB_COLUMNS`), one row per round of a session.

    Rows group by `session_id` (in order of first appearance) and sort by
    `round_idx`; `prefix_len` tokens of the input are reused (from the
    session's previous round, or at round 0 a prefix shared across sessions);
    `tool_wait_after_ms` is the wait before the next round. Every session
    starts at 0 (the format has no start times).

    Raises:
        ValueError: a missing column or a malformed row (named by its line).
    """
    reader = csv.DictReader(io.StringIO(text))
    names = [n.strip() for n in reader.fieldnames or ()]
    missing = [c for c in TRACELAB_COLUMNS if c not in names]
    if missing:
        raise ValueError(f"line 1: the header lacks column(s) {', '.join(missing)}")
    reader.fieldnames = names
    rounds: dict[str, dict[int, TraceRequest]] = {}
    for row in reader:
        where = f"line {reader.line_num}"
        if None in row or any(row.get(c) is None for c in TRACELAB_COLUMNS):
            raise ValueError(f"{where}: not {len(names)} columns")
        session_id = (row["session_id"] or "").strip()
        if not session_id:
            raise ValueError(f"{where}: field 'session_id' is empty")
        k = _whole(row, "round_idx", where)
        req = TraceRequest(
            where=where,
            prompt_tokens=_whole(row, "input_len", where, low=1),
            output_tokens=_whole(row, "output_len", where, low=1),
            prefix_len=_whole(row, "prefix_len", where),
            wait_after_s=_seconds(row, "tool_wait_after_ms", where, scale=1e-3) or 0.0,
        )
        if (req.prefix_len or 0) > req.prompt_tokens:
            raise ValueError(f"{where}: prefix_len is more than input_len")
        session = rounds.setdefault(session_id, {})
        if k in session:
            raise ValueError(f"{where}: round_idx repeats a round of the same session")
        session[k] = req
    if not rounds:
        raise ValueError("no row in the file")
    return [
        TraceSession(where=f"session {i}", offset_s=0.0, requests=[s[k] for k in sorted(s)])
        for i, s in enumerate(rounds.values())
    ]


def sniff(text: str) -> str | None:
    """The format a file's first line suggests (`record`, `mooncake`, `kvtrace`, `tracelab`)."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first.startswith(("{", "[")):
        try:
            row = json.loads(first)
        except json.JSONDecodeError:
            return "kvtrace" if first.startswith("[") or first == "{" else None
        if isinstance(row, list):
            return "kvtrace"
        if isinstance(row, dict):
            if row.get("type") == "header":
                return "record"
            if "input_length" in row and "hash_ids" in row:
                return "mooncake"
            if "requests" in row:
                return "kvtrace"
        return None
    cells = {c.strip() for c in first.split(",")}
    return "tracelab" if set(TRACELAB_COLUMNS) <= cells else None
