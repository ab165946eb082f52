"""`BatchedChatModel`'s field rules: the bounds checked at construction, the environment's defaults.

Written once here and read by the model's validator, so a bound and the message
that names it cannot drift apart.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ("BOUNDS", "check_bound", "float_env")

BOUNDS: dict[str, tuple[float, bool, str]] = {
    "request_timeout": (0, False, "no limit"),
    "total_timeout": (0, False, "no limit"),
    "stream_chunk_timeout": (0, True, "no limit, as 0"),
    "max_tokens": (1, True, "the server's default"),
    "temperature": (0, True, "the server's default"),
    "max_inflight": (1, True, ""),
    "max_retries": (0, True, "the scheduler policy's retry.max_attempts - 1"),
}
"""Field -> (lowest value, whether it is allowed, what None means)."""


def check_bound(name: str, value: Any) -> Any:
    """`value` when it is within `name`'s bound (or None where None is allowed).

    Raises:
        ValueError: out of bounds; the message names the field and its bound.
    """
    if value is None:
        return value
    low, inclusive, none = BOUNDS[name]
    if not (value >= low if inclusive else value > low):
        alt = f" (or None: {none})" if none else ""
        raise ValueError(f"{name} must be {'>=' if inclusive else '>'} {low}{alt}, got {value!r}")
    return value


def float_env(name: str, default: float) -> float | None:
    """A float from the environment (empty or absent: `default`; "0": no limit).

    Raises:
        ValueError: the variable is set to something that is not a number.
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    return value or None
