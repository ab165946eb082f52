"""One event of an OpenAI-style stream, checked, and the stream's chunk timeout.

`OpenAICompatibleBackend._stream` reads the HTTP body and the SSE framing;
what each `data` payload means (a chunk, or a failure the server reports
after its 200 header, as vLLM does) and the error a silent stream ends in
live here, away from the transport.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import httpx

from langgraph_batch.backends._errormap import error_from_response
from langgraph_batch.backends._sse import ChatStreamAccumulator
from langgraph_batch.backends.base import ChatChunk, ChatRequest
from langgraph_batch.errors import BackendStreamError, StreamChunkTimeoutError

__all__ = ("chunk_timeout_error", "stream_event")

logger = logging.getLogger("langgraph_batch.backends.openai_compat")
"""The backend's logger: the chunk-timeout warning keeps the name it always had."""
# SSE events are UTF-8: parse without json.loads' encoding detection (µs per event).
_decode_json = json.JSONDecoder().decode


def chunk_timeout_error(
    request: ChatRequest, url: httpx.URL, gap: float | None, chunks: int
) -> StreamChunkTimeoutError:
    """The error of a stream silent for longer than `gap` seconds, logged (no content)."""
    logger.warning(
        "langgraph_batch stream_chunk_timeout fired",
        extra={
            "source": "stream_chunk_timeout",
            "timeout_s": gap,
            "model_name": request.model,
            "chunks_received": chunks,
            "request_id": request.request_id,
        },
    )
    return StreamChunkTimeoutError(
        f"no stream chunk from {url} for {gap} s (model={request.model}, "
        f"chunks_received={chunks}): the server is stalled or overloaded. Raise or "
        "disable `stream_chunk_timeout` (None or 0) if long silences are expected.",
        timeout_s=gap or 0.0,
        model_name=request.model,
        chunks_received=chunks,
        url=str(url),
        request_id=request.request_id or None,
    )


def stream_event(
    data: bytes,
    acc: ChatStreamAccumulator,
    on_chunk: Callable[[ChatChunk], None] | None,
    url: httpx.URL,
    rid: str | None,
) -> None:
    """Check one SSE `data` payload, add it to `acc` and pass the chunk to `on_chunk`.

    Raises:
        BackendStreamError: the payload is not a JSON object.
        BackendError: the server reported a failure after the 200 header.
    """
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
