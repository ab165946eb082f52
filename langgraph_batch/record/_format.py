"""The recording format (JSON Lines, version 1): its constants, hashing and reader.

One JSON object per line, each with a `type`:

- `header` (first line): `format` (`"langgraph-batch-record"`), `version` (1),
  `created` (ISO 8601, UTC), `hash` (how digests are made), `content` (whether
  message texts are included), `langgraph_batch` (the library's version).
- `llm` (one per chat model call, written when it ends): `sibling` (int, the
  conversation, numbered in order of first appearance), `turn` (int, 0-based
  model call of that sibling), `start_s`/`end_s` (seconds since the first
  recorded event, monotonic clock), `model`, `prompt_tokens`,
  `cached_tokens` (prompt tokens the server had cached; null when it does not
  say), `output_tokens` (tokens; null when the server reports no usage),
  `messages` (messages sent), `prefix_messages` (leading messages identical to
  the sibling's previous call: all of them when the conversation grew by
  appending, fewer after a reset or compaction),
  `first_messages` (leading messages identical to the run's first call: the
  shared system prompt), `prefix_tokens` (optional: prompt tokens this call
  shares with the sibling's previous call, its previous prompt plus reply when
  the conversation grew by appending, fewer after a reset or compaction; null
  or absent when unknown, as in the Recorder's files; importers of foreign
  traces write it), `new` (`[role, hash, chars]` of each message after
  `prefix_messages`), `tools` (digest of the tool schemas offered, or null) and
  `tools_chars`, `tool_calls` (`[name, args_hash]` of each tool call the model
  made), `finish_reason`, `error` (null, or the exception's type name);
  with content, `content` (the new messages' texts) and `output` (the reply's).
- `tool` (one per tool execution, written when it ends): `sibling`, `turn`
  (the model call that asked for it; -1 when unknown), `name`, `args_hash`,
  `start_s`, `end_s`, `latency_s` (seconds), `result_chars`, `error`.
- `summary` (last line, written by `Recorder.close()`): totals (`siblings`,
  `llm_calls`, `tool_calls`, `prompt_tokens`, `cached_tokens`,
  `output_tokens`, `makespan_s`) and `shared_prefix` (`messages`: leading
  messages every sibling's first call shares, byte for byte; `chars`, with
  the tool schemas only when every first call offered the same ones;
  `tokens`: an estimate, the first calls' prompt tokens in proportion to
  those characters, never below the fewest cached tokens a later sibling's
  first call saw; without usage, the typical estimate of the characters).

Digests are HMAC-SHA256 of the canonical JSON of a message (role, text, tool
calls without their ids), keyed per recording (a random key unless one is
given), as 16 hex characters: equal texts in one recording have equal
digests, and a digest cannot be matched against a dictionary of common
strings without the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langgraph_batch._estimates import typical_tokens

__all__ = (
    "FORMAT",
    "FORMAT_VERSION",
    "LLMCall",
    "Recording",
    "ToolRun",
    "digest",
    "read_recording",
)

FORMAT = "langgraph-batch-record"
FORMAT_VERSION = 1
HASH_NAME = "hmac-sha256, hex, first 16 characters, keyed per recording"
CLOCK = "seconds since the first recorded event (monotonic)"
_DC: dict[str, bool] = {"frozen": True, "slots": True, "kw_only": True}


def digest(key: bytes, value: Any) -> str:
    """The keyed digest of `value`'s canonical JSON (16 hex characters)."""
    raw = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hmac.new(key, raw, hashlib.sha256).hexdigest()[:16]


@dataclass(**_DC)
class LLMCall:
    """One `llm` line: a model call of one sibling."""

    sibling: int
    turn: int
    start_s: float
    end_s: float
    prompt_tokens: int | None
    cached_tokens: int | None
    output_tokens: int | None
    messages: int
    prefix_messages: int
    first_messages: int
    new: tuple[tuple[str, str, int], ...]
    tool_calls: tuple[tuple[str, str], ...]
    tools: str | None = None
    tools_chars: int = 0
    finish_reason: str | None = None
    error: str | None = None
    model: str | None = None
    prefix_tokens: int | None = None
    """Prompt tokens shared with the sibling's previous call (None: unknown)."""


