"""Amazon Bedrock's Converse API for Claude, on the hosted Anthropic flavour.

With `EmulatorConfig(hosted="anthropic")` the emulator also answers
`POST /model/{modelId}/converse` and `/converse-stream`, so boto3's
`bedrock-runtime` client and langchain-aws's `ChatBedrockConverse` run
against it unmodified (`endpoint_url` pointed at the emulator, any static
credentials: the signature is not checked).

Bedrock runs Claude with Anthropic's prompt cache; what differs is the wire
format (https://docs.aws.amazon.com/bedrock/latest/userguide/prompt-caching.html,
"the page" below, and the Converse API reference):

- A `{"cachePoint": {"type": "default"}}` block in `system`, in a message's
  `content` or in `toolConfig.tools` marks the end of a cached prefix: the
  page's "cache checkpoint"; everything before it is cached. It stands for an
  Anthropic `cache_control` breakpoint on the block before it, with the same
  limits (at most 4, the minimum tokens per checkpoint by model, "5m" unless
  `ttl: "1h"`), so the request is translated to a Messages body and priced by
  the same `PromptCache`.
- `usage` reports `inputTokens` (the uncached input only),
  `cacheReadInputTokens`, `cacheWriteInputTokens`, `outputTokens` and
  `totalTokens` (all four summed).
- Errors carry the `x-amzn-ErrorType` header (`ValidationException` for a
  400, `ThrottlingException` for a 429) and a JSON `message`; Bedrock sends
  no rate-limit headers.
- `converse-stream` answers in AWS's binary event-stream framing
  (`application/vnd.amazon.eventstream`): `messageStart`,
  `contentBlockStart` (tool uses), `contentBlockDelta`, `contentBlockStop`,
  `messageStop`, then `metadata` with the usage.
"""

from __future__ import annotations

import json
import struct
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from langgraph_batch.emulator._anthropic_api import AnthropicFlavor, content_blocks
from langgraph_batch.emulator._anthropic_cache import CachePlan, CacheRuleError
from langgraph_batch.emulator._http import RequestError
from langgraph_batch.emulator.scenarios import Plan

__all__ = ("encode_event", "routes", "to_messages_body")

_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}
_DEFAULT_MAX_TOKENS = 4096
_ERROR_TYPES = {
    400: "ValidationException",
    429: "ThrottlingException",
    503: "ServiceUnavailableException",
}


def _error(message: str, status: int = 400, headers: Mapping[str, str] | None = None) -> Response:
    kind = _ERROR_TYPES.get(status, "InternalServerException")
    return JSONResponse(
        {"message": message},
        status_code=status,
        headers={**(headers or {}), "x-amzn-ErrorType": f"{kind}:"},
    )


def _cache_control(point: Any) -> dict[str, Any]:
    if not isinstance(point, Mapping) or point.get("type") != "default":
        raise RequestError("cachePoint.type must be 'default'")
    out: dict[str, Any] = {"type": "ephemeral"}
    if "ttl" in point:
        out["ttl"] = point["ttl"]
    return out


def _blocks(items: Any, what: str, convert: Any) -> list[dict[str, Any]]:
    """Converse blocks as Messages blocks, each `cachePoint` marking the block before it."""
    if not isinstance(items, list):
        raise RequestError(f"{what}: must be a list")
    out: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, Mapping):
            raise RequestError(f"{what}: each block must be an object")
        if "cachePoint" in item:
            if not out:
                raise RequestError(f"{what}: a cachePoint must follow the content it caches")
            out[-1]["cache_control"] = _cache_control(item["cachePoint"])
            continue
        out.append(convert(item, what))
    return out


def _system_block(item: Mapping[str, Any], what: str) -> dict[str, Any]:
    if "text" not in item:
        raise RequestError(f"{what}: only text system blocks are emulated")
    return {"type": "text", "text": str(item["text"])}


def _tool(item: Mapping[str, Any], what: str) -> dict[str, Any]:
    spec = item.get("toolSpec")
    if not isinstance(spec, Mapping) or not spec.get("name"):
        raise RequestError(f"{what}: each tool needs a toolSpec with a name")
    schema = spec.get("inputSchema") or {}
    return {
        "name": spec["name"],
        "description": spec.get("description", ""),
        "input_schema": schema.get("json", {"type": "object"}),
    }


