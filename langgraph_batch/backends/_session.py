"""Session keys for routers in front of replicas: the key, its headers, and which batches.

A router (`vllm-router`, `sglang-router`) in front of several engine replicas
sees one URL's traffic and picks a replica per HTTP request. A sibling's turn
2 repeats turn 1's whole conversation; it is a prefix-cache hit only on the
replica that served turn 1. The routers keep a session on one replica when
each request names it in a header:

- `vllm-router --policy consistent_hash` hashes `X-Session-ID` (then
  `X-User-ID`, `X-Tenant-ID`, `X-Correlation-ID`, `X-Request-ID`, `X-Trace-ID`,
  the body's `session_params.session_id`, `user`, ..., and last a hash of the
  whole body): without a session header it hashes our per-call request id, so
  each turn lands on a random replica. `sticky_least_loaded` and program
  scheduling (`program_scheduling_enable_key: "auto"`) read `X-Session-ID` too.
- `sglang-router --policy manual` pins each `X-SMG-Routing-Key` to a replica
  (re-assigned only when that replica turns unhealthy); without the header it
  picks at random.

So every request carries a **session key** in both headers (`SessionConfig`):
one key per fan_out sibling (all its turns), outside a fan_out one per agent
task (the LangGraph task running the agent's subgraph, from its
`execution_info`), else one per conversation (its model, first system and
first user message, the same on every turn). The key is opaque: an
HMAC-SHA256 under a random secret made once per process, truncated to 128
bits, of that identity and of the backend's credentials digest (callers with
other API keys or headers never share a key, so a router never takes two
tenants' requests for one session or program). It
holds no user data (no content, thread id or credential), cannot be guessed or
linked across runs, and is never logged.

**Batches.** One HTTP call reaches one replica, so a batched call may carry
only one key. `SessionConfig.batching` says which requests may share a call:
`"per_session"` (only requests with the same key), `"mixed"` (any: one server,
or a pool's replica), or `"auto"` (the default): `"per_session"` when a router
answers at the backend's URL (`GET /workers` lists workers, as vllm-router and
sglang-router do; asked once, before the first batch), `"mixed"` otherwise. A
batched call carries its first member's key.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import httpx

from langgraph_batch._redact import safe_url
from langgraph_batch.backends.base import ChatRequest, conversation_key
from langgraph_batch.errors import BackendError

__all__ = (
    "DEFAULT_SESSION_HEADERS",
    "EngineHints",
    "SessionBatching",
    "SessionConfig",
    "SessionRouting",
    "affinity_key",
    "agentic_context",
    "conversation_key",
    "session_key",
)

logger = logging.getLogger(__name__)

DEFAULT_SESSION_HEADERS: tuple[str, ...] = ("X-Session-ID", "X-SMG-Routing-Key")
"""The headers vllm-router (`consistent_hash`) and sglang-router (`manual`) route on."""

SessionBatching = Literal["auto", "per_session", "mixed"]
EngineHints = Literal["agentic_context"]

_BATCHINGS: tuple[str, ...] = get_args(SessionBatching)
_HINTS: tuple[str, ...] = get_args(EngineHints)
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)
_DETECT_RETRY_S = 60.0
_DETECT_TIMEOUT_S = 5.0

_SECRET = secrets.token_bytes(32)
"""Keys the session HMAC: random per process, so keys differ between runs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionConfig:
    """How requests tell a router which session (sibling, conversation) they belong to.

    `BatchedChatModel(session_affinity=None)` (or `backend_from_url(...,
    session_affinity=None)`) sends no key and lets batches mix sessions.

    Example:
        ```python
        from langgraph_batch.backends import SessionConfig

        llm = BatchedChatModel(model="m", base_url="vllm://router:8000")  # the defaults
        custom = SessionConfig(headers=("X-User-ID",), batching="per_session")
        llm = BatchedChatModel(model="m", base_url="vllm://lb:8000", session_affinity=custom)
        ```

    Raises:
        ValueError: a header name that is not an HTTP token, or an unknown mode.

    !!! version-added "Added in 0.2.0"
    """

    headers: tuple[str, ...] = DEFAULT_SESSION_HEADERS
    """Request headers that carry the key (empty: none; batching is then `"mixed"`)."""
    batching: SessionBatching = "auto"
    """Which requests may share one HTTP call: `"per_session"`, `"mixed"`, or `"auto"`
    (`"per_session"` when a router answers `GET /workers` at the URL, or when
    `engine_hints` are sent: one call carries one program's hints)."""
    engine_hints: EngineHints | None = None
    """`"agentic_context"`: also send vLLM-router's program metadata in the body
    (`vllm_xargs.agentic_context`: program and session id = the key, `step_id` = the
    turn, `priority`, `expected_output_length` = `max_tokens`). Only for engines that
    accept it (AgentInfer's); stock vLLM answers HTTP 400. vLLM backends only."""

    def __post_init__(self) -> None:
        headers = self.headers
        if isinstance(headers, str) or not isinstance(headers, tuple):
            raise ValueError(f"headers must be a tuple of header names, got {headers!r}")
        for name in headers:
            if not isinstance(name, str) or not _TOKEN.match(name):
                raise ValueError(f"session header {name!r} is not a valid HTTP header name")
        if self.batching not in _BATCHINGS:
            raise ValueError(f"batching must be one of {_BATCHINGS}, got {self.batching!r}")
        if self.engine_hints is not None and self.engine_hints not in _HINTS:
            hints = self.engine_hints
            raise ValueError(f"engine_hints must be None or one of {_HINTS}, got {hints!r}")

    @property
    def key_suffix(self) -> str:
        """What a backend key adds for this config ("" for the defaults)."""
        if self == _DEFAULT:
            return ""
        text = f"{','.join(h.lower() for h in self.headers)}|{self.batching}|{self.engine_hints}"
        return "~s" + hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


