"""Token counts from the server's own tokenizer, for `BatchedChatModel.get_num_tokens*`.

LangChain's default `get_num_tokens` needs a local GPT-2 tokenizer (a
download, and the wrong tokenizer for the served model). The server knows its
tokenizer and chat template: vLLM, SGLang and the emulator answer
`POST /tokenize`. Counts are cached per (server, model, text) in a bounded LRU,
so `trim_messages(token_counter=llm)` asks about each message once.

A server without the route (a cloud API, an old engine) or one that cannot be
reached gets the typical estimate (`_estimates.typical_tokens`: ~4 characters
per token plus 8 per message for the template), with one WARNING per server
and reason;
estimates are not cached (the server may come back).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

from langgraph_batch._estimates import CHARS_PER_TOKEN, typical_tokens
from langgraph_batch._loop import background_loop
from langgraph_batch.backends.base import Backend
from langgraph_batch.chat_model._convert import messages_to_openai
from langgraph_batch.chat_model._structured import format_tools
from langgraph_batch.errors import BackendError

__all__ = (
    "CACHE_SIZE",
    "TokenCounter",
    "acount",
    "cached",
    "estimate",
    "fallback",
)

logger = logging.getLogger("langgraph_batch.chat_model")

CACHE_SIZE = 4096
"""Counts kept (LRU): about 4096 distinct texts or conversations."""

_lock = threading.Lock()
_counts: OrderedDict[str, int] = OrderedDict()
_warned: set[tuple[str, str]] = set()


def _key(scope: str, model: str, payload: Mapping[str, Any]) -> str:
    raw = json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(f"{scope}\0{model}\0{raw}".encode()).hexdigest()


def cached(scope: str, model: str, payload: Mapping[str, Any]) -> int | None:
    """The cached count for `payload` (`{"prompt": ...}` or `{"messages", "tools"}`), if any."""
    key = _key(scope, model, payload)
    with _lock:
        count = _counts.get(key)
        if count is not None:
            _counts.move_to_end(key)
        return count


def _store(scope: str, model: str, payload: Mapping[str, Any], count: int) -> None:
    key = _key(scope, model, payload)
    with _lock:
        _counts[key] = count
        _counts.move_to_end(key)
        while len(_counts) > CACHE_SIZE:
            _counts.popitem(last=False)


def estimate(payload: Mapping[str, Any]) -> int:
    """The typical estimate: ~4 characters per token, plus 8 per message for the template."""
    if "prompt" in payload:
        return typical_tokens(len(str(payload["prompt"])))
    messages = payload.get("messages") or []
    text = json.dumps([m.get("content") for m in messages], default=str)
    tools = payload.get("tools")
    if tools:
        text += json.dumps(tools, default=str)
    return typical_tokens(len(text), messages=len(messages))


def fallback(scope: str, payload: Mapping[str, Any], reason: str) -> int:
    """The estimate, with one WARNING per (server, reason)."""
    with _lock:
        first = (scope, reason) not in _warned
        _warned.add((scope, reason))
    if first:
        logger.warning(
            "get_num_tokens: %s; counting ~%d characters per token instead (an estimate, "
            "not the served model's tokenizer)",
            reason,
            CHARS_PER_TOKEN,
        )
    return estimate(payload)


async def acount(backend: Backend, scope: str, model: str, payload: Mapping[str, Any]) -> int:
    """The server's count for `payload`, cached; the estimate when it cannot count.

    Args:
        backend: the model's backend (its `count_tokens` asks `/tokenize`).
        scope: the model's scheduler key (server and a digest of its credentials).
        model: the served model's name.
        payload: `{"prompt": str}` or `{"messages": [...], "tools": [...] | None}`.
    """
    hit = cached(scope, model, payload)
    if hit is not None:
        return hit
    prompt = payload.get("prompt")
    messages: Sequence[Mapping[str, Any]] | None = payload.get("messages")
    try:
        count = await backend.count_tokens(
            model, prompt=prompt, messages=messages, tools=payload.get("tools")
        )
    except NotImplementedError:
        return fallback(scope, payload, f"{type(backend).__name__} cannot ask its server")
    except BackendError as exc:
        status = getattr(exc, "status_code", None)
        what = f"HTTP {status}" if status else type(exc).__name__
        # No URL in the message: one with user info would print a credential.
        reason = f"the server's /tokenize failed ({what}, {type(backend).__name__})"
        return fallback(scope, payload, reason)
    _store(scope, model, payload, count)
    return count


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenCounter:
    """What `BatchedChatModel.get_num_tokens*` hands its work to: one model's counts.

    Given what it needs and nothing else: the scope the counts are cached in
    (the model's scheduler key), the served model's name, and how to reach the
    backend (asked only on a cache miss, so a cached count starts no scheduler).
    """

    scope: str
    """The model's scheduler key: its server and a digest of its credentials."""
    model: str
    """The served model's name."""
    backend: Callable[[], Backend]
    """The backend whose `count_tokens` asks the server (`/tokenize`)."""

    @staticmethod
    def payload(messages: list[BaseMessage], tools: Sequence[Any] | None) -> dict[str, Any]:
        """What a call with `messages` (and `tools`) sends, as the server counts it."""
        return {
            "messages": messages_to_openai(messages),
            "tools": format_tools(tools) if tools else None,
        }

    def count(self, payload: dict[str, Any]) -> int:
        """The count, from a synchronous caller (one round trip on a cache miss)."""
        hit = cached(self.scope, self.model, payload)
        if hit is not None:
            return hit
        loop = background_loop()
        if loop.in_loop_thread():  # waiting here would deadlock the loop that answers
            reason = "called from langgraph-batch's own event loop thread (use aget_num_tokens)"
            return fallback(self.scope, payload, reason)
        return loop.run(self.acount(payload))

    async def acount(self, payload: dict[str, Any]) -> int:
        """The count, without blocking the event loop."""
        return await acount(self.backend(), self.scope, self.model, payload)
