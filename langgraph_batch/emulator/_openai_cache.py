"""OpenAI's prompt-caching rules, as a pure object with an explicit clock.

Every rule cites OpenAI's "Prompt caching" guide
(https://platform.openai.com/docs/guides/prompt-caching, "the guide" below).
Caching is automatic; what a request gets back is
`usage.prompt_tokens_details.cached_tokens`. The hosted service is many
machines: a request is routed by a hash of its prompt's opening tokens
combined with its `prompt_cache_key`, and only the machine it lands on can
serve its prefix from cache. The emulator keeps one prefix store per
machine, so keys and rates change hit rates as they do on the service.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = (
    "INCREMENT_TOKENS",
    "MIN_CACHED_TOKENS",
    "RETENTIONS",
    "ROUTE_PREFIX_TOKENS",
    "ROUTE_RATE_PER_MIN",
    "OpenAIPromptCache",
    "cacheable_lengths",
)

DOC_URL = "https://platform.openai.com/docs/guides/prompt-caching"

MIN_CACHED_TOKENS = 1024
"""The guide: caching is enabled for prompts of 1024 tokens or more; below, `cached_tokens` is 0."""
INCREMENT_TOKENS = 128
"""The guide: hits occur in increments of 128 tokens after the first 1024
(cached_tokens is 0, 1024, 1152, 1280, ...)."""
ROUTE_PREFIX_TOKENS = 256
"""The guide: requests are routed by a hash of the prompt's initial prefix
("typically the first 256 tokens"), combined with `prompt_cache_key` when set."""
ROUTE_RATE_PER_MIN = 15
"""The guide: above about 15 requests per minute for one prefix and key,
requests overflow to other machines, where they miss."""
RETENTIONS = {"in_memory": (600.0, 3600.0), "24h": (86_400.0, 86_400.0)}
"""`prompt_cache_retention` -> (idle lifetime, longest lifetime), seconds. The
guide: in-memory prefixes stay "5 to 10 minutes of inactivity, up to a maximum
of one hour"; "24h" keeps them up to 24 hours."""


def cacheable_lengths(n_tokens: int) -> list[int]:
    """The prefix lengths a prompt of `n_tokens` can hit at: 1024, 1152, ... <= n.

    Example:
        ```python
        assert cacheable_lengths(1300) == [1024, 1152, 1280]
        assert cacheable_lengths(1000) == []
        ```
    """
    return list(range(MIN_CACHED_TOKENS, n_tokens + 1, INCREMENT_TOKENS))


def _digests(ids: Sequence[int], lengths: Sequence[int]) -> list[str]:
    h = hashlib.blake2b(digest_size=16)
    out: list[str] = []
    start = 0
    for n in lengths:
        h.update(b"".join(i.to_bytes(4, "little") for i in ids[start:n]))
        out.append(h.copy().hexdigest())
        start = n
    return out


@dataclass(slots=True)
class _Entry:
    born: float
    used: float
    retention: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CachedPrompt:
    """The outcome of one request: what it read, and what it will leave behind."""

    cached_tokens: int
    machine: int
    digests: tuple[str, ...]
    retention: str


class OpenAIPromptCache:
    """Prefix stores of `machines` emulated machines, and the routing between them.

    Args:
        machines: How many machines the routing spreads over.
        seed: Seeds the overflow choice.

    Example:
        ```python
        cache = OpenAIPromptCache()
        prompt = list(range(2000))
        first = cache.lookup(prompt, key=None, retention=None, now=0.0)
        assert first.cached_tokens == 0
        cache.commit(first, now=1.0)
        assert cache.lookup(prompt, key=None, retention=None, now=2.0).cached_tokens == 1920
        ```
    """

    def __init__(self, *, machines: int = 64, seed: int = 0) -> None:
        if machines < 1:
            raise ValueError(f"machines must be >= 1, got {machines}")
        self._machines = machines
        self._stores: list[dict[str, _Entry]] = [{} for _ in range(machines)]
        self._recent: dict[str, deque[float]] = {}
        self._rng = random.Random(seed)

    def clear(self) -> None:
        """Forget every entry and every routing rate."""
        for store in self._stores:
            store.clear()
        self._recent.clear()

    def _route(self, ids: Sequence[int], key: str | None, now: float) -> int:
        head = b"".join(i.to_bytes(4, "little") for i in ids[:ROUTE_PREFIX_TOKENS])
        route = hashlib.blake2b(head + b"\x00" + (key or "").encode(), digest_size=8)
        name = route.hexdigest()
        home = int(name, 16) % self._machines
        recent = self._recent.setdefault(name, deque())
        while recent and recent[0] <= now - 60.0:
            recent.popleft()
        recent.append(now)
        if len(recent) > ROUTE_RATE_PER_MIN and self._machines > 1:
            # Overflow: another machine, which has not seen this prefix.
            return (home + 1 + self._rng.randrange(self._machines - 1)) % self._machines
        return home

    def lookup(
        self, ids: Sequence[int], *, key: str | None, retention: str | None, now: float
    ) -> CachedPrompt:
        """Route a prompt and find its longest cached prefix on that machine.

        Raises:
            ValueError: `retention` is not "in_memory", "24h" or None.
        """
        retention = retention or "in_memory"
        if retention not in RETENTIONS:
            raise ValueError(
                f"Invalid value for 'prompt_cache_retention': {retention!r}; "
                "expected 'in_memory' or '24h'."
            )
        machine = self._route(ids, key, now)
        lengths = cacheable_lengths(len(ids))
        digests = _digests(ids, lengths)
        store = self._stores[machine]
        cached = 0
        for n, d in zip(reversed(lengths), reversed(digests), strict=True):
            entry = store.get(d)
            if entry is None:
                continue
            idle, longest = RETENTIONS[entry.retention]
            if now - entry.used > idle or now - entry.born > longest:
                del store[d]
                continue
            entry.used = now
            cached = n
            break
        return CachedPrompt(
            cached_tokens=cached, machine=machine, digests=tuple(digests), retention=retention
        )

    def commit(self, prompt: CachedPrompt, *, now: float) -> None:
        """Store every 128-token boundary of a finished request's prompt on its machine."""
        store = self._stores[prompt.machine]
        for d in prompt.digests:
            entry = store.get(d)
            if entry is None or entry.retention != prompt.retention:
                store[d] = _Entry(born=now, used=now, retention=prompt.retention)
            else:
                entry.used = now