_DEFAULT = SessionConfig()


def session_suffix(config: SessionConfig | None) -> str:
    """The backend-key suffix of a session setting (None: off)."""
    return "~s-off" if config is None else config.key_suffix


def affinity_key(request: ChatRequest) -> str:
    """The routing key of a request: its `route_key`, else its conversation prefix.

    A fan_out sibling's requests carry `route_key="sibling:<id>"`, and an agent
    run by a LangGraph task `"task:<hash>"`, so all its turns share a replica
    (agents with the same opening messages do not all follow the first one).
    Otherwise the key is `conversation_key(request)`.

    Args:
        request: the call to route.

    Returns:
        A string key; equal keys route to the same replica.
    """
    return request.route_key or conversation_key(request)


def session_key(request: ChatRequest, scope: str | None = None) -> str:
    """The opaque session key of a request (32 hex digits; see the module doc).

    Args:
        request: the call to route.
        scope: who sends it (the backend's credentials digest; None: no
            credentials): callers with other scopes get other keys.

    Example:
        ```python
        a = ChatRequest(model="m", messages=[], route_key="sibling:run/3")
        assert session_key(a) == session_key(replace(a, request_id="other"))
        ```
    """
    identity = affinity_key(request)
    if scope:
        identity = f"{scope}\x00{identity}"
    digest = hmac.new(_SECRET, identity.encode(), hashlib.sha256).hexdigest()
    return digest[:32]


def agentic_context(request: ChatRequest, key: str) -> dict[str, Any]:
    """vLLM-router's `vllm_xargs.agentic_context` for a request with session key `key`."""
    ctx: dict[str, Any] = {"program_id": key, "session_id": key}
    if request.turn is not None:
        ctx["step_id"] = request.turn
    if request.priority:
        ctx["priority"] = -request.priority  # the router resumes larger values first
    params = request.params
    cap = params.get("max_tokens") or params.get("max_completion_tokens")
    if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
        ctx["expected_output_length"] = cap
    if request.retention_s is not None and request.retention_s > 0:
        # How long the router should keep the program's KV while it waits on its tool.
        ctx["kv_retention_ttl_seconds"] = round(request.retention_s, 3)
    return ctx


_INCONCLUSIVE = frozenset({401, 403, 408, 429})
"""Answers to the probe that say nothing of what the server is (5xx too): asked again later."""


