"""vLLM's JSON shapes: errors, chat completions, chunks, usage, metrics text."""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from starlette.responses import JSONResponse

__all__ = ("ChunkEncoder", "chat_chunk", "error_response", "sse", "usage_dict")

_dumps = json.JSONEncoder(separators=(",", ":")).encode
"""`json.dumps(x, separators=(",", ":"))` without building an encoder per call."""
_encode_str = json.encoder.encode_basestring_ascii


def error_response(
    message: str,
    *,
    status: int = 400,
    err_type: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """VLLM's `ErrorResponse`: `{"error": {"message", "type", "param", "code"}}`.

    `code` is the HTTP status as an int, `type` vLLM's name for it
    (`BadRequestError`, `NotFoundError`, ...).
    """
    if err_type is None:
        err_type = {
            400: "BadRequestError",
            404: "NotFoundError",
            429: "RateLimitError",
            500: "InternalServerError",
            501: "NotImplementedError",
            503: "ServiceUnavailableError",
        }.get(status, HTTPStatus(status).phrase)
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def usage_dict(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None, *, details: bool
) -> dict[str, Any]:
    """OpenAI/vLLM `usage` (with `prompt_tokens_details` only when enabled)."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens or 0} if details else None,
    }


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event line pair."""
    data = payload if isinstance(payload, str) else _dumps(payload)
    return f"data: {data}\n\n".encode()


def chat_chunk(
    rid: str,
    model: str,
    created: int,
    delta: dict[str, Any],
    *,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A `chat.completion.chunk` with one choice."""
    out: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
                **({"stop_reason": None} if finish_reason else {}),
            }
        ],
    }
    if usage is not None:
        out["usage"] = usage
    return out


def logprobs_json(pieces: Sequence[str], top: int) -> dict[str, Any]:
    """The chat `logprobs` vLLM returns for generated `pieces`: deterministic, made up.

    Each token's logprob is a function of its text (a crc32), in (-2.0, 0.0];
    with `top` > 0 the token leads its `top_logprobs`, followed by made-up
    alternatives (`piece~1`, ...) that are less likely.
    """
    content = []
    for piece in pieces:
        logprob = -(zlib.crc32(piece.encode()) % 2000) / 1000.0
        entry: dict[str, Any] = {
            "token": piece,
            "logprob": logprob,
            "bytes": list(piece.encode()),
        }
        alts = [{"token": piece, "logprob": logprob, "bytes": list(piece.encode())}]
        for j in range(1, top):
            alt = f"{piece}~{j}"
            alts.append({"token": alt, "logprob": logprob - j, "bytes": list(alt.encode())})
        entry["top_logprobs"] = alts[:top]
        content.append(entry)
    return {"content": content}


def now_s() -> int:
    """`created` timestamp."""
    return int(time.time())


class ChunkEncoder:
    """The SSE frames of one chat stream's token chunks, pre-encoded.

    The bytes equal `sse(chat_chunk(rid, model, created, delta))`: the parts
    shared by every chunk of the stream are encoded once, so a token costs
    one small JSON encode and a byte concatenation.

    Args:
        rid: The chunk `id` (`chatcmpl-...`).
        model: The model name.
        created: The `created` timestamp.
    """

    __slots__ = ("_head", "_tail")

    def __init__(self, rid: str, model: str, created: int) -> None:
        self._head = (
            f'data: {{"id":{_encode_str(rid)},"object":"chat.completion.chunk",'
            f'"created":{int(created)},"model":{_encode_str(model)},'
            '"choices":[{"index":0,"delta":'
        ).encode()
        self._tail = b',"logprobs":null,"finish_reason":null}]}\n\n'

    def delta(self, delta: dict[str, Any]) -> bytes:
        """The frame of a chunk carrying `delta` (no finish reason)."""
        return self._head + _dumps(delta).encode() + self._tail

    def content(self, text: str) -> bytes:
        """The frame of a `{"content": text}` delta."""
        return b"".join((self._head, b'{"content":', _encode_str(text).encode(), b"}", self._tail))
