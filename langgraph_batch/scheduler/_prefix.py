"""Prefix keys for prefix warming: a cheap hash of a request's shared leading part.

Siblings of one fan_out usually send the same system prompt and the same
tools, then their own user message. The key identifies that shared part:
the model, the leading system (or developer) messages' content and the
tools list. It is computed once per request, in the caller's task, so it
must stay cheap:

- `str` hashes are cached by CPython on the string object, and LangChain
  reuses the same system-prompt string across calls;
- the tools list is serialised to canonical JSON once per distinct list
  object (`bind_tools` binds one list that every call reuses), remembered by
  `id()` in a small bounded dict that keeps the list alive so that the id
  cannot be reused. A tools list mutated in place after its first use keeps
  its old hash (harmless: the key only steers scheduling, never results).

A hash collision between two different prefixes only makes one of them wait
for the other's first token; it never changes a response.
"""

from __future__ import annotations

import json
from typing import Any

from langgraph_batch.backends.base import ChatRequest

__all__ = ("prefix_key",)

_TOOLS_MEMORY = 256
_tools_hashes: dict[int, tuple[object, int]] = {}
_SYSTEM_ROLES = frozenset({"system", "developer"})


def _canonical_hash(value: Any) -> int:
    return hash(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str))


def _tools_hash(tools: object) -> int:
    k = id(tools)
    hit = _tools_hashes.get(k)
    if hit is not None and hit[0] is tools:
        return hit[1]
    h = _canonical_hash(tools)
    if len(_tools_hashes) >= _TOOLS_MEMORY:
        del _tools_hashes[next(iter(_tools_hashes))]
    _tools_hashes[k] = (tools, h)
    return h


def prefix_key(request: ChatRequest) -> int | None:
    """The key of the prompt prefix a request shares with its siblings.

    Args:
        request: a chat request.

    Returns:
        A hash of (model, leading system/developer message contents, tools),
        or None when the request has neither a leading system message nor
        tools (nothing worth warming).

    Example:
        ```python
        sys = {"role": "system", "content": "You are a careful reviewer."}
        a = ChatRequest(model="m", messages=[sys, {"role": "user", "content": "a"}])
        b = ChatRequest(model="m", messages=[sys, {"role": "user", "content": "b"}])
        assert prefix_key(a) == prefix_key(b) is not None
        ```
    """
    tools = request.params.get("tools") if request.params else None
    th = _tools_hash(tools) if tools else 0
    system: Any = None
    parts: list[Any] | None = None
    for msg in request.messages:
        if msg.get("role") not in _SYSTEM_ROLES:
            break
        content = msg.get("content")
        if not isinstance(content, str):
            content = _canonical_hash(content)
        if system is None:
            system = content
        else:
            if parts is None:
                parts = [system]
            parts.append(content)
    if system is None and not th:
        return None
    if parts is not None:
        system = tuple(parts)
    return hash((request.model, system, th))