def is_router_answer(response: httpx.Response) -> bool:
    """True when a `GET /workers` answer is a router's list of workers."""
    if response.status_code != 200:
        return False
    try:
        data = json.loads(response.content)
    except ValueError:
        return False
    return isinstance(data, dict) and isinstance(data.get("workers"), list)


class SessionRouting:
    """A backend's session state: the headers it adds and whether batches mix sessions.

    Args:
        config: the setting (None: no key, batches mix).
        static_headers: the backend's own headers; a session header the user
            already sets there is left alone.
        scope: the backend's credentials digest (`credentials_hash`; None: none),
            part of every key so that callers with other credentials never share one.

    Raises:
        ValueError: `config` is neither a `SessionConfig` nor None.
    """

    __slots__ = ("_detect_after", "_names", "_per_session", "_probe", "_scope", "config")

    def __init__(
        self,
        config: SessionConfig | None,
        static_headers: Mapping[str, str],
        *,
        scope: str | None = None,
    ) -> None:
        if config is not None and not isinstance(config, SessionConfig):
            raise ValueError(f"session_affinity must be a SessionConfig or None, got {config!r}")
        self.config = config
        self._scope = scope
        taken = {k.lower() for k in static_headers}
        names = config.headers if config is not None else ()
        self._names = tuple(n for n in names if n.lower() not in taken)
        if not self._names or config is None or config.batching == "mixed":
            self._per_session: bool | None = False
        elif config.batching == "per_session" or config.engine_hints is not None:
            self._per_session = True  # one call carries one program's hints
        else:
            self._per_session = None  # "auto": decided by `resolve`
        self._detect_after = 0.0
        self._probe: asyncio.Future[None] | None = None  # the probe in flight, if any

    @property
    def hints(self) -> EngineHints | None:
        """The engine hints to send (None: none)."""
        return self.config.engine_hints if self.config is not None else None

    @property
    def per_session(self) -> bool:
        """Whether batches hold one session's requests only (False until resolved)."""
        return bool(self._per_session)

    def key(self, request: ChatRequest) -> str:
        """The session key of one request from this backend (its credentials' scope)."""
        return session_key(request, self._scope)

    def headers(self, request: ChatRequest) -> dict[str, str] | None:
        """The session headers of one request (None: none)."""
        if not self._names:
            return None
        return dict.fromkeys(self._names, self.key(request))

    def group_key(self, request: ChatRequest) -> str | None:
        """What batches must also share: the session key when per session, else None."""
        return self.key(request) if self._per_session else None

    async def resolve(
        self, get: Callable[[httpx.URL], Awaitable[httpx.Response]], url: httpx.URL, now: float
    ) -> None:
        """Decide `"auto"` once: `GET url` (a router's `/workers`) lists workers or not.

        A request that fails, takes over 5 s, or is answered 401, 403, 408, 429
        or 5xx leaves the batches mixed and asks again a minute later; any
        other answer decides for good. Batches that start while it is in flight wait for
        its answer instead of asking too.
        """
        if self._per_session is not None or now < self._detect_after:
            return
        if self._probe is not None:
            await asyncio.shield(self._probe)
            return
        self._probe = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(_DETECT_TIMEOUT_S):  # a batch waits for the answer
                response = await get(url)
        except (BackendError, TimeoutError) as exc:
            logger.debug(
                "router detection at %s failed (%r); batches mix sessions", safe_url(str(url)), exc
            )
            self._detect_after = now + _DETECT_RETRY_S
            return
        else:
            if response.status_code in _INCONCLUSIVE or response.status_code >= 500:
                # Busy, down or refusing us: no answer about what it is. Ask later.
                self._detect_after = now + _DETECT_RETRY_S
            else:
                self._per_session = is_router_answer(response)
        finally:  # the batches waiting on it read the answer (or ask again later)
            self._probe.set_result(None)
            self._probe = None
        if self._per_session:
            logger.info(
                "%s is a router in front of replicas: batched calls carry one session each",
                safe_url(str(url.copy_with(path="/"))),
            )