@dataclass(**_DC)
class ToolRun:
    """One `tool` line: a tool execution."""

    sibling: int
    turn: int
    name: str
    args_hash: str
    start_s: float
    end_s: float
    latency_s: float
    result_chars: int
    error: str | None = None


@dataclass(**_DC)
class Recording:
    """A parsed recording: its header, model calls, tool runs and summary (if closed)."""

    header: Mapping[str, Any]
    calls: tuple[LLMCall, ...]
    tools: tuple[ToolRun, ...]
    summary: Mapping[str, Any] | None = None
    warnings: tuple[str, ...] = field(default=())

    def siblings(self) -> dict[int, list[LLMCall]]:
        """Each sibling's calls, in turn order."""
        out: dict[int, list[LLMCall]] = {}
        for call in sorted(self.calls, key=lambda c: (c.sibling, c.turn)):
            out.setdefault(call.sibling, []).append(call)
        return out


def _call(row: Mapping[str, Any]) -> LLMCall:
    return LLMCall(
        sibling=_int(row["sibling"]),
        turn=_int(row["turn"]),
        start_s=_seconds(row["start_s"]),
        end_s=_seconds(row["end_s"]),
        prompt_tokens=_opt_tokens(row.get("prompt_tokens")),
        cached_tokens=_opt_tokens(row.get("cached_tokens")),
        output_tokens=_opt_tokens(row.get("output_tokens")),
        messages=_count(row.get("messages") or 0),
        prefix_messages=_count(row.get("prefix_messages") or 0),
        first_messages=_count(row.get("first_messages") or 0),
        new=tuple((str(r), str(h), _tokens(c)) for r, h, c in row.get("new") or ()),
        tool_calls=tuple((str(n), str(h)) for n, h, *_ in row.get("tool_calls") or ()),
        tools=row.get("tools"),
        tools_chars=_count(row.get("tools_chars") or 0),
        finish_reason=row.get("finish_reason"),
        error=row.get("error"),
        model=row.get("model"),
        prefix_tokens=_opt_tokens(row.get("prefix_tokens")),
    )


def _tool(row: Mapping[str, Any]) -> ToolRun:
    return ToolRun(
        sibling=_int(row.get("sibling", -1)),
        turn=_int(row.get("turn", -1)),
        name=str(row.get("name") or ""),
        args_hash=str(row.get("args_hash") or ""),
        start_s=_seconds(row["start_s"]),
        end_s=_seconds(row["end_s"]),
        latency_s=_seconds(row["latency_s"]),
        result_chars=_count(row.get("result_chars") or 0),
        error=row.get("error"),
    )


MAX_TOKENS = 1 << 24
"""The most tokens one number of a recording may say (16M: beyond any context window)."""


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"{value!r} is not a whole number")
    try:
        number = float(value)
    except ValueError:
        raise TypeError(f"{value!r} is not a whole number") from None
    if not math.isfinite(number) or number != int(number):
        raise TypeError(f"{value!r} is not a whole number")
    return int(number)


def _count(value: Any) -> int:
    number = _int(value)
    if number < 0:
        raise TypeError(f"{value!r} is negative")
    return number


def _tokens(value: Any) -> int:
    number = _count(value)
    if number > MAX_TOKENS:
        raise TypeError(f"{value!r} tokens is more than any context window ({MAX_TOKENS})")
    return number


def _opt_tokens(value: Any) -> int | None:
    return None if value is None else _tokens(value)


