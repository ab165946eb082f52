"""Rate-limit headers, read: what a provider says is left of each per-minute budget.

Two spellings, both sent on every response (429s included):

- OpenAI (https://platform.openai.com/docs/guides/rate-limits, "Rate limits
  in headers"): `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`; a
  reset is a Go duration (`1s`, `6m0s`, `20ms`, `1m26.4s`), "the time until
  the rate limit resets to its initial state". Tokens are input + output.
- Anthropic (https://docs.anthropic.com/en/api/rate-limits, "Response
  headers"): `anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-
  {limit,remaining,reset}`; a reset is an RFC 3339 time. `tokens` is "the most
  restrictive limit currently in effect", so it is read only when the input
  and output headers are absent.

`parse_rate_headers` turns either into one `RateReading` per dimension
(`requests`, `tokens`, `input_tokens`, `output_tokens`); a malformed value is
skipped, never an error (a server's headers must not fail a call).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

__all__ = ("RateReading", "has_rate_headers", "parse_go_duration", "parse_rate_headers")

_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|us|µs|ns|m|s)")
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}

_OPENAI = {"requests": "requests", "tokens": "tokens"}
_ANTHROPIC = {
    "requests": "requests",
    "input-tokens": "input_tokens",
    "output-tokens": "output_tokens",
    "tokens": "tokens",
}


@dataclass(frozen=True, slots=True)
class RateReading:
    """One dimension of a provider's limits, as one response stated it."""

    limit: float
    """The per-minute limit."""
    remaining: float
    """What was left when the server answered."""
    reset_s: float | None
    """Seconds until the budget is full again (None: not stated or unreadable)."""


def parse_go_duration(text: str) -> float | None:
    """Seconds in a Go duration (`6m0s`, `20ms`, `1.5s`), or None when it is not one.

    Example:
        ```python
        assert parse_go_duration("6m0s") == 360.0
        assert parse_go_duration("20ms") == 0.02
        assert parse_go_duration("soon") is None
        ```
    """
    text = text.strip()
    if text in ("0", "0s"):
        return 0.0
    pos, total = 0, 0.0
    for match in _GO_PART.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _GO_UNITS[match.group(2)]
        pos = match.end()
    return total if pos == len(text) and pos > 0 else None


def _rfc3339_in(text: str, wall_now: float) -> float | None:
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - wall_now)


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value >= 0 else None


def _get(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None and not hasattr(headers, "multi_items"):  # a plain dict: any case
        for key, val in headers.items():
            if key.lower() == name:
                return val
    return value


def has_rate_headers(headers: Mapping[str, str]) -> bool:
    """Whether a response states any rate limit (cheap: two lookups on httpx headers)."""
    return (
        _get(headers, "x-ratelimit-limit-requests") is not None
        or _get(headers, "x-ratelimit-limit-tokens") is not None
        or _get(headers, "anthropic-ratelimit-requests-limit") is not None
        or _get(headers, "anthropic-ratelimit-input-tokens-limit") is not None
        or _get(headers, "anthropic-ratelimit-tokens-limit") is not None
    )


def parse_rate_headers(
    headers: Mapping[str, str], *, wall_now: float | None = None
) -> dict[str, RateReading]:
    """Every stated budget, by dimension, in either provider's spelling.

    Args:
        headers: the response headers (`httpx.Headers` or a dict in any case).
        wall_now: the wall clock (`time.time()`) to read RFC 3339 resets against.

    Returns:
        `requests`, `tokens`, `input_tokens`, `output_tokens`: those stated
        with a readable limit and remaining; empty when none is.

    Example:
        ```python
        readings = parse_rate_headers(
            {
                "x-ratelimit-limit-tokens": "150000",
                "x-ratelimit-remaining-tokens": "149984",
                "x-ratelimit-reset-tokens": "6ms",
            }
        )
        assert readings["tokens"].reset_s == 0.006
        ```
    """
    out: dict[str, RateReading] = {}
    for part, dim in _OPENAI.items():
        limit = _number(_get(headers, f"x-ratelimit-limit-{part}"))
        remaining = _number(_get(headers, f"x-ratelimit-remaining-{part}"))
        if limit and remaining is not None:
            raw = _get(headers, f"x-ratelimit-reset-{part}")
            reset = parse_go_duration(raw) if raw is not None else None
            out[dim] = RateReading(limit, min(remaining, limit), reset)
    wall = time.time() if wall_now is None else wall_now
    for part, dim in _ANTHROPIC.items():
        if dim == "tokens" and ("input_tokens" in out or "output_tokens" in out):
            continue  # the most restrictive of those two, already read
        limit = _number(_get(headers, f"anthropic-ratelimit-{part}-limit"))
        remaining = _number(_get(headers, f"anthropic-ratelimit-{part}-remaining"))
        if limit and remaining is not None and dim not in out:
            raw = _get(headers, f"anthropic-ratelimit-{part}-reset")
            reset = _rfc3339_in(raw, wall) if raw is not None else None
            out[dim] = RateReading(limit, min(remaining, limit), reset)
    return out
