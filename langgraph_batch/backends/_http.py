"""HTTP client settings shared by the backends.

`normalize_base_url` (validated), `make_timeout`, `credentials_hash` (what
decides which callers may share a client), `env_proxy`, `make_request_id`.
What an HTTP error status becomes is decided in `_errormap.py`, with the
transport errors: one table for every backend path.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import urllib.request
from collections.abc import Mapping
from typing import Any

import httpx

__all__ = (
    "DEFAULT_CONNECT_TIMEOUT",
    "check_str_map",
    "credentials_hash",
    "env_proxy",
    "make_request_id",
    "make_timeout",
    "normalize_base_url",
)

DEFAULT_CONNECT_TIMEOUT = 10.0


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
    url: str | None = None,
) -> str | None:
    """A short, one-way digest of what authenticates and distinguishes a client.

    Schedulers and HTTP clients are shared only by callers whose endpoint and
    digest match; the digest (a sha256 prefix) is safe to log, the secrets are
    never kept in a key.

    Args:
        api_key: the bearer token.
        headers: the client's own headers.
        query: the client's own query parameters.
        url: the server URL: its user info (`user:password@`) counts too.

    Returns:
        16 hex characters, or None when there is no key, header, query or user info.

    Example:
        ```python
        credentials_hash("sk-1") != credentials_hash("sk-2")  # True
        ```
    """
    userinfo = _userinfo(url)
    if not api_key and not headers and not query and not userinfo:
        return None
    h = hashlib.sha256()
    h.update(b"key\x00" + (api_key or "").encode())
    if userinfo:
        h.update(b"\x00u\x00" + userinfo)
    for name, value in sorted((str(k).lower(), str(v)) for k, v in (headers or {}).items()):
        h.update(b"\x00h\x00" + name.encode() + b"\x00" + value.encode())
    for name, value in sorted((str(k), str(v)) for k, v in (query or {}).items()):
        h.update(b"\x00q\x00" + name.encode() + b"\x00" + value.encode())
    return h.hexdigest()[:16]


def _userinfo(url: str | None) -> bytes:
    """The `user:password` of `url` (empty: none, or not a URL)."""
    if not url:
        return b""
    try:
        return httpx.URL(url).userinfo
    except (httpx.InvalidURL, TypeError):
        return b""


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