def _seconds(value: Any) -> float:
    """A time or a duration in seconds: finite and not negative (JSON lets NaN through)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{value!r} is not a number of seconds")
    if not math.isfinite(value) or value < 0:
        raise TypeError(f"{value!r} is not a finite, non-negative number of seconds")
    return float(value)


def parse_lines(lines: Iterable[str]) -> Recording:
    """Parse a recording's lines (see the module docstring).

    Raises:
        ValueError: not a recording, a version this library cannot read, or a
            malformed line (its number is in the message).
    """
    header: Mapping[str, Any] | None = None
    calls: list[LLMCall] = []
    tools: list[ToolRun] = []
    summary: Mapping[str, Any] | None = None
    warnings: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            kind = row.get("type")
            if header is None:
                if kind != "header" or row.get("format") != FORMAT:
                    # Not quoted: a file given by mistake may hold secrets or prompts.
                    raise ValueError(f"not a {FORMAT} file (its first line is no {FORMAT} header)")
                if int(row.get("version", 0)) > FORMAT_VERSION:
                    raise ValueError(
                        f"format version {row.get('version')}; this library reads "
                        f"up to {FORMAT_VERSION}: upgrade langgraph-batch"
                    )
                header = row
            elif kind == "llm":
                calls.append(_call(row))
            elif kind == "tool":
                tools.append(_tool(row))
            elif kind == "summary":
                summary = row
            else:
                warnings.append(f"line {number}: unknown type {kind!r}, skipped")
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"line {number}: malformed ({type(exc).__name__}: {exc})") from None
    if header is None:
        raise ValueError("empty recording: no header line")
    if summary is None:
        warnings.append("no summary line: the recorder was not closed (totals recomputed)")
    return Recording(
        header=header,
        calls=tuple(calls),
        tools=tuple(tools),
        summary=summary,
        warnings=tuple(warnings),
    )


def read_recording(path: str | Path) -> Recording:
    """Read a recording written by `Recorder`.

    Raises:
        ValueError: see `parse_lines`.
        OSError: the file cannot be read.
    """
    with Path(path).open(encoding="utf-8") as fh:
        return parse_lines(fh)


def shared_prefix(firsts: Sequence[LLMCall]) -> dict[str, Any]:
    """The run's shared prefix, from every sibling's first call (see `summary`).

    Only what is byte-identical across the first calls counts: the leading
    messages they all share with the run's first call, and the tool schemas
    only when every first call offered the same ones (equal digests). The
    tokens are the first prompts' tokens in proportion to those characters
    (their median), raised to what the server proved shared: the fewest cached
    tokens any later sibling's first call saw (a single call's cache may hold
    a conversation of its own from before the recording, so the fewest, not
    the most).
    """
    if not firsts:
        return {"messages": 0, "chars": 0, "tokens": 0}
    if len(firsts) == 1:
        # One sibling: its system turn (leading system messages) is what would be shared.
        roles = [role for role, _, _ in firsts[0].new]
        m = next((i for i, r in enumerate(roles) if r not in ("system", "developer")), len(roles))
    else:
        m = min(c.first_messages for c in firsts[1:])
    ref = firsts[0].new
    same_tools = firsts[0].tools is not None and all(c.tools == firsts[0].tools for c in firsts)
    chars = sum(c for _, _, c in ref[:m]) + (firsts[0].tools_chars if m and same_tools else 0)
    estimates = []
    for call in firsts:
        total = sum(c for _, _, c in call.new) + call.tools_chars
        if call.prompt_tokens and total:
            estimates.append(call.prompt_tokens * chars / total)
    tokens = round(sorted(estimates)[len(estimates) // 2]) if estimates else typical_tokens(chars)
    later = [c.cached_tokens for c in firsts[1:]]
    proven = min(x or 0 for x in later) if later and None not in later else 0
    floor = min((c.prompt_tokens or 0 for c in firsts), default=0)
    if m and proven and proven > tokens:
        tokens = min(proven, floor) if floor else proven
    return {"messages": m, "chars": chars, "tokens": tokens}
