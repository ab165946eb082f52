"""Anthropic's prompt-caching rules, as a pure object with an explicit clock.

Every rule cites Anthropic's "Prompt caching" page
(https://platform.claude.com/docs/en/build-with-claude/prompt-caching, "the
page" below). A request is a flat list of content blocks in the order the
cache prefix is built (tools, then system, then messages); each block has a
token count, a digest of everything up to and including it, and the TTL of
its `cache_control` breakpoint, if it has one. `PromptCache.plan` decides
what the request reads, writes and pays; `PromptCache.commit` makes its
writes visible, which the server does when the response begins (the page:
"a cache entry only becomes available after the first response begins";
requests sent concurrently with the first one do not see its entry).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = (
    "LOOKBACK_BLOCKS",
    "MAX_BREAKPOINTS",
    "READ_MULTIPLIER",
    "TTL_S",
    "WRITE_MULTIPLIER",
    "Block",
    "CachePlan",
    "CacheRuleError",
    "PromptCache",
    "chain_digests",
    "min_cacheable_tokens",
)

DOC_URL = "https://platform.claude.com/docs/en/build-with-claude/prompt-caching"

MAX_BREAKPOINTS = 4
"""The page: "You can define up to 4 cache breakpoints"; a fifth is a 400."""
LOOKBACK_BLOCKS = 20
"""The page: at each breakpoint the system checks for hits at earlier block
boundaries, "up to approximately 20 blocks before your explicit breakpoint"."""
TTL_S = {"5m": 300.0, "1h": 3600.0}
"""The page: `ttl` is "5m" (the default) or "1h"; a hit refreshes the entry's
lifetime at no cost."""
WRITE_MULTIPLIER = {"5m": 1.25, "1h": 2.0}
"""The page's pricing: a cache write costs 1.25x the base input price (5m) or 2x (1h)."""
READ_MULTIPLIER = 0.1
"""The page's pricing: a cache read costs 0.1x the base input price."""


class CacheRuleError(ValueError):
    """A request the API refuses with a 400 (`invalid_request_error`)."""


def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix a breakpoint caches, by model family.

    The page's table: 1024 tokens for Sonnet and Opus models, 2048 for Haiku
    models. A breakpoint on a shorter prefix is not an error: it caches
    nothing and those tokens are billed as plain input.

    Example:
        ```python
        assert min_cacheable_tokens("claude-sonnet-4-5") == 1024
        assert min_cacheable_tokens("claude-3-5-haiku-latest") == 2048
        ```
    """
    return 2048 if "haiku" in model else 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    """One content block of a request, in cache-prefix order."""

    tokens: int
    """Its token count."""
    digest: str
    """A digest of every block up to and including this one (`chain_digests`)."""
    ttl: str | None = None
    """The TTL of its `cache_control` breakpoint ("5m"/"1h"), None without one."""


def chain_digests(model: str, parts: Sequence[Any]) -> list[str]:
    """Cumulative digests: the i-th covers `model` and `parts[0..i]` (JSON, keys sorted).

    The cache is per model and matches prefixes exactly (the page: "cache hits
    require 100% identical prompt segments ... up to and including the block
    marked with cache control"). Callers strip `cache_control` from the parts
    first, so moving a breakpoint does not change the blocks before it.
    """
    h = hashlib.blake2b(model.encode(), digest_size=16)
    out: list[str] = []
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, separators=(",", ":")).encode())
        out.append(h.copy().hexdigest())
    return out


@dataclass(slots=True, kw_only=True)
class CachePlan:
    """What one request reads, writes and is billed for (Anthropic's `usage` fields)."""

    input_tokens: int = 0
    """Tokens after the last cached or written prefix (billed at 1x)."""
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    ephemeral_5m_input_tokens: int = 0
    ephemeral_1h_input_tokens: int = 0
    writes: list[tuple[str, str]] = field(default_factory=list)
    """(digest, ttl) of the entries this request writes, visible on `commit`."""

    @property
    def prompt_tokens(self) -> int:
        """Every prompt token: input plus cache read plus cache creation."""
        return self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens

    def usage(self, output_tokens: int) -> dict[str, Any]:
        """The response's `usage` object, as the Messages API sends it."""
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.ephemeral_5m_input_tokens,
                "ephemeral_1h_input_tokens": self.ephemeral_1h_input_tokens,
            },
            "output_tokens": output_tokens,
            "service_tier": "standard",
        }

    def relative_cost(self) -> float:
        """Prompt cost in base-input-token units (the page's multipliers)."""
        return (
            self.input_tokens
            + READ_MULTIPLIER * self.cache_read_input_tokens
            + WRITE_MULTIPLIER["5m"] * self.ephemeral_5m_input_tokens
            + WRITE_MULTIPLIER["1h"] * self.ephemeral_1h_input_tokens
        )


