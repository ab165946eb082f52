"""The formats of the emulated batch APIs: input checks, output lines, result shapes.

Pure functions of `_batch_api` (see there for the providers' pages they follow).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from langgraph_batch.emulator._http import RequestError

__all__ = (
    "Outcome",
    "anthropic_error",
    "anthropic_items",
    "anthropic_result",
    "jsonl",
    "openai_items",
    "openai_line",
)

_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # Anthropic's rule for custom_id
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


@dataclass(slots=True, kw_only=True)
class Outcome:
    """One item's end: `ok` with the chat completion, `error` (status, body) or `expired`."""

    custom_id: str
    kind: str
    status: int = 200
    body: Any = None


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return ("\n".join(json.dumps(line) for line in lines) + "\n").encode()


def openai_items(
    data: bytes, endpoint: str
) -> tuple[list[tuple[str, dict[str, Any]]], list[dict[str, Any]]]:
    """The input file's items, or the validation errors (`errors.data` of a failed batch)."""
    items: list[tuple[str, dict[str, Any]]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, text in enumerate(data.decode(errors="replace").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            errors.append(_line_error("invalid_json_line", "This line is not valid JSON.", n))
            continue
        cid = line.get("custom_id") if isinstance(line, dict) else None
        if not isinstance(cid, str) or not cid:
            errors.append(_line_error("missing_required_parameter", "custom_id is required", n))
        elif cid in seen:
            errors.append(_line_error("duplicate_custom_id", f"custom_id {cid!r} repeats", n))
        elif line.get("method") != "POST" or line.get("url") != endpoint:
            errors.append(_line_error("invalid_url", f"each line must POST to {endpoint}", n))
        elif not isinstance(line.get("body"), dict):
            errors.append(_line_error("missing_required_parameter", "body is required", n))
        else:
            seen.add(cid)
            items.append((cid, dict(line["body"])))
    if not items and not errors:
        errors.append(_line_error("empty_file", "The input file has no requests.", None))
    return items, errors


def _line_error(code: str, message: str, line: int | None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": None, "line": line}


def openai_line(o: Outcome) -> dict[str, Any]:
    line: dict[str, Any] = {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": o.custom_id}
    if o.kind in ("ok", "error"):
        request_id = f"req_{uuid.uuid4().hex[:16]}"
        line["response"] = {"status_code": o.status, "request_id": request_id, "body": o.body}
        line["error"] = None
    elif o.kind == "expired":
        line["response"] = None
        line["error"] = {
            "code": "batch_expired",
            "message": "This request could not be executed before the completion window expired.",
        }
    else:
        line["response"] = None
        line["error"] = {
            "code": "batch_cancelled",
            "message": "This request could not be executed before the batch was cancelled.",
        }
    return line


def anthropic_items(
    raw: Any,
) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, tuple[Any, bool]]]:
    """`requests` as `(custom_id, chat body)` pairs, and each one's model and cache mark.

    Raises:
        RequestError: a malformed request list.
    """
    if not isinstance(raw, list) or not raw:
        raise RequestError("requests: a non-empty list is required")
    items: list[tuple[str, dict[str, Any]]] = []
    meta: dict[str, tuple[Any, bool]] = {}
    seen: set[str] = set()
    for n, entry in enumerate(raw):
        cid = entry.get("custom_id") if isinstance(entry, Mapping) else None
        if not isinstance(cid, str) or not _CUSTOM_ID.match(cid):
            raise RequestError(f"requests.{n}.custom_id: must match {_CUSTOM_ID.pattern}")
        if cid in seen:
            raise RequestError(f"requests.{n}.custom_id: {cid!r} is not unique")
        params = entry.get("params")
        if not isinstance(params, Mapping) or not isinstance(params.get("max_tokens"), int):
            raise RequestError(f"requests.{n}.params: max_tokens is required")
        seen.add(cid)
        items.append((cid, _chat_body(params)))
        meta[cid] = (params.get("model"), _marks_cache(params))
    return items, meta


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping))
    return ""


def _marks_cache(params: Mapping[str, Any]) -> bool:
    return "cache_control" in json.dumps(params)


def _chat_body(params: Mapping[str, Any]) -> dict[str, Any]:
    """An Anthropic `params` as the chat completion the emulated engine runs."""
    messages: list[dict[str, Any]] = []
    system = params.get("system")
    if system:
        messages.append({"role": "system", "content": _text(system)})
    messages.extend(
        {"role": msg.get("role", "user"), "content": _text(msg.get("content"))}
        for msg in params.get("messages") or []
        if isinstance(msg, Mapping)
    )
    body: dict[str, Any] = {
        "messages": messages,
        "max_tokens": params["max_tokens"],
    }
    if "temperature" in params:
        body["temperature"] = params["temperature"]
    return body


def _anthropic_message(completion: Mapping[str, Any], model: Any, cache: bool) -> dict[str, Any]:
    choice = completion["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        content.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": fn["name"],
                "input": json.loads(fn["arguments"] or "{}"),
            }
        )
    usage = completion.get("usage") or {}
    cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
    read = cached if cache else 0
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model or completion.get("model"),
        "content": content,
        "stop_reason": _STOP_REASONS.get(choice.get("finish_reason"), "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": int(usage.get("prompt_tokens", 0)) - read,
            "output_tokens": int(usage.get("completion_tokens", 0)),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": read,
        },
    }


def anthropic_result(o: Outcome, meta: Mapping[str, tuple[Any, bool]]) -> dict[str, Any]:
    """One line of a Message Batch's results."""
    if o.kind == "ok":
        model, cache = meta[o.custom_id]
        message = _anthropic_message(o.body, model, cache)
        return {"custom_id": o.custom_id, "result": {"type": "succeeded", "message": message}}
    if o.kind == "error":
        err = (o.body or {}).get("error") or {}
        kind = "invalid_request_error" if 400 <= o.status < 500 else "api_error"
        error = {"type": "error", "error": {"type": kind, "message": str(err.get("message"))}}
        return {"custom_id": o.custom_id, "result": {"type": "errored", "error": error}}
    return {"custom_id": o.custom_id, "result": {"type": o.kind}}


def anthropic_error(message: str, status: int) -> JSONResponse:
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    return JSONResponse(
        {"type": "error", "error": {"type": kind, "message": message}}, status_code=status
    )
