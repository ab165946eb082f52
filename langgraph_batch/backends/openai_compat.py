"""`OpenAICompatibleBackend`: chat completions against any OpenAI-compatible server.

The base of the vLLM and SGLang backends. Speaks `/v1/chat/completions`
(plain or SSE with tool-call deltas and usage), `/v1/completions` for
requests that carry a raw `params["prompt"]`, `/v1/models` and `/health`.
Per-request work is kept small: the body is serialised once with `json.dumps`,
responses are read with `json.loads` on bytes, and no models are validated.

Every request goes through one `ShardedTransport` (`backends/_transport.py`):
small connection pools, a pool timeout, cancellation-safe cleanup and the one
transport-error map, streams included.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from langgraph_batch._rate_budget import observe_response
from langgraph_batch._redact import safe_url
from langgraph_batch.backends._errormap import error_from_response
from langgraph_batch.backends._errortext import summarize_body
from langgraph_batch.backends._http import (
    DEFAULT_CONNECT_TIMEOUT,
    check_str_map,
    credentials_hash,
    env_proxy,
    make_timeout,
    normalize_base_url,
)
from langgraph_batch.backends._session import SessionConfig, SessionRouting, session_suffix
from langgraph_batch.backends._sse import (
    ChatStreamAccumulator,
    SSEDecoder,
    parse_logprobs,
    parse_usage,
    tool_calls_from_wire,
)
from langgraph_batch.backends._stream_events import chunk_timeout_error, stream_event
from langgraph_batch.backends._transport import (
    DEFAULT_LIMITS,
    DEFAULT_POOL_TIMEOUT,
    SHARD_CONNECTIONS,
    CallInfo,
    ShardedTransport,
    map_transport_errors,
)
from langgraph_batch.backends.base import (
    Backend,
    BackendCapabilities,
    ChatChunk,
    ChatRequest,
    ChatResponse,
    ModelInfo,
)
from langgraph_batch.errors import (
    BackendConnectionError,
    BackendError,
    BackendServerError,
    BackendStreamError,
    BackendTimeoutError,
)

__all__ = (
    "SHARD_CONNECTIONS",
    "OpenAICompatibleBackend",
    "credentials_hash",
    "normalize_base_url",
)

logger = logging.getLogger(__name__)

_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}


# After [DONE], drain the body this long so the connection goes back to the pool.
_DRAIN_S = 0.1


def _json_default(obj: object) -> object:
    # Messages and params may hold Mapping/Sequence types json does not know.
    if isinstance(obj, Mapping):
        return dict(obj)
    if isinstance(obj, Sequence) and not isinstance(obj, str | bytes):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def dumps(body: object) -> bytes:
    """Compact JSON bytes for a request body."""
    return json.dumps(
        body, separators=(",", ":"), ensure_ascii=False, default=_json_default
    ).encode()


class OpenAICompatibleBackend(Backend):
    """Any server that speaks OpenAI's chat completions API.

    Example:
        ```python
        async with OpenAICompatibleBackend("http://127.0.0.1:8000/v1") as backend:
            resp = await backend.chat(
                ChatRequest(model="llama", messages=[{"role": "user", "content": "hi"}])
            )
        ```

    Args:
        base_url: the server, with or without the trailing `/v1`.
        api_key: sent as `Authorization: Bearer <api_key>` when given.
        timeout: read/write timeout per call, seconds (None: no limit). A request's
            own `timeout` overrides it.
        connect_timeout: connect timeout, seconds.
        limits: connection pool limits of all the backend's pools together
            (default: 1024 connections, keep-alive); spread over pools of at most
            `SHARD_CONNECTIONS` connections each.
        headers: extra headers sent with every request.
        query: query parameters added to every request URL (not for secrets:
            httpx logs URLs at INFO).
        transport: an `httpx` transport used instead of the connection pools
            (tests pass `httpx.MockTransport`); errors are still mapped.
        pool_timeout: seconds a request waits for a free connection when all
            `limits.max_connections` carry requests, then `PoolTimeoutError`
            (None: wait without limit).
        session_affinity: the session key each request carries for a router in
            front of replicas, and which requests a batch may mix (`SessionConfig`;
            None: no key).

    Raises:
        ValueError: on a malformed `base_url`, a non-positive timeout or bad limits.
    """

    capabilities = BackendCapabilities(flavor="openai")

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float | None = 60.0,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        limits: httpx.Limits | None = None,
        headers: Mapping[str, str] | None = None,
        query: Mapping[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        pool_timeout: float | None = DEFAULT_POOL_TIMEOUT,
        session_affinity: SessionConfig | None = SessionConfig(),  # noqa: B008 - frozen
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        if limits is not None and not isinstance(limits, httpx.Limits):
            raise ValueError(f"limits must be an httpx.Limits, got {type(limits).__name__}")
        check_str_map("headers", headers)
        if query is not None and not isinstance(query, Mapping):
            raise ValueError(f"query must be a mapping of names to values, got {query!r}")
        if api_key is not None and not isinstance(api_key, str):
            raise ValueError(f"api_key must be a string or None, got {type(api_key).__name__}")
        self.timeout = timeout
        self._connect_timeout = connect_timeout
        self._pool_timeout = pool_timeout
        client_headers = dict(_JSON_HEADERS)
        if headers:
            client_headers.update(headers)
        if api_key:
            client_headers["Authorization"] = f"Bearer {api_key}"
        self._credentials = credentials_hash(api_key, headers, query, url=self.base_url)
        self._session = SessionRouting(session_affinity, client_headers, scope=self._credentials)
        ssl_context: Any = None
        if transport is None and self.base_url.startswith("https://"):
            # One TLS context for all pools (building one costs ~50 ms of CPU).
            ssl_context = httpx.create_ssl_context()
        self._transport = ShardedTransport(
            limits=limits or DEFAULT_LIMITS,
            pool_timeout=pool_timeout,
            ssl_context=ssl_context,
            proxy=None if transport is not None else env_proxy(self.base_url),
            inner=transport,
            on_response=lambda req, resp: observe_response(self.key, req, resp),
        )
        self._client = httpx.AsyncClient(
            transport=self._transport,
            timeout=make_timeout(
                timeout, connect_timeout=connect_timeout, pool_timeout=pool_timeout
            ),
            headers=client_headers,
            params=dict(query) if query else None,
            follow_redirects=False,
            # The transport owns proxies (from the environment) and TLS; never
            # read credentials from .netrc.
            trust_env=False,
        )
        self._closed = False
        api = self.base_url + "/v1"
        self._chat_url = httpx.URL(api + "/chat/completions")
        self._completions_url = httpx.URL(api + "/completions")
        self._models_url = httpx.URL(api + "/models")
        self._health_url = httpx.URL(self.base_url + "/health")
        self._tokenize_url = httpx.URL(self.base_url + "/tokenize")
        self._workers_url = httpx.URL(self.base_url + "/workers")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({safe_url(self.base_url)!r})"

    @property
    def key(self) -> str:
        """The endpoint plus a digest of the credentials, headers and query.

        Models whose backends have equal keys share one scheduler and its HTTP
        client; the digest never reveals the secret (see `credentials_hash`).
        """
        base = f"{type(self).__name__}:{safe_url(self.base_url)}"  # the password: in the digest
        if self._credentials is not None:
            base = f"{base}#{self._credentials}"
        return base + session_suffix(self._session.config)

    @property
    def transport(self) -> ShardedTransport:
        """The HTTP transport: its `state()` shows connections and repairs."""
        return self._transport

    # ------------------------------------------------------------------ hooks for subclasses

    def _extend_body(self, body: dict[str, Any], request: ChatRequest) -> None:
        """Add server-specific fields (priority, request id) to a request body."""

    def _request_headers(self, request: ChatRequest) -> dict[str, str] | None:
        """Per-request headers: the session key (None: the client's defaults only)."""
        return self._session.headers(request)

    async def _resolve_session_batching(self) -> None:
        """Before a batch: decide once whether a router answers here (`SessionConfig`)."""
        await self._session.resolve(self._get, self._workers_url, asyncio.get_running_loop().time())

    # ------------------------------------------------------------------ chat

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError(
                f"{self!r} is closed: create a new backend (or use it inside `async with`)"
            )

    def _timeout_for(self, request: ChatRequest) -> httpx.Timeout | Any:
        if request.timeout is None:
            return httpx.USE_CLIENT_DEFAULT
        return make_timeout(
            request.timeout, connect_timeout=self._connect_timeout, pool_timeout=self._pool_timeout
        )

    def _build_body(self, request: ChatRequest) -> dict[str, Any]:
        params = request.params
        if "prompt" in params:
            body: dict[str, Any] = {"model": request.model}
            body.update(params)
        else:
            body = {"model": request.model, "messages": request.messages}
            if params:
                body.update(params)
        if request.stream:
            body["stream"] = True
            options = body.get("stream_options")
            body["stream_options"] = (
                {**options, "include_usage": True} if options else {"include_usage": True}
            )
        elif "stream" in body:
            body["stream"] = False
        self._extend_body(body, request)
        return body

    async def chat(
        self,
        request: ChatRequest,
        *,
        on_chunk: Callable[[ChatChunk], None] | None = None,
    ) -> ChatResponse:
        """Run one chat completion (see `Backend.chat`).

        A request whose `params` hold a raw `"prompt"` goes to `/v1/completions`
        instead (no chat template); its text comes back as `content`.

        Raises:
            BackendError: a subclass for every failure (see `langgraph_batch.errors`).
        """
        self._check_open()
        url = self._completions_url if "prompt" in request.params else self._chat_url
        payload = dumps(self._build_body(request))
        if request.stream:
            return await self._stream(url, payload, request, on_chunk)
        data = await self._post_json(url, payload, request)
        return self._parse_response(data, request)

    async def _error(
        self, response: httpx.Response, url: object, request: ChatRequest | None
    ) -> BackendError:
        model = request.model if request is not None else None
        available: tuple[str, ...] = ()
        if response.status_code == 404 and model is not None:
            available = await self._available_models()
        return error_from_response(
            response.status_code,
            response.content,
            response.headers,
            url=str(url),
            request_id=(request.request_id or None) if request is not None else None,
            model=model,
            available_models=available,
        )

    async def _available_models(self) -> tuple[str, ...]:
        # Only on the 404 path: one cheap GET so the error can list the right names.
        try:
            return tuple(m.id for m in await self.models())
        except BackendError:
            return ()

    async def _post_json(self, url: httpx.URL, payload: bytes, request: ChatRequest) -> Any:
        """POST a JSON body; return the decoded JSON answer or raise the mapped error."""
        response = await self._send(url, payload, request)
        if response.status_code >= 400:
            raise await self._error(response, url, request)
        return self._decode(response, url, request)

    async def _send(self, url: httpx.URL, payload: bytes, request: ChatRequest) -> httpx.Response:
        """POST a JSON body; transport errors mapped, HTTP errors returned as they are."""
        rid = request.request_id or None
        # The transport maps its own failures; this maps what httpx raises above it.
        with map_transport_errors(
            url, request_id=rid, read_timeout=request.timeout or self.timeout
        ):
            return await self._client.post(
                url,
                content=payload,
                headers=self._request_headers(request),
                timeout=self._timeout_for(request),
                extensions={"lgb": CallInfo(request_id=rid)},
            )

    def _decode(self, response: httpx.Response, url: httpx.URL, request: ChatRequest) -> Any:
        rid = request.request_id or None
        try:
            return json.loads(response.content)
        except ValueError as exc:
            raise BackendServerError(
                f"{url} answered HTTP {response.status_code} with a body that is not JSON "
                f"({summarize_body(response.content, response.headers.get('content-type'))}); "
                "the response was cut short, or base_url does not point at an "
                "OpenAI-compatible server",
                url=str(url),
                status_code=response.status_code,
                request_id=rid,
            ) from exc

    def _parse_response(self, data: Any, request: ChatRequest) -> ChatResponse:
        try:
            choice = data["choices"][0]
            message = choice.get("message")
            if message is not None:
                content = message.get("content")
                tool_calls = tool_calls_from_wire(message.get("tool_calls"))
            else:  # /v1/completions
                content = choice.get("text")
                tool_calls = ()
            return ChatResponse(
                id=data.get("id") or request.request_id,
                model=data.get("model") or request.model,
                content=content,
                tool_calls=tool_calls,
                finish_reason=choice.get("finish_reason"),
                usage=parse_usage(data.get("usage")),
                request_id=request.request_id,
                logprobs=parse_logprobs(choice.get("logprobs")),
            )
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise BackendServerError(
                f"malformed completion from {safe_url(self.base_url)}: {str(data)[:200]}",
                url=self.base_url,
                request_id=request.request_id or None,
            ) from exc

    async def _stream(
        self,
        url: httpx.URL,
        payload: bytes,
        request: ChatRequest,
        on_chunk: Callable[[ChatChunk], None] | None,
    ) -> ChatResponse:
        rid = request.request_id or None
        acc = ChatStreamAccumulator()
        decoder = SSEDecoder()
        done = False
        info = CallInfo(request_id=rid, stream=True)
        gap = request.stream_chunk_timeout or None
        loop = asyncio.get_running_loop()
        # `async with` closes the response on any exit, cancellation included (the
        # server sees the disconnect and aborts the generation); the transport maps
        # every transport failure of the body, with the chunk count from `info`.
        read_timeout = request.timeout or self.timeout
        with map_transport_errors(url, request_id=rid, read_timeout=read_timeout):
            async with self._client.stream(
                "POST",
                url,
                content=payload,
                headers=self._request_headers(request),
                timeout=self._timeout_for(request),
                extensions={"lgb": info},
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise await self._error(response, url, request)
                # The longest wait between two stream events (keep-alive comments do
                # not count), like langchain-openai's `stream_chunk_timeout`.
                deadline = asyncio.timeout_at(None if gap is None else loop.time() + gap)
                try:
                    async with deadline:
                        async for raw in response.aiter_bytes():
                            if done:
                                continue  # draining after [DONE]: keep the connection
                            for data in decoder.feed(raw):
                                if data == b"[DONE]":
                                    done = True
                                    deadline.reschedule(loop.time() + _DRAIN_S)
                                    break
                                stream_event(data, acc, on_chunk, url, rid)
                                info.chunks = acc.chunks
                                if gap is not None:
                                    deadline.reschedule(loop.time() + gap)
                except TimeoutError:
                    if not deadline.expired():
                        raise
                    if not done:
                        raise chunk_timeout_error(request, url, gap, acc.chunks) from None
        if not done:
            for data in decoder.flush():
                if data == b"[DONE]":
                    done = True
                    break
                stream_event(data, acc, on_chunk, url, rid)
        if not done and acc.finish_reason is None:
            raise BackendStreamError(
                f"the stream from {url} ended after {acc.chunks} chunks without a "
                "finish_reason or [DONE]: the server or a proxy truncated it",
                chunks_received=acc.chunks,
                url=str(url),
                request_id=rid,
            )
        return acc.response(request_id=request.request_id, fallback_model=request.model)

    # ------------------------------------------------------------------ other endpoints

    async def _get(self, url: httpx.URL) -> httpx.Response:
        self._check_open()
        # The transport gives a GET a free connection like any request, so a
        # metrics poll never waits behind long-running completions.
        with map_transport_errors(url, read_timeout=self.timeout):
            return await self._client.get(url)

    async def models(self) -> list[ModelInfo]:
        """The models `/v1/models` lists, with `max_model_len` where the server says.

        Raises:
            BackendError: the server could not be reached or answered an error.
        """
        response = await self._get(self._models_url)
        if response.status_code >= 400:
            raise await self._error(response, self._models_url, None)
        try:
            data = json.loads(response.content)
            return [
                ModelInfo(id=item["id"], max_model_len=item.get("max_model_len"))
                for item in data["data"]
            ]
        except (ValueError, KeyError, TypeError) as exc:
            raise BackendServerError(
                f"{self._models_url} answered with an unexpected body: {response.content[:200]!r}",
                url=str(self._models_url),
                status_code=response.status_code,
            ) from exc

    async def count_tokens(
        self,
        model: str,
        *,
        prompt: str | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        """`POST /tokenize` (vLLM, SGLang, the emulator): `{count}` from the server's tokenizer.

        `prompt` is counted without special tokens (as a piece of text);
        `messages` through the server's chat template, with the generation
        prompt: what a chat request with them would cost in prompt tokens.

        Raises:
            BackendError: unreachable, or an error status (404: no `/tokenize`).
        """
        self._check_open()
        body: dict[str, Any] = {"model": model}
        if messages is not None:
            body.update(messages=list(messages), add_generation_prompt=True)
            if tools:
                body["tools"] = list(tools)
        else:
            body.update(prompt=prompt or "", add_special_tokens=False)
        url = self._tokenize_url
        with map_transport_errors(url, read_timeout=self.timeout):
            response = await self._client.post(
                url, content=json.dumps(body), headers={"content-type": "application/json"}
            )
        if response.status_code >= 400:
            raise await self._error(response, url, None)
        try:
            return int(json.loads(response.content)["count"])
        except (ValueError, KeyError, TypeError) as exc:
            raise BackendServerError(
                f"{url} answered with an unexpected body: {response.content[:200]!r}",
                url=str(url),
                status_code=response.status_code,
            ) from exc

    async def health(self) -> bool:
        """True when `/health` answers 200 (servers without `/health`: `/v1/models`).

        Returns False, rather than raising, when the server cannot be reached.
        """
        try:
            response = await self._get(self._health_url)
            if response.status_code == 404:
                response = await self._get(self._models_url)
        except (BackendConnectionError, BackendTimeoutError) as exc:
            logger.debug("health check of %s failed: %s", safe_url(self.base_url), exc)
            return False
        return response.status_code == 200

    async def aclose(self) -> None:
        """Close the HTTP client and its connection pools (open streams too). Idempotent."""
        if not self._closed:
            self._closed = True
            await self._client.aclose()