def _result_text(content: Any) -> str:
    parts = []
    for part in content if isinstance(content, list) else []:
        if isinstance(part, Mapping) and "text" in part:
            parts.append(str(part["text"]))
        elif isinstance(part, Mapping) and "json" in part:
            parts.append(json.dumps(part["json"]))
    return "".join(parts)


def _message_block(item: Mapping[str, Any], what: str) -> dict[str, Any]:
    if "text" in item:
        return {"type": "text", "text": str(item["text"])}
    if "toolUse" in item:
        use = item["toolUse"]
        return {
            "type": "tool_use",
            "id": use.get("toolUseId"),
            "name": use.get("name"),
            "input": use.get("input", {}),
        }
    if "toolResult" in item:
        result = item["toolResult"]
        return {
            "type": "tool_result",
            "tool_use_id": result.get("toolUseId"),
            "content": _result_text(result.get("content")),
        }
    raise RequestError(f"{what}: content block {sorted(item)} is not emulated")


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if not isinstance(choice, Mapping):
        return None
    if "any" in choice:
        return {"type": "any"}
    if "tool" in choice:
        return {"type": "tool", "name": choice["tool"].get("name")}
    return {"type": "auto"}


def to_messages_body(model: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """A Converse request as the Messages body it stands for (checkpoints as breakpoints).

    Example:
        ```python
        body = {"system": [{"text": "s"}, {"cachePoint": {"type": "default"}}],
                "messages": [{"role": "user", "content": [{"text": "hi"}]}]}
        out = to_messages_body("anthropic.claude-sonnet-4-5", body)
        assert out["system"] == [{"type": "text", "text": "s",
                                  "cache_control": {"type": "ephemeral"}}]
        ```

    Raises:
        RequestError: a malformed field, or a checkpoint with nothing before it.
    """
    config = body.get("inferenceConfig") or {}
    out: dict[str, Any] = {
        "model": model,
        "max_tokens": config.get("maxTokens", _DEFAULT_MAX_TOKENS),
        "messages": [],
    }
    if body.get("system"):
        out["system"] = _blocks(body["system"], "system", _system_block)
    tool_config = body.get("toolConfig") or {}
    if tool_config.get("tools"):
        out["tools"] = _blocks(tool_config["tools"], "toolConfig.tools", _tool)
        if (choice := _tool_choice(tool_config.get("toolChoice"))) is not None:
            out["tool_choice"] = choice
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: a non-empty list is required")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise RequestError(f"messages.{i}: must be an object")
        content = _blocks(message.get("content"), f"messages.{i}.content", _message_block)
        out["messages"].append({"role": message.get("role"), "content": content})
    return out


def _usage(cached: CachePlan, output_tokens: int) -> dict[str, int]:
    read, write = cached.cache_read_input_tokens, cached.cache_creation_input_tokens
    return {
        "inputTokens": cached.input_tokens,
        "outputTokens": output_tokens,
        "totalTokens": cached.input_tokens + read + write + output_tokens,
        "cacheReadInputTokens": read,
        "cacheWriteInputTokens": write,
    }


def _converse_content(plan: Plan) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in content_blocks(plan):
        if block["type"] == "text":
            out.append({"text": block["text"]})
        else:
            use = {"toolUseId": block["id"], "name": block["name"], "input": block["input"]}
            out.append({"toolUse": use})
    return out


def _block_deltas(block: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """A content block's `contentBlockStart` payload (tool uses only) and its deltas."""
    if "toolUse" in block:
        use = block["toolUse"]
        raw = json.dumps(use["input"])
        start = {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}
        return start, [{"toolUse": {"input": raw[i : i + 16]}} for i in range(0, len(raw), 16)]
    text = block["text"]
    step = max(1, len(text) // 4)
    return None, [{"text": text[i : i + step]} for i in range(0, len(text), step)]


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    # Header value type 7 is a string (uint16 length, then its bytes).
    return (
        struct.pack(">B", len(raw_name)) + raw_name + struct.pack(">BH", 7, len(raw_value))
    ) + raw_value


def encode_event(event_type: str, payload: Mapping[str, Any]) -> bytes:
    """One message of AWS's event-stream framing, as `converse-stream` sends it.

    Total length and headers length (uint32 each) and their CRC32, the
    headers (`:event-type`, `:content-type`, `:message-type`), the JSON
    payload, and the CRC32 of everything before it; botocore checks both CRCs.
    """
    headers = b"".join(
        _header(k, v)
        for k, v in (
            (":event-type", event_type),
            (":content-type", "application/json"),
            (":message-type", "event"),
        )
    )
    data = json.dumps(payload).encode()
    prelude = struct.pack(">II", 12 + len(headers) + len(data) + 4, len(headers))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + data
    return message + struct.pack(">I", zlib.crc32(message))


class _Converse:
    def __init__(self, flavor: AnthropicFlavor) -> None:
        self.flavor = flavor

    async def converse(self, request: HTTPRequest) -> Response:
        """`POST /model/{modelId}/converse` and `/converse-stream`."""
        flavor, serving = self.flavor, self.flavor.serving
        stream = request.url.path.endswith("/converse-stream")
        try:
            body = await serving.body(request)
            messages_body = to_messages_body(request.path_params["model_id"], body)
            parsed, plan, cached = flavor.prepare(request, body, messages_body)
            admission = serving.admit(
                {"max_tokens": parsed.max_tokens},
                cached.input_tokens + cached.cache_creation_input_tokens,
                {},  # Bedrock sends no rate-limit headers
                style="anthropic",
            )
        except RequestError as exc:
            retry = {k: v for k, v in exc.headers.items() if k.lower() == "retry-after"}
            return _error(str(exc), exc.status, retry)
        except CacheRuleError as exc:
            return _error(str(exc))
        headers = {"x-amzn-RequestId": str(uuid.uuid4())}
        started = time.monotonic()
        if stream:
            events = self._events(parsed.model, plan, cached, started)

            async def body_stream() -> AsyncIterator[bytes]:
                try:
                    async for chunk in events:
                        yield chunk
                finally:
                    serving.settle(admission, plan.num_tokens)

            return StreamingResponse(
                body_stream(), media_type="application/vnd.amazon.eventstream", headers=headers
            )
        await flavor.answer(cached, plan, admission)
        answer = {
            "output": {"message": {"role": "assistant", "content": _converse_content(plan)}},
            "stopReason": _STOP.get(plan.finish_reason, "end_turn"),
            "usage": _usage(cached, plan.num_tokens),
            "metrics": {"latencyMs": int((time.monotonic() - started) * 1000)},
        }
        return JSONResponse(answer, headers=headers)

    async def _events(
        self, model: str, plan: Plan, cached: CachePlan, started: float
    ) -> AsyncIterator[bytes]:
        flavor = self.flavor
        await flavor.sleep(flavor.latency.first_token_s(cached))
        flavor.cache.commit(cached, now=flavor.now())
        yield encode_event("messageStart", {"role": "assistant"})
        blocks = [_block_deltas(block) for block in _converse_content(plan)]
        # The output takes as long as the non-streamed answer's, spread over every delta.
        pace = plan.num_tokens / flavor.latency.output_tps / max(1, sum(len(d) for _, d in blocks))
        for index, (start, deltas) in enumerate(blocks):
            if start is not None:
                yield encode_event(
                    "contentBlockStart", {"contentBlockIndex": index, "start": start}
                )
            for delta in deltas:
                await flavor.sleep(pace)
                yield encode_event(
                    "contentBlockDelta", {"contentBlockIndex": index, "delta": delta}
                )
            yield encode_event("contentBlockStop", {"contentBlockIndex": index})
        flavor.stats.add(cached, plan.num_tokens)
        stop = _STOP.get(plan.finish_reason, "end_turn")
        yield encode_event("messageStop", {"stopReason": stop})
        latency = {"latencyMs": int((time.monotonic() - started) * 1000)}
        yield encode_event(
            "metadata", {"usage": _usage(cached, plan.num_tokens), "metrics": latency}
        )


def routes(flavor: AnthropicFlavor) -> list[Route]:
    """The Converse routes, served by the Anthropic flavour's cache and latency model."""
    handler = _Converse(flavor)
    return [
        Route("/model/{model_id:path}/converse", handler.converse, methods=["POST"]),
        Route("/model/{model_id:path}/converse-stream", handler.converse, methods=["POST"]),
    ]
