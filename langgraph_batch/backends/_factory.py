"""`backend_from_url`: one string picks the backend class and its endpoint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph_batch._redact import safe_url
from langgraph_batch.backends._session import SessionConfig, session_suffix
from langgraph_batch.backends.base import Backend
from langgraph_batch.backends.dynamo import DynamoBackend
from langgraph_batch.backends.openai_compat import (
    OpenAICompatibleBackend,
    credentials_hash,
    normalize_base_url,
)
from langgraph_batch.backends.pool import EndpointPool
from langgraph_batch.backends.sglang import SGLangBackend
from langgraph_batch.backends.vllm import VLLMBackend

__all__ = ("backend_from_url", "backend_key", "check_api_key")

_ACCEPTED = (
    "http://host:port[/v1] or https://host[/v1] (any OpenAI-compatible server), "
    "openai://host (OpenAI-compatible over https), vllm://host:port, sglang://host:port, "
    "dynamo://host:port; "
    "a comma-separated host list (vllm://h1:8000,h2:8000) builds an EndpointPool"
)

# Options that configure the pool, not its members.
_POOL_OPTIONS = frozenset(
    {"routing", "load_factor", "cooldown_s", "max_cooldown_s", "virtual_nodes", "max_affinity_keys"}
)

_SCHEMES: dict[str, tuple[type[OpenAICompatibleBackend], str]] = {
    "http": (OpenAICompatibleBackend, "http"),
    "https": (OpenAICompatibleBackend, "https"),
    "openai": (OpenAICompatibleBackend, "https"),
    "vllm": (VLLMBackend, "http"),
    "vllm+http": (VLLMBackend, "http"),
    "vllm+https": (VLLMBackend, "https"),
    "sglang": (SGLangBackend, "http"),
    "sglang+http": (SGLangBackend, "http"),
    "sglang+https": (SGLangBackend, "https"),
    "dynamo": (DynamoBackend, "http"),
    "dynamo+http": (DynamoBackend, "http"),
    "dynamo+https": (DynamoBackend, "https"),
}


def backend_from_url(
    url: str, *, api_key: str | None = None, timeout: float | None = 60.0, **options: Any
) -> Backend:
    """Build the backend a URL names.

    Example:
        ```python
        backend_from_url("vllm://127.0.0.1:8000")        # VLLMBackend(http://127.0.0.1:8000)
        backend_from_url("http://127.0.0.1:8000/v1")     # OpenAICompatibleBackend
        backend_from_url("sglang://gpu1:30000", priority_scheduling=True)
        backend_from_url("dynamo://127.0.0.1:8000")      # DynamoBackend (NVIDIA Dynamo)
        backend_from_url("openai://api.openai.com", api_key="sk-...")
        backend_from_url("vllm://gpu1:8000,gpu2:8000", routing="affinity")  # EndpointPool
        ```

    Args:
        url: `http(s)://host:port[/v1]`, `openai://host`, `vllm://host:port`,
            `sglang://host:port` or `dynamo://host:port` (`vllm+https://`,
            `sglang+https://` and `dynamo+https://` for TLS).
            Several comma-separated hosts after one scheme
            (`vllm://h1:8000,h2:8000`) build an `EndpointPool` of that class.
        api_key: sent as a Bearer token (required for `openai://`).
        timeout: read timeout per call, seconds.
        **options: passed to the backend class (e.g. `priority_scheduling=True`,
            `headers=`, `query=`, `limits=`, `pool_timeout=`, `session_affinity=`);
            `routing`, `load_factor`, `cooldown_s`, `max_cooldown_s`,
            `virtual_nodes` and `max_affinity_keys` go to the `EndpointPool`
            of a host list (and are ignored for a single host).

    Returns:
        An `OpenAICompatibleBackend`, `VLLMBackend`, `SGLangBackend` or
            `DynamoBackend`; an
        `EndpointPool` of them for a host list.

    Raises:
        ValueError: the URL has no host (or an empty entry in a host list), an
            unknown scheme, or is `openai://` without an `api_key`.
    """
    cls, http_scheme, hosts = _parse(url)
    check_api_key(url, api_key)
    pool_options = {k: options.pop(k) for k in _POOL_OPTIONS & options.keys()}
    if len(hosts) == 1:
        return cls(f"{http_scheme}://{hosts[0]}", api_key=api_key, timeout=timeout, **options)
    members = [
        cls(f"{http_scheme}://{h}", api_key=api_key, timeout=timeout, **options) for h in hosts
    ]
    return EndpointPool(members, **pool_options)


def check_api_key(url: str, api_key: str | None) -> None:
    """Refuse `openai://` without a key: that server always needs one.

    Raises:
        ValueError: the URL is `openai://...` and `api_key` is empty.
    """
    if not api_key and isinstance(url, str) and url.lower().startswith("openai://"):
        raise ValueError(
            f"{safe_url(url)!r} needs an API key: pass api_key=... or set OPENAI_API_KEY (or "
            "LGB_API_KEY); for a local server without keys use http:// or vllm://"
        )


def backend_key(
    url: str,
    *,
    routing: str = "affinity",
    api_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    query: Mapping[str, Any] | None = None,
    session_affinity: SessionConfig | None = SessionConfig(),  # noqa: B008 - frozen
) -> str:
    """The `Backend.key` that `backend_from_url(url, ...)` would have, without building it.

    Schedulers (and their HTTP clients) are shared by backend key: the key
    names the endpoint and holds a digest of the credentials, headers and query
    (`credentials_hash`), never the secrets, so callers with different keys
    never share a client. This lets a chat model find its scheduler without
    opening an HTTP client.

    Example:
        ```python
        backend_key("vllm://127.0.0.1:8000/v1")  # "VLLMBackend:http://127.0.0.1:8000"
        backend_key("vllm://127.0.0.1:8000", api_key="sk-1")  # "...:8000#<16 hex digits>"
        ```

    Raises:
        ValueError: the URL is not one `backend_from_url` accepts (names it).
    """
    cls, http_scheme, hosts = _parse(url)
    keys = []
    for host in hosts:
        base = normalize_base_url(f"{http_scheme}://{host}")
        digest = credentials_hash(api_key, headers, query, url=base)  # a URL's password too
        suffix = ("" if digest is None else f"#{digest}") + session_suffix(session_affinity)
        keys.append(f"{cls.__name__}:{safe_url(base)}{suffix}")
    if len(keys) == 1:
        return keys[0]
    return f"EndpointPool({routing}):{','.join(sorted(keys))}"


def _parse(url: str) -> tuple[type[OpenAICompatibleBackend], str, list[str]]:
    """Split a backend URL into (backend class, http scheme, hosts)."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"backend URL {safe_url(url)!r} has no scheme; use one of: {_ACCEPTED}")
    scheme, _, rest = url.partition("://")
    entry = _SCHEMES.get(scheme.lower())
    if entry is None:
        raise ValueError(f"unsupported backend URL {url!r}; use one of: {_ACCEPTED}")
    rest = rest.strip().rstrip("/")
    if not rest or rest.startswith("/"):
        raise ValueError(f"backend URL {url!r} has no host; use one of: {_ACCEPTED}")
    cls, http_scheme = entry
    hosts = [h.strip().rstrip("/") for h in rest.split(",")]
    if len(hosts) > 1 and any(not h or h.startswith("/") for h in hosts):
        raise ValueError(
            f"backend URL {url!r} has an empty host in its list; use one of: {_ACCEPTED}"
        )
    return cls, http_scheme, hosts
