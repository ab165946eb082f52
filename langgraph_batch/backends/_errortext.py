"""What a server said, read: `Retry-After`, context-window messages, error bodies.

The parsers behind the error map (`_errormap.py`) and the `LangChainBackend`
error mapping (`_langchain_errors.py`): they read text, and decide nothing.
"""

from __future__ import annotations

import email.utils
import html
import json
import re
import time
from collections.abc import Mapping
from typing import Any

__all__ = (
    "BODY_LIMIT",
    "SPACE",
    "error_message",
    "parse_context_length_message",
    "parse_retry_after",
    "summarize_body",
)

BODY_LIMIT = 2000
"""Characters of an error body kept on the error (`BackendError.body`)."""


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait from `Retry-After` (seconds or HTTP-date) or `retry-after-ms`.

    Returns:
        The delay in seconds (never negative), or None when absent or unparsable.
    """
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


# Each pattern captures what it can: (max_model_len, prompt_tokens) by name.
_CONTEXT_PATTERNS = tuple(
    re.compile(p, re.IGNORECASE | re.DOTALL)
    for p in (
        # vLLM 0.6: "... maximum context length is 4096 tokens. However, you requested 5000
        # tokens in the messages, Please reduce the length of the messages."
        r"maximum context length is (?P<max>\d+) tokens.*?requested (?P<prompt>\d+) tokens in the"
        r" messages",
        # vLLM <= 0.10 / OpenAI: "... maximum context length is 32768 tokens. However, you
        # requested 40000 tokens (39000 in the messages, 1000 in the completion)."
        r"maximum context length is (?P<max>\d+) tokens.*?requested (?P<total>\d+) tokens"
        r"(?: \((?P<prompt>\d+) in the messages)?",
        # vLLM 0.33: "... maximum context length is 32768 tokens. However, your prompt
        # contains [at least ]40000 input tokens, ..."
        r"maximum context length is (?P<max>\d+) tokens.*?prompt contains (?:at least )?"
        r"(?P<prompt>\d+) input tokens",
        # vLLM 0.33 (characters, not tokens): "... However, your prompt contains 200000
        # characters (more than ...)"
        r"maximum context length is (?P<max>\d+) tokens.*?prompt contains \d+ characters",
        # vLLM 0.8-0.10: "'max_tokens' ... is too large: 1000. This model's maximum context
        # length is 32768 tokens and your request has 32000 input tokens"
        r"maximum context length is (?P<max>\d+) tokens.*?your request has (?P<prompt>\d+)"
        r" input tokens",
        # OpenAI: "... However, your messages resulted in 130000 tokens"
        r"maximum context length is (?P<max>\d+) tokens.*?resulted in (?P<prompt>\d+) tokens",
        # vLLM 0.33 engine check: "The decoder prompt (length 40000) is longer than the
        # maximum model length of 32768." (also "... plus the number of requested output
        # tokens (at least 1) is longer than ...")
        r"prompt \(length (?P<prompt>\d+)\).*?maximum model length of (?P<max>\d+)",
        # vLLM 0.33 get_max_tokens: "Input length (40000) exceeds model's maximum context
        # length (32768)."
        r"input length \((?P<prompt>\d+)\) exceeds model's maximum context length \((?P<max>\d+)\)",
        # vLLM responses API: "The engine prompt length 40000 exceeds the max_model_len 32768"
        r"prompt length (?P<prompt>\d+) exceeds the max_model_len (?P<max>\d+)",
        # SGLang: "The input (40000 tokens) is longer than the model's context length
        # (32768 tokens)."
        r"input \((?P<prompt>\d+) tokens\) is longer than the model's context length"
        r" \((?P<max>\d+) tokens\)",
        # SGLang: "Requested token count exceeds the model's maximum context length of
        # 32768 tokens. You requested a total of 41000 tokens: 40000 tokens from the input
        # messages and 1000 tokens for the completion."
        r"maximum context length of (?P<max>\d+) tokens.*?total of \d+ tokens: (?P<prompt>\d+)"
        r" tokens from the input",
        # vLLM 0.33 renderer: "max_tokens=40000 cannot be greater than max_total_tokens=32768"
        r"cannot be greater than max_total_tokens\s*=\s*(?P<max>\d+)",
        # Generic fallbacks.
        r"maximum context length (?:is|of) (?P<max>\d+)",
        r"context length \((?P<max>\d+)(?: tokens)?\)",
    )
)
_CONTEXT_HINT = re.compile(
    r"context length|context_length|maximum model length|max_model_len|max_total_tokens",
    re.IGNORECASE,
)


def parse_context_length_message(message: str) -> tuple[bool, int | None, int | None]:
    """Recognise a context-window overflow in a server's error message.

    Returns:
        `(is_context_error, prompt_tokens, max_model_len)`; the numbers are None
        when the message does not name them.
    """
    if not _CONTEXT_HINT.search(message):
        return False, None, None
    for pattern in _CONTEXT_PATTERNS:
        m = pattern.search(message)
        if m is None:
            continue
        groups = m.groupdict()
        max_len = int(groups["max"]) if groups.get("max") else None
        prompt = groups.get("prompt")
        return True, int(prompt) if prompt else None, max_len
    return True, None, None


_SUMMARY_LIMIT = 200
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_HEADING = re.compile(r"<h1[^>]*>(.*?)</h1>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]+>")
SPACE = re.compile(r"\s+")


def summarize_body(body: bytes, content_type: str | None = None) -> str:
    """One line that says what a non-JSON body is (an HTML error page, plain text).

    An HTML page becomes `HTML page: <title or first heading>`; other text its
    first 200 characters with whitespace collapsed.

    Example:
        ```python
        summarize_body(b"<html><title>502 Bad Gateway</title>...</html>")
        # 'HTML page: 502 Bad Gateway'
        ```
    """
    text = body[: BODY_LIMIT * 8].decode("utf-8", "replace")
    stripped = text.lstrip()
    is_html = (content_type or "").lower().startswith("text/html") or stripped[:1] == "<"
    if is_html:
        m = _TITLE.search(text) or _HEADING.search(text)
        inner = m.group(1) if m else _TAG.sub(" ", text)
        line = SPACE.sub(" ", html.unescape(_TAG.sub(" ", inner))).strip()
        line = line[:_SUMMARY_LIMIT] + ("..." if len(line) > _SUMMARY_LIMIT else "")
        return f"HTML page: {line}" if line else "an HTML page"
    line = SPACE.sub(" ", stripped).strip()
    if not line:
        return "an empty body"
    return line[:_SUMMARY_LIMIT] + ("..." if len(line) > _SUMMARY_LIMIT else "")


def error_message(body: bytes, content_type: str | None = None) -> tuple[str, Any]:
    """Extract the human message from an error body (OpenAI, FastAPI, HTML or plain text)."""
    try:
        data = json.loads(body)
    except ValueError:
        return summarize_body(body, content_type), None
    text = body[:BODY_LIMIT].decode("utf-8", "replace").strip()
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"], data
        if isinstance(err, str):
            return err, data
        for key in ("message", "detail"):
            if isinstance(data.get(key), str):
                return data[key], data
    return text, data
