"""`OpenAICompatibleBackend`: chat completions against any OpenAI-compatible server.

The base of the vLLM and SGLang backends. Speaks `/v1/chat/completions`
(plain or SSE with tool-call deltas and usage), `/v1/completions` for
requests that carry a raw `params["prompt"]`, `/v1/models` and `/health`.
Per-request work is kept small: the body is serialised once with `json.dumps`,
responses are read with `json.loads` on bytes, and no models are validated.

Requests are spread over several small `httpx.AsyncClient`s (`_ClientShards`):
httpcore's pool does O(requests x connections) bookkeeping on every request
event, so one client with hundreds of requests in flight spends most of the
process's CPU there. Shards of at most `SHARD_CONNECTIONS` connections keep that
cost flat; together they never hold more than `limits.max_connections`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from langgraph_batch.backends._http import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_LIMITS,
    error_from_response,
    make_timeout,
    map_transport_errors,
)
from langgraph_batch.backends._sse import (
    ChatStreamAccumulator,
    SSEDecoder,
    parse_tool_calls,
    parse_usage,
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

__all__ = ("SHARD_CONNECTIONS", "OpenAICompatibleBackend", "normalize_base_url")

logger = logging.getLogger(__name__)

_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}

# Stream events are UTF-8 by the SSE spec: decode and parse without json.loads'
# encoding detection (a few microseconds per event).
_decode_json = json.JSONDecoder().decode


SHARD_CONNECTIONS = 8
"""Connections per `httpx.AsyncClient` shard (httpcore's per-event cost grows with its square).

Measured with `benchmarks/http_pool_overhead.py`: 8 costs about a quarter of the
client CPU per request of 32 (idle connections are rescanned on every event).
"""


class _Shard:
    """One `httpx.AsyncClient`, its connection cap and the requests it carries now."""

    __slots__ = ("capacity", "client", "inflight")

    def __init__(self, client: httpx.AsyncClient, capacity: int | None) -> None:
        self.client = client
        self.capacity = capacity
        self.inflight = 0


class _ClientShards:
    """Small `AsyncClient`s that together respect one set of connection limits.

    Shard `i` gets `min(shard_connections, what is left of max_connections)`
    connections and a proportional share of the keep-alive connections; shards
    are created on demand, when every existing one carries as many requests as
    it has connections. A request takes the least-loaded shard and keeps it for
    its whole life (`acquire` ... `release`), streams included. Beyond the total
    limit requests queue in their shard's pool, as they did in a single client.

    Args:
        make_client: builds a client with the given limits.
        limits: the limits of all shards together.
        shard_connections: connections per shard; None: one client, no sharding
            (a caller-supplied transport does its own pooling).
    """

    __slots__ = ("_keepalive_left", "_left", "_limits", "_make", "_size", "shards")

    def __init__(
        self,
        make_client: Callable[[httpx.Limits], httpx.AsyncClient],
        limits: httpx.Limits,
        shard_connections: int | None = SHARD_CONNECTIONS,
    ) -> None:
        if shard_connections is not None and shard_connections < 1:
            raise ValueError(f"shard_connections must be >= 1, got {shard_connections}")
        self._make = make_client
        self._limits = limits
        self._size = shard_connections
        self._left = limits.max_connections
        self._keepalive_left = limits.max_keepalive_connections
        self.shards: list[_Shard] = []
        self._add()

    def _add(self) -> _Shard:
        limits = self._limits
        total = limits.max_connections
        if self._size is None or (total is not None and total <= self._size):
            capacity, shard_limits = total, limits
            self._left = 0
            self._keepalive_left = 0
        else:
            capacity = self._size if self._left is None else min(self._size, self._left)
            keepalive: int | None = None
            if self._keepalive_left is not None:
                share = (
                    capacity
                    if total is None
                    else max(1, limits.max_keepalive_connections * capacity // total)  # type: ignore[operator]
                )
                keepalive = min(capacity, share, self._keepalive_left)
                self._keepalive_left -= keepalive
            if self._left is not None:
                self._left -= capacity
            shard_limits = httpx.Limits(
                max_connections=capacity,
                max_keepalive_connections=keepalive,
                keepalive_expiry=limits.keepalive_expiry,
            )
        shard = _Shard(self._make(shard_limits), capacity)
        self.shards.append(shard)
        return shard

    @property
    def primary(self) -> httpx.AsyncClient:
        """The first client (for the occasional GET)."""
        return self.shards[0].client

    def acquire(self) -> _Shard:
        """The shard for one request (call `release` when it is done)."""
        shards = self.shards
        best = shards[0]
        if len(shards) > 1:
            for shard in shards:
                if shard.inflight < best.inflight:
                    best = shard
        cap = best.capacity
        if (
            cap is not None
            and best.inflight >= cap
            and self._size is not None
            and (self._left is None or self._left > 0)
        ):
            best = self._add()
        best.inflight += 1
        return best

    @staticmethod
    def release(shard: _Shard) -> None:
        """The request on `shard` is over (its connection is back in the pool)."""
        shard.inflight -= 1

    async def aclose(self) -> None:
        """Close every client (their open streams too)."""
        for shard in self.shards:
            await shard.client.aclose()


def normalize_base_url(url: str) -> str:
    """The server root without a trailing `/` or `/v1` (endpoints add `/v1/...`).

    Raises:
        ValueError: when `url` is not an http(s) URL with a host.
    """
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(
            f"base_url must be an http(s) URL such as http://127.0.0.1:8000 or "
            f"http://127.0.0.1:8000/v1, got {url!r}"
        )
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    if not httpx.URL(url).host:
        raise ValueError(f"base_url {url!r} has no host; use http://host:port")
    return url


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
        limits: connection pool limits of all the backend's clients together
            (default: 1024 connections, keep-alive); spread over clients of at most
            `SHARD_CONNECTIONS` connections each.
        headers: extra headers sent with every request.
        transport: an `httpx` transport (tests pass `httpx.MockTransport`).

    Raises:
        ValueError: on a malformed `base_url` or a non-positive timeout.
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
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        self.timeout = timeout
        self._connect_timeout = connect_timeout
        client_headers = dict(_JSON_HEADERS)
        if headers:
            client_headers.update(headers)
        if api_key:
            client_headers["Authorization"] = f"Bearer {api_key}"
        self._client_headers = client_headers
        self._client_timeout = make_timeout(timeout, connect_timeout=connect_timeout)
        self._transport = transport
        # One TLS context for all shards (building one costs ~50 ms of CPU).
        self._ssl_context: Any = None
        self._shards = _ClientShards(
            self._new_client,
            limits or DEFAULT_LIMITS,
            None if transport is not None else SHARD_CONNECTIONS,
        )
        self._client = self._shards.primary
        self._closed = False
        api = self.base_url + "/v1"
        self._chat_url = httpx.URL(api + "/chat/completions")
        self._completions_url = httpx.URL(api + "/completions")
        self._models_url = httpx.URL(api + "/models")
        self._health_url = httpx.URL(self.base_url + "/health")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    # ------------------------------------------------------------------ hooks for subclasses

    def _new_client(self, limits: httpx.Limits) -> httpx.AsyncClient:
        """Build one client shard with `limits` (tests override it)."""
        if self._transport is None and self._ssl_context is None:
            self._ssl_context = httpx.create_ssl_context()
        return httpx.AsyncClient(
            timeout=self._client_timeout,
            limits=limits,
            headers=self._client_headers,
            transport=self._transport,
            follow_redirects=False,
            verify=self._ssl_context if self._transport is None else True,
        )

    def _extend_body(self, body: dict[str, Any], request: ChatRequest) -> None:
        """Add server-specific fields (priority, request id) to a request body."""

    def _request_headers(self, request: ChatRequest) -> dict[str, str] | None:
        """Per-request headers (None: the client's defaults only)."""
        return None

    # ------------------------------------------------------------------ chat

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError(
                f"{self!r} is closed: create a new backend (or use it inside `async with`)"
            )

    def _timeout_for(self, request: ChatRequest) -> httpx.Timeout | Any:
        if request.timeout is None:
            return httpx.USE_CLIENT_DEFAULT
        return make_timeout(request.timeout, connect_timeout=self._connect_timeout)

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
        timeout = self._timeout_for(request)
        shard = self._shards.acquire()
        try:
            with map_transport_errors(
                url,
                request_id=request.request_id or None,
                read_timeout=request.timeout or self.timeout,
            ):
                return await shard.client.post(
                    url, content=payload, headers=self._request_headers(request), timeout=timeout
                )
        finally:
            shard.inflight -= 1

    def _decode(self, response: httpx.Response, url: httpx.URL, request: ChatRequest) -> Any:
        rid = request.request_id or None
        try:
            return json.loads(response.content)
        except ValueError as exc:
            raise BackendServerError(
                f"{url} answered HTTP {response.status_code} with a body that is not JSON: "
                f"{response.content[:200]!r}; is base_url pointing at an OpenAI-compatible server?",
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
                tool_calls = parse_tool_calls(message.get("tool_calls"))
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
            )
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise BackendServerError(
                f"malformed completion from {self.base_url}: {str(data)[:200]}",
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
        read_timeout = request.timeout or self.timeout
        # The request keeps its shard until the stream is closed.
        shard = self._shards.acquire()
        try:
            # `async with` closes the connection on any exit, cancellation included, so
            # the server sees the disconnect and aborts the generation.
            with map_transport_errors(url, request_id=rid, read_timeout=read_timeout):
                async with shard.client.stream(
                    "POST",
                    url,
                    content=payload,
                    headers=self._request_headers(request),
                    timeout=self._timeout_for(request),
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise await self._error(response, url, request)
                    try:
                        async for raw in response.aiter_bytes():
                            for data in decoder.feed(raw):
                                if data == b"[DONE]":
                                    done = True
                                    break
                                self._on_event(data, acc, on_chunk, url, rid)
                            if done:
                                break
                    except httpx.TimeoutException as exc:
                        raise BackendTimeoutError(
                            f"{url} stopped sending for {read_timeout} s after "
                            f"{acc.chunks} chunks: raise `timeout=` or lower the load",
                            url=str(url),
                            request_id=rid,
                        ) from exc
                    except httpx.TransportError as exc:
                        raise BackendStreamError(
                            f"the connection to {url} dropped mid-stream after {acc.chunks} "
                            f"chunks ({type(exc).__name__}: {exc}); the server restarted or "
                            "a proxy cut the stream",
                            chunks_received=acc.chunks,
                            url=str(url),
                            request_id=rid,
                        ) from exc
        finally:
            shard.inflight -= 1
        if not done:
            for data in decoder.flush():
                if data == b"[DONE]":
                    done = True
                    break
                self._on_event(data, acc, on_chunk, url, rid)
        if not done and acc.finish_reason is None:
            raise BackendStreamError(
                f"the stream from {url} ended after {acc.chunks} chunks without a "
                "finish_reason or [DONE]: the server or a proxy truncated it",
                chunks_received=acc.chunks,
                url=str(url),
                request_id=rid,
            )
        return acc.response(request_id=request.request_id, fallback_model=request.model)

    def _on_event(
        self,
        data: bytes,
        acc: ChatStreamAccumulator,
        on_chunk: Callable[[ChatChunk], None] | None,
        url: httpx.URL,
        rid: str | None,
    ) -> None:
        try:
            obj = _decode_json(data.decode())
        except ValueError as exc:  # UnicodeDecodeError is a ValueError too
            raise BackendStreamError(
                f"invalid JSON in the stream from {url} after {acc.chunks} chunks: {data[:200]!r}",
                chunks_received=acc.chunks,
                url=str(url),
                request_id=rid,
            ) from exc
        if not isinstance(obj, dict):
            raise BackendStreamError(
                f"unexpected event in the stream from {url}: {data[:200]!r}",
                chunks_received=acc.chunks,
                url=str(url),
                request_id=rid,
            )
        error = obj.get("error")
        if error is not None and not obj.get("choices"):
            # vLLM reports failures after the 200 header as a data event.
            code = error.get("code") if isinstance(error, dict) else None
            status = code if isinstance(code, int) and code >= 400 else 500
            raise error_from_response(status, data, {}, url=str(url), request_id=rid)
        chunk = acc.add(obj)
        if on_chunk is not None:
            on_chunk(chunk)

    # ------------------------------------------------------------------ other endpoints

    async def _get(self, url: httpx.URL) -> httpx.Response:
        self._check_open()
        # A shard with a free connection, as for completions: on the primary
        # client a metrics poll would wait behind its long-running completions
        # (seconds), and the scheduler would adapt on stale load figures.
        shard = self._shards.acquire()
        try:
            with map_transport_errors(url, read_timeout=self.timeout):
                return await shard.client.get(url)
        finally:
            self._shards.release(shard)

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

    async def health(self) -> bool:
        """True when `/health` answers 200 (servers without `/health`: `/v1/models`).

        Returns False, rather than raising, when the server cannot be reached.
        """
        try:
            response = await self._get(self._health_url)
            if response.status_code == 404:
                response = await self._get(self._models_url)
        except (BackendConnectionError, BackendTimeoutError) as exc:
            logger.debug("health check of %s failed: %s", self.base_url, exc)
            return False
        return response.status_code == 200

    async def aclose(self) -> None:
        """Close the HTTP clients (open streams are closed). Idempotent."""
        if not self._closed:
            self._closed = True
            await self._shards.aclose()
