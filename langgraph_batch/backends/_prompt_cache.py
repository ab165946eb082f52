"""Prompt-cache hints `LangChainBackend` adds for hosted APIs (Anthropic, Bedrock, OpenAI).

Hosted APIs cache prompt prefixes by their own rules, and the client decides
part of it:

- **Anthropic** caches only up to the blocks marked with `cache_control`
  (at most 4 breakpoints; https://platform.claude.com/docs/en/build-with-claude/prompt-caching).
  Two are placed: one at the end of the shared prefix (the last system block,
  or the last tool when there is no system message), which every sibling
  reads, and one on the last message, which moves forward with the
  conversation so that each turn reads the previous turn's prefix (within
  the API's 20-block lookback) and writes its own.
- **Bedrock Converse** (`ChatBedrockConverse`) takes the same intent as a
  `cache_control` call kwarg and places its `cachePoint` blocks itself.
- **OpenAI** caches automatically; `prompt_cache_key` steers routing
  (https://platform.openai.com/docs/guides/prompt-caching): requests with
  one shared prefix get one key per group of siblings, so that each group
  lands on one machine, keeps its histories there and stays below the ~15
  requests a minute per key beyond which requests overflow to cold machines.

The TTL of Anthropic breakpoints follows the predicted reuse: the sibling's
next call comes after its tool returns, so a predicted tool wait
(`ChatRequest.retention_s`, learned per tool by fan_out) longer than the 5
minute TTL takes the 1-hour one, whose write costs 2x instead of 1.25x but
survives the wait.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage

__all__ = (
    "FIVE_MINUTES_S",
    "LOOKBACK_BLOCKS",
    "OPENAI_KEY_GROUPS",
    "CacheStyle",
    "anthropic_breakpoints",
    "anthropic_tools",
    "cache_style",
    "has_cache_control",
    "openai_cache_key",
    "ttl_for",
)

CacheStyle = Literal["anthropic", "bedrock", "openai"]

FIVE_MINUTES_S = 300.0
"""The default TTL of an Anthropic cache entry."""
_TTL_MARGIN_S = 30.0
"""A wait predicted within this much of 5 minutes already takes the 1-hour TTL:
the call itself and the time in the queue come on top of the tool's wait."""
LOOKBACK_BLOCKS = 20
"""Anthropic looks for an earlier entry up to about 20 blocks before a breakpoint."""
OPENAI_KEY_GROUPS = 8
"""Siblings sharing a prefix spread over this many `prompt_cache_key`s."""

_OPENAI_HOSTS = ("api.openai.com", ".openai.azure.com")


def _class_names(model: BaseChatModel) -> set[str]:
    return {cls.__name__ for cls in type(model).__mro__}


def cache_style(
    model: BaseChatModel, *, mode: bool | Literal["auto"] = "auto"
) -> CacheStyle | None:
    """Which prompt-cache hints suit a wrapped model (None: add none).

    Args:
        model: The wrapped chat model.
        mode: `"auto"`: Anthropic and Bedrock Claude/Nova models always (their
            caching is explicit: without hints nothing is cached), OpenAI models
            only against OpenAI's or Azure's API (another OpenAI-compatible server
            may refuse the unknown `prompt_cache_key`); True: every model of a
            known style; False: none.
    """
    if mode is False:
        return None
    names = _class_names(model)
    if "ChatAnthropic" in names:
        return "anthropic"
    if "ChatBedrockConverse" in names:
        model_id = str(getattr(model, "model_id", "") or "").lower()
        return "bedrock" if any(k in model_id for k in ("claude", "anthropic", "nova")) else None
    if "BaseChatOpenAI" in names:
        if mode is True:
            return "openai"
        base = getattr(model, "openai_api_base", None)
        if base is None or any(h in str(base) for h in _OPENAI_HOSTS):
            return "openai"
    return None


def ttl_for(retention_s: float | None) -> Literal["5m", "1h"]:
    """The breakpoint TTL for a predicted wait until the next call (None: unknown, 5m)."""
    if retention_s is not None and retention_s > FIVE_MINUTES_S - _TTL_MARGIN_S:
        return "1h"
    return "5m"


def has_cache_control(messages: Sequence[BaseMessage], tools: Sequence[Any] | None) -> bool:
    """True when the caller placed breakpoints itself (then none are added)."""
    for tool in tools or ():
        if isinstance(tool, Mapping) and "cache_control" in tool:
            return True
    for message in messages:
        content = message.content
        if isinstance(content, list) and any(
            isinstance(b, Mapping) and ("cache_control" in b or "cachePoint" in b) for b in content
        ):
            return True
    return False


