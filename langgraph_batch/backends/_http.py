"""HTTP plumbing shared by the backends: client settings and HTTP status errors.

Client settings: `normalize_base_url` (validated), `make_timeout`,
`credentials_hash` (what decides which callers may share a client),
`env_proxy`.

Everything that turns an HTTP error status into the `langgraph_batch.errors`
tree lives here, so every backend reports the same failure the same way
(transport failures are mapped in `_transport.py`):

- `error_from_response()` turns an HTTP error status and its body into an
  exception; it parses `Retry-After` and the servers' context-length messages,
  and sums an HTML or plain-text body up in one line.
"""

from __future__ import annotations

import email.utils
import hashlib
import html
import json
import re
import secrets
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

import httpx

from langgraph_batch.errors import (
    BackendAuthenticationError,
    BackendBadRequestError,
    BackendError,
    BackendRateLimitError,
    BackendServerError,
    ContextLengthExceededError,
    ModelNotFoundError,
)

__all__ = (
    "DEFAULT_CONNECT_TIMEOUT",
    "check_str_map",
    "credentials_hash",
    "env_proxy",
    "error_from_response",
    "is_route_not_found",
    "make_request_id",
    "make_timeout",
    "normalize_base_url",
    "parse_context_length_message",
    "parse_retry_after",
    "summarize_body",
)

DEFAULT_CONNECT_TIMEOUT = 10.0

_BODY_LIMIT = 2000


def make_timeout(
    timeout: float | None,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    pool_timeout: float | None = None,
) -> httpx.Timeout:
    """Transport limits: `timeout` bounds each read (a generation may take long).

    `pool_timeout` bounds the wait for a free connection (beyond
    `max_connections`); the transport raises `PoolTimeoutError` when it expires.

    Raises:
        ValueError: when a timeout is not a positive number.
    """
    for name, value in (("timeout", timeout), ("pool_timeout", pool_timeout)):
        if value is not None and (isinstance(value, bool) or not value > 0):
            raise ValueError(f"{name} must be > 0 seconds or None, got {value!r}")
    if isinstance(connect_timeout, bool) or not connect_timeout > 0:
        raise ValueError(f"connect_timeout must be > 0 seconds, got {connect_timeout!r}")
    return httpx.Timeout(connect=connect_timeout, read=timeout, write=timeout, pool=pool_timeout)


