"""A tiny parser for the Prometheus text exposition format (engines' `/metrics`).

Only what the backends need: sample name, labels and value. Comments,
`# HELP`/`# TYPE` lines, timestamps and lines it cannot read are skipped, so a
server that adds metrics or exotic lines never breaks `metrics()`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Container, Iterable

__all__ = ("Samples", "parse_prometheus")

Sample = tuple[dict[str, str], float]

_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], value)


class Samples:
    """Parsed samples, by metric name, with the aggregations engines need."""

    __slots__ = ("_by_name",)

    def __init__(self, by_name: dict[str, list[Sample]]) -> None:
        self._by_name = by_name

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def names(self) -> Iterable[str]:
        """Every sample name seen."""
        return self._by_name.keys()

    def get(self, name: str) -> list[Sample]:
        """Every (labels, value) sample of `name` (empty when absent)."""
        return self._by_name.get(name, [])

    def sum(self, *names: str) -> float | None:
        """Sum over all label sets of the first name present (None: none present).

        Engines export one series per engine/model/label combination; counters
        and request gauges add up across them.
        """
        for name in names:
            samples = self._by_name.get(name)
            if samples:
                return math.fsum(v for _, v in samples if not math.isnan(v))
        return None

    def mean(self, *names: str) -> float | None:
        """Mean over all label sets of the first name present (for ratios such as usage)."""
        for name in names:
            values = [v for _, v in self._by_name.get(name, ()) if not math.isnan(v)]
            if values:
                return math.fsum(values) / len(values)
        return None


def _parse_value(text: str) -> float | None:
    token = text.split(None, 1)[0] if text.strip() else ""
    try:
        return float(token)  # accepts NaN, +Inf, -Inf, 1e3
    except ValueError:
        return None


def parse_prometheus(text: str, *, names: Container[str] | None = None) -> Samples:
    r"""Parse Prometheus text exposition into `Samples`.

    Args:
        text: the `/metrics` body.
        names: keep only these sample names (skips histogram buckets cheaply).

    Example:
        ```python
        s = parse_prometheus('vllm:num_requests_running{engine="0"} 3.0\\n')
        s.sum("vllm:num_requests_running")  # 3.0
        ```
    """
    by_name: dict[str, list[Sample]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        labels: dict[str, str] = {}
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            if names is not None and name not in names:
                continue
            end = line.rfind("}")
            if end < brace:
                continue
            body = line[brace + 1 : end]
            pos = 0
            while pos < len(body):
                m = _LABEL.match(body, pos)
                if m is None:
                    break
                labels[m.group(1)] = _unescape(m.group(2))
                pos = m.end()
            rest = line[end + 1 :]
        else:
            if space == -1:
                continue
            name = line[:space]
            if names is not None and name not in names:
                continue
            rest = line[space:]
        value = _parse_value(rest)
        if value is None or not name:
            continue
        by_name.setdefault(name, []).append((labels, value))
    return Samples(by_name)