@dataclass(slots=True)
class _Entry:
    ttl: str
    expires_at: float


def check_breakpoints(blocks: Sequence[Block]) -> list[int]:
    """Indices of the breakpoints, after the page's validity rules.

    Raises:
        CacheRuleError: More than `MAX_BREAKPOINTS`; an unknown TTL; a "1h"
            breakpoint after a "5m" one (the page, "Mixing different TTLs":
            longer TTLs must appear before shorter ones).
    """
    marks = [i for i, b in enumerate(blocks) if b.ttl is not None]
    if len(marks) > MAX_BREAKPOINTS:
        raise CacheRuleError(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {len(marks)}."
        )
    seen_short = False
    for i in marks:
        ttl = blocks[i].ttl
        if ttl not in TTL_S:
            raise CacheRuleError(f"cache_control.ttl must be '5m' or '1h', got {ttl!r}.")
        if ttl == "5m":
            seen_short = True
        elif seen_short:
            raise CacheRuleError(
                "a cache_control block with ttl='1h' must not come after one with ttl='5m' "
                "(tools, system, messages order)."
            )
    return marks


class PromptCache:
    """The cache entries of one emulated organisation, and the rules that read and write them.

    Args:
        model: The model every request of this cache uses (its minimum length).

    Example:
        ```python
        cache = PromptCache("claude-sonnet-4-5")
        blocks = [Block(tokens=2000, digest="a", ttl="5m"), Block(tokens=10, digest="b")]
        first = cache.plan(blocks, now=0.0)
        assert first.cache_creation_input_tokens == 2000
        cache.commit(first, now=0.5)  # the response began
        assert cache.plan(blocks, now=1.0).cache_read_input_tokens == 2000
        ```
    """

    def __init__(self, model: str = "claude-sonnet-4-5") -> None:
        self._entries: dict[str, _Entry] = {}
        self.model = model

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()

    def _live(self, digest: str, now: float) -> _Entry | None:
        entry = self._entries.get(digest)
        if entry is None:
            return None
        if entry.expires_at < now:
            del self._entries[digest]
            return None
        return entry

    def plan(self, blocks: Sequence[Block], *, now: float, model: str | None = None) -> CachePlan:
        """Decide what a request reads from the cache, writes to it and pays.

        - Read: at each breakpoint the longest live entry at that boundary or
          one of the `LOOKBACK_BLOCKS` - 1 before it is a hit; the longest hit
          of all breakpoints is read, and its entry's lifetime restarts.
        - Write: each later breakpoint whose prefix holds at least
          `min_cacheable_tokens` writes an entry; the tokens between the end
          of the previous write (or read) and it are billed as creation at its
          TTL (the page's `cache_creation.ephemeral_5m/1h_input_tokens`).
        - The rest of the prompt is `input_tokens` (the page: input tokens are
          those "after the last cache breakpoint").

        Raises:
            CacheRuleError: The breakpoints break a rule (`check_breakpoints`).
        """
        marks = check_breakpoints(blocks)
        least = min_cacheable_tokens(model or self.model)
        ends: list[int] = []
        total = 0
        for b in blocks:
            total += b.tokens
            ends.append(total)
        read_at = -1
        for m in marks:
            for j in range(m, max(-1, m - LOOKBACK_BLOCKS), -1):
                if j <= read_at:
                    break
                entry = self._live(blocks[j].digest, now)
                if entry is not None:
                    read_at = j
                    break
        plan = CachePlan()
        done = 0
        if read_at >= 0:
            entry = self._entries[blocks[read_at].digest]
            entry.expires_at = now + TTL_S[entry.ttl]
            plan.cache_read_input_tokens = done = ends[read_at]
        for m in marks:
            ttl = blocks[m].ttl
            assert ttl is not None
            if m <= read_at or ends[m] < least:
                continue
            written = ends[m] - done
            done = ends[m]
            plan.cache_creation_input_tokens += written
            if ttl == "1h":
                plan.ephemeral_1h_input_tokens += written
            else:
                plan.ephemeral_5m_input_tokens += written
            plan.writes.append((blocks[m].digest, ttl))
        plan.input_tokens = total - done
        return plan

    def commit(self, plan: CachePlan, *, now: float) -> None:
        """Make a request's writes visible (its response began at `now`)."""
        for digest, ttl in plan.writes:
            old = self._entries.get(digest)
            expires = now + TTL_S[ttl]
            if old is None or old.expires_at < expires:
                self._entries[digest] = _Entry(ttl=ttl, expires_at=expires)


def strip_cache_control(part: Mapping[str, Any]) -> dict[str, Any]:
    """A block without its `cache_control` (what the cache digests)."""
    return {k: v for k, v in part.items() if k != "cache_control"}