def credentials_hash(
    api_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    query: Mapping[str, Any] | None = None,
) -> str | None:
    """A short, one-way digest of what authenticates and distinguishes a client.

    Schedulers and HTTP clients are shared only by callers whose endpoint and
    digest match; the digest (a sha256 prefix) is safe to log, the secrets are
    never kept in a key.

    Returns:
        16 hex characters, or None when there is no key, header or query.

    Example:
        ```python
        credentials_hash("sk-1") != credentials_hash("sk-2")  # True
        ```
    """
    if not api_key and not headers and not query:
        return None
    h = hashlib.sha256()
    h.update(b"key\x00" + (api_key or "").encode())
    for name, value in sorted((str(k).lower(), str(v)) for k, v in (headers or {}).items()):
        h.update(b"\x00h\x00" + name.encode() + b"\x00" + value.encode())
    for name, value in sorted((str(k), str(v)) for k, v in (query or {}).items()):
        h.update(b"\x00q\x00" + name.encode() + b"\x00" + value.encode())
    return h.hexdigest()[:16]


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (HTTP(S)_PROXY, ALL_PROXY, NO_PROXY)."""
    proxies = urllib.request.getproxies_environment()
    if not proxies:
        return None
    parsed = httpx.URL(url)
    if urllib.request.proxy_bypass_environment(parsed.host, proxies):  # type: ignore[attr-defined]
        return None
    return proxies.get(parsed.scheme) or proxies.get("all")


def normalize_base_url(url: str) -> str:
    """The server root without a trailing `/` or `/v1` (endpoints add `/v1/...`).

    Raises:
        ValueError: when `url` is not an http(s) URL with a host and a port in 1..65535.
    """
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(
            f"base_url must be an http(s) URL such as http://127.0.0.1:8000 or "
            f"http://127.0.0.1:8000/v1, got {url!r}"
        )
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"base_url {url!r} is not a valid URL: {exc}") from None
    if not parsed.host:
        raise ValueError(f"base_url {url!r} has no host; use http://host:port")
    port = parsed.port
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"base_url {url!r} has port {port}; a port must be in 1..65535")
    return url


def check_str_map(name: str, value: Mapping[str, str] | None) -> None:
    if value is None:
        return
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"{name} must map header names to string values")


def make_request_id(*, sibling_id: str | None = None, turn: int | None = None) -> str:
    """A request id that names the sibling and the turn, unique per call.

    Engines log it and vLLM names its response `chatcmpl-<request_id>`, which
    makes a sibling's requests easy to find in server logs.

    Example:
        ```python
        make_request_id(sibling_id="run7/3", turn=2)  # 'lgb-run7.3-t2-1f0c9a2e'
        ```
    """
    parts = ["lgb"]
    if sibling_id:
        parts.append(re.sub(r"[^A-Za-z0-9_.-]", ".", sibling_id))
    if turn is not None:
        parts.append(f"t{turn}")
    parts.append(secrets.token_hex(4))
    return "-".join(parts)


# ---------------------------------------------------------------------------- status -> error


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
_SPACE = re.compile(r"\s+")


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
    text = body[: _BODY_LIMIT * 8].decode("utf-8", "replace")
    stripped = text.lstrip()
    is_html = (content_type or "").lower().startswith("text/html") or stripped[:1] == "<"
    if is_html:
        m = _TITLE.search(text) or _HEADING.search(text)
        inner = m.group(1) if m else _TAG.sub(" ", text)
        line = _SPACE.sub(" ", html.unescape(_TAG.sub(" ", inner))).strip()
        line = line[:_SUMMARY_LIMIT] + ("..." if len(line) > _SUMMARY_LIMIT else "")
        return f"HTML page: {line}" if line else "an HTML page"
    line = _SPACE.sub(" ", stripped).strip()
    if not line:
        return "an empty body"
    return line[:_SUMMARY_LIMIT] + ("..." if len(line) > _SUMMARY_LIMIT else "")


def _error_message(body: bytes, content_type: str | None = None) -> tuple[str, Any]:
    """Extract the human message from an error body (OpenAI, FastAPI, HTML or plain text)."""
    try:
        data = json.loads(body)
    except ValueError:
        return summarize_body(body, content_type), None
    text = body[:_BODY_LIMIT].decode("utf-8", "replace").strip()
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


def is_route_not_found(status_code: int, body: bytes) -> bool:
    """True when a 404/405 means "no such endpoint" rather than "no such model".

    Servers answer an unknown model with an OpenAI error object; an unknown
    route gets the web framework's `{"detail": "Not Found"}` or plain text.
    """
    if status_code == 405:
        return True
    if status_code != 404:
        return False
    _, data = _error_message(body)
    return not (isinstance(data, dict) and isinstance(data.get("error"), dict | str))


def error_from_response(
    status_code: int,
    body: bytes,
    headers: Mapping[str, str],
    *,
    url: str,
    request_id: str | None = None,
    model: str | None = None,
    available_models: tuple[str, ...] = (),
) -> BackendError:
    """Build the exception for an HTTP error status.

    Args:
        status_code: the HTTP status (>= 400).
        body: the response body.
        headers: the response headers (for `Retry-After`).
        url: the URL called.
        request_id: the request id we sent.
        model: the model asked for (for 404 messages).
        available_models: the models the server lists, when already known.

    Returns:
        The mapped exception (not raised).
    """
    message, _ = _error_message(body, headers.get("content-type"))
    message = _SPACE.sub(" ", message).strip()
    short = message if len(message) <= 500 else message[:500] + "..."
    body_text = body[:_BODY_LIMIT].decode("utf-8", "replace")
    kw: dict[str, Any] = {
        "url": url,
        "status_code": status_code,
        "request_id": request_id,
        "body": body_text,
    }
    if status_code == 429:
        retry_after = parse_retry_after(headers)
        wait = f"retry after {retry_after:.3g} s" if retry_after is not None else "retry later"
        return BackendRateLimitError(
            f"{url} is rate limiting requests (HTTP 429: {short}); {wait} or lower max_inflight",
            retry_after_s=retry_after,
            **kw,
        )
    if status_code >= 500:
        return BackendServerError(
            f"{url} failed with HTTP {status_code} ({short}): the server is overloaded, "
            "restarting or crashed; check its logs",
            **kw,
        )
    if status_code in (401, 403):
        return BackendAuthenticationError(
            f"{url} refused the request with HTTP {status_code} ({short}): pass the right "
            "`api_key=` (sent as a Bearer token)",
            **kw,
        )
    if status_code in (404, 405):
        if is_route_not_found(status_code, body):
            return ModelNotFoundError(
                f"{url} does not exist on this server (HTTP {status_code}): check base_url "
                "(use http://host:port or http://host:port/v1) and the server type",
                model=model,
                **kw,
            )
        listed = f"; the server serves: {', '.join(available_models)}" if available_models else ""
        return ModelNotFoundError(
            f"the server at {url} does not serve model {model!r} ({short}){listed}; "
            "pass one of its model names as `model=`",
            model=model,
            available=available_models,
            **kw,
        )
    is_context, prompt_tokens, max_model_len = parse_context_length_message(message)
    if is_context:
        numbers = []
        if prompt_tokens is not None:
            numbers.append(f"prompt {prompt_tokens} tokens")
        if max_model_len is not None:
            numbers.append(f"max_model_len {max_model_len}")
        detail = f" ({', '.join(numbers)})" if numbers else ""
        return ContextLengthExceededError(
            f"the request does not fit the model's context window{detail}: shorten the "
            f"conversation or lower max_tokens. Server said: {short}",
            prompt_tokens=prompt_tokens,
            max_model_len=max_model_len,
            **kw,
        )
    return BackendBadRequestError(
        f"{url} rejected the request with HTTP {status_code}: {short}",
        **kw,
    )
