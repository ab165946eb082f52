"""A deterministic tokenizer and a ChatML-like chat template, with no downloads.

Text splits into pieces of at most four word characters (with their leading
whitespace) or single punctuation marks; each piece maps to a stable id
through CRC-32. English text comes out at roughly one token per four
characters, close to a real BPE vocabulary, and the same text always gives
the same ids, which is what prefix caching needs.

The chat template follows Qwen2.5 / Hermes: tools are rendered inside the
system turn, so a shared system prompt plus shared tools form a shared token
prefix across sibling requests.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = (
    "IM_END",
    "IM_START",
    "VOCAB_SIZE",
    "count_tokens",
    "detokenize",
    "piece_ids",
    "render_chat",
    "split_pieces",
    "tokenize",
    "tokenize_chat",
)

VOCAB_SIZE = 128_256
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
_SPECIAL: dict[str, int] = {IM_START: 1, IM_END: 2, "<|endoftext|>": 3}
_FIRST_ORDINARY = 256

_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in _SPECIAL) + ")")
# Newlines are always their own token, so a turn header ends on the same
# token whatever follows it (prefix reuse across turns depends on it).
_PIECE_RE = re.compile(r"[ \t]*\w{1,4}|[ \t]*[^\w\s]|\n|[ \t]+|\s")

# Piece -> id, and id -> piece for detokenize. Bounded so that a long-running
# server with endless unique text does not grow without limit.
_ID_CACHE: dict[str, int] = {}
_PIECES: dict[int, str] = {v: k for k, v in _SPECIAL.items()}
_CACHE_LIMIT = 500_000

# Rendered turn -> its ids. Sibling agents send the same system prompt and
# tool schemas in every request: tokenizing each distinct turn once takes
# the bulk of the per-request tokenizer work off the server. Bounded LRU.
_SEGMENT_IDS: dict[str, tuple[int, ...]] = {}
_SEGMENT_LIMIT = 4096
_SEGMENT_MIN_CHARS = 64


def _piece_id(piece: str) -> int:
    tid = _ID_CACHE.get(piece)
    if tid is None:
        tid = _FIRST_ORDINARY + zlib.crc32(piece.encode()) % (VOCAB_SIZE - _FIRST_ORDINARY)
        if len(_ID_CACHE) < _CACHE_LIMIT:
            _ID_CACHE[piece] = tid
            _PIECES.setdefault(tid, piece)
    return tid


def split_pieces(text: str) -> list[str]:
    """The token strings of `text`, in order (special tokens are single pieces)."""
    if "<|" not in text:
        return _PIECE_RE.findall(text)
    out: list[str] = []
    for part in _SPECIAL_RE.split(text):
        if not part:
            continue
        if part in _SPECIAL:
            out.append(part)
        else:
            out.extend(_PIECE_RE.findall(part))
    return out


def tokenize(text: str) -> list[int]:
    """Token ids of `text`.

    Example:
        ```python
        tokenize("hello world") == tokenize("hello world")  # always
        ```
    """
    special = _SPECIAL
    return [special.get(p) or _piece_id(p) for p in split_pieces(text)]


def piece_ids(pieces: Iterable[str]) -> list[int]:
    """Token ids of pieces from `split_pieces` (`tokenize` without splitting again)."""
    special = _SPECIAL
    return [special.get(p) or _piece_id(p) for p in pieces]


def count_tokens(text: str) -> int:
    """Number of tokens in `text` (same as `len(tokenize(text))`)."""
    return len(split_pieces(text))


def detokenize(ids: Iterable[int]) -> str:
    """Text of ids seen before by `tokenize`; unknown ids render as `<unk>`."""
    return "".join(_PIECES.get(i, "<unk>") for i in ids)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                if part.get("type") == "text":
                    parts.append(str(part.get("text", "")))
            else:
                parts.append(str(part))
        return "".join(parts)
    return str(content)


def _tools_block(tools: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    ]
    lines.extend(json.dumps(t, sort_keys=True, separators=(", ", ": ")) for t in tools)
    lines.append(
        "</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
    return "\n".join(lines)


def render_tool_call(name: str, arguments: str) -> str:
    """The text a Hermes-style model emits for one tool call."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def _render_segments(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None,
    add_generation_prompt: bool,
) -> list[str]:
    """The prompt as one string per turn (each ends after `<|im_end|>` and a newline)."""
    out: list[str] = []
    msgs = list(messages)
    system = ""
    if msgs and msgs[0].get("role") in {"system", "developer"}:
        system = _content_text(msgs[0].get("content"))
        msgs = msgs[1:]
    elif tools:
        system = "You are a helpful assistant."
    if tools:
        system += _tools_block(tools)
    if system:
        out.append(f"{IM_START}system\n{system}{IM_END}\n")
    for m in msgs:
        role = str(m.get("role", "user"))
        text = _content_text(m.get("content"))
        if role == "assistant":
            calls = m.get("tool_calls") or []
            parts = [text] if text else []
            for call in calls:
                fn = call.get("function", {}) if isinstance(call, Mapping) else {}
                parts.append(
                    render_tool_call(str(fn.get("name", "")), str(fn.get("arguments", "{}")))
                )
            out.append(f"{IM_START}assistant\n" + "\n".join(parts) + f"{IM_END}\n")
        elif role == "tool":
            out.append(f"{IM_START}user\n<tool_response>\n{text}\n</tool_response>{IM_END}\n")
        else:
            out.append(f"{IM_START}{role}\n{text}{IM_END}\n")
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
    return out


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """Render a conversation to the prompt text the engine tokenizes.

    Args:
        messages: OpenAI-format messages.
        tools: OpenAI tool dicts; rendered inside the system turn.
        add_generation_prompt: End with the assistant header.

    Returns:
        The prompt text, with `<|im_start|>`/`<|im_end|>` markers.
    """
    return "".join(
        _render_segments(messages, tools=tools, add_generation_prompt=add_generation_prompt)
    )


def _segment_ids(segment: str) -> tuple[int, ...]:
    if len(segment) < _SEGMENT_MIN_CHARS:
        return tuple(tokenize(segment))
    cache = _SEGMENT_IDS
    ids = cache.pop(segment, None)
    if ids is None:
        ids = tuple(tokenize(segment))
        if len(cache) >= _SEGMENT_LIMIT:
            del cache[next(iter(cache))]
    cache[segment] = ids  # most recently used last
    return ids


def tokenize_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """`tokenize(render_chat(...))`, tokenizing each distinct turn only once.

    Every turn starts with a special token and ends with a newline (always a
    token of its own), so turn-by-turn tokenization equals whole-prompt
    tokenization; repeated turns (a shared system prompt with tool schemas)
    come from a bounded cache keyed by their text.
    """
    ids: list[int] = []
    for segment in _render_segments(
        messages, tools=tools, add_generation_prompt=add_generation_prompt
    ):
        ids.extend(_segment_ids(segment))
    return ids