def _marked(content: Any, cache_control: Mapping[str, str]) -> list[Any] | None:
    """`content` with a breakpoint on its last block (None: nothing to mark)."""
    if isinstance(content, str):
        if not content:
            return None
        return [{"type": "text", "text": content, "cache_control": dict(cache_control)}]
    if isinstance(content, list) and content and isinstance(content[-1], Mapping):
        last = dict(content[-1])
        if last.get("type") in (None, "thinking", "redacted_thinking"):
            return None
        last["cache_control"] = dict(cache_control)
        return [*content[:-1], last]
    return None


def _blocks_of(message: BaseMessage) -> int:
    """Roughly how many Anthropic content blocks a message becomes."""
    content = message.content
    n = len(content) if isinstance(content, list) else int(bool(content))
    if isinstance(message, AIMessage):
        n += len(message.tool_calls)
    return max(1, n)


def anthropic_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI tool dicts in Anthropic's format (`bind_tools` passes those through)."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        fn = tool.get("function", tool)
        spec: dict[str, Any] = {
            "name": fn["name"],
            "input_schema": fn.get("parameters") or {"type": "object", "properties": {}},
        }
        if fn.get("description"):
            spec["description"] = fn["description"]
        out.append(spec)
    return out


def anthropic_breakpoints(
    messages: Sequence[BaseMessage],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    ttl: Literal["5m", "1h"],
) -> tuple[list[BaseMessage], list[dict[str, Any]] | None]:
    """Messages and tools with breakpoints on the shared prefix and the last message.

    The shared-prefix breakpoint goes on the last leading system message, or
    on the last tool when there is none; the history breakpoint on the last
    message unless it is the system message itself or an assistant turn
    (whose tool-use blocks take no text breakpoint). When the history before
    the last message holds more blocks than Anthropic's lookback (a turn with
    many parallel tool calls), a third breakpoint goes about
    `LOOKBACK_BLOCKS` - 2 blocks back, so that the previous turn's entry is
    still found; it splits a write, it adds none. All use `ttl` (a 1h
    breakpoint may not follow a 5m one, so they share the longer one).

    Returns:
        New message and tool lists (the inputs are not changed); tools in
        Anthropic's format, or None when there were none.

    Example:
        ```python
        from langchain_core.messages import HumanMessage, SystemMessage

        msgs, _ = anthropic_breakpoints(
            [SystemMessage("rules " * 600), HumanMessage("task 1")], None, ttl="5m"
        )
        assert msgs[0].content[-1]["cache_control"] == {"type": "ephemeral", "ttl": "5m"}
        assert msgs[1].content[-1]["cache_control"]["ttl"] == "5m"
        ```
    """
    cc = {"type": "ephemeral", "ttl": ttl}
    out = list(messages)
    anth_tools = anthropic_tools(tools) if tools else None
    lead = 0
    while lead < len(out) and isinstance(out[lead], SystemMessage):
        lead += 1
    if lead:
        marked = _marked(out[lead - 1].content, cc)
        if marked is not None:
            out[lead - 1] = out[lead - 1].model_copy(update={"content": marked})
    elif anth_tools:
        anth_tools[-1]["cache_control"] = dict(cc)
    last = len(out) - 1
    if last >= lead and not isinstance(out[last], AIMessage):
        marked = _marked(out[last].content, cc)
        if marked is not None:
            out[last] = out[last].model_copy(update={"content": marked})
    seen = 0
    for i in range(last - 1, lead - 1, -1):
        seen += _blocks_of(out[i + 1])
        if seen < LOOKBACK_BLOCKS - 2:
            continue
        if isinstance(out[i], AIMessage):
            continue
        marked = _marked(out[i].content, cc)
        if marked is not None:
            out[i] = out[i].model_copy(update={"content": marked})
        break
    return out, anth_tools


def _prefix_digest(messages: Sequence[Mapping[str, Any]], tools: Any) -> str:
    system = [m.get("content") for m in messages if m.get("role") in ("system", "developer")]
    payload = json.dumps([system, tools], sort_keys=True, default=str)
    return hashlib.blake2b(payload.encode(), digest_size=6).hexdigest()


def openai_cache_key(
    messages: Sequence[Mapping[str, Any]], tools: Any, route_key: str | None
) -> str:
    """`prompt_cache_key`: the shared prefix's digest and the sibling's group.

    Example:
        ```python
        sys = {"role": "system", "content": "rules"}
        a = openai_cache_key([sys], None, "sibling:run/1")
        assert a == openai_cache_key([sys], None, "sibling:run/1")
        assert a.startswith("lgb-")
        ```
    """
    group = zlib.crc32(route_key.encode()) % OPENAI_KEY_GROUPS if route_key else 0
    return f"lgb-{_prefix_digest(messages, tools)}-{group}"
