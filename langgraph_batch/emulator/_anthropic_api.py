"""The hosted Anthropic flavour: `POST /v1/messages` with Anthropic's prompt caching.

With `EmulatorConfig(hosted="anthropic")` the emulator also answers the
Messages API (JSON and SSE streaming, tool use, `count_tokens`), so the
official `anthropic` SDK and langchain-anthropic's `ChatAnthropic` run
against it unmodified (`base_url` pointed at the emulator, any API key).
What the model says comes from the scenario, as on the OpenAI routes; what
the request reads from and writes to the prompt cache, and what it is billed,
follows Anthropic's rules (`_anthropic_cache`), reported in `usage`.

A hosted API is not a GPU this client shares with its siblings, so this
flavour does not run requests through the engine: each request takes
`HostedLatency` (a first-token delay that grows with the uncached prompt and
much less with the cached part, then a steady output rate), divided by
`time_scale`. The cache clock is the same emulated time.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from langgraph_batch.emulator._anthropic_cache import (
    Block,
    CachePlan,
    CacheRuleError,
    PromptCache,
    chain_digests,
    strip_cache_control,
)
from langgraph_batch.emulator._http import RequestError
from langgraph_batch.emulator._ratelimit import Admission
from langgraph_batch.emulator._serving import Serving
from langgraph_batch.emulator.scenarios import Plan, plan_chat
from langgraph_batch.emulator.tokenizer import count_tokens

__all__ = ("AnthropicFlavor", "HostedLatency", "content_blocks", "parse", "routes")

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    529: "overloaded_error",
}
_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


@dataclass(frozen=True, slots=True, kw_only=True)
class HostedLatency:
    """How long a hosted request takes, in emulated seconds.

    First token: `base_s` + uncached prompt tokens (plain input and cache
    writes) / `prefill_tps` + cache reads / `read_tps`; then one output token
    per 1 / `output_tps`. The defaults are round figures of the order a
    hosted Sonnet-class model shows, with reads ten times cheaper than
    prefill (Anthropic quotes up to 85% lower latency for long cached prompts).
    """

    base_s: float = 0.3
    prefill_tps: float = 10_000.0
    read_tps: float = 100_000.0
    output_tps: float = 80.0

    def first_token_s(self, plan: CachePlan) -> float:
        """Seconds to the first output token."""
        fresh = plan.input_tokens + plan.cache_creation_input_tokens
        return self.base_s + fresh / self.prefill_tps + plan.cache_read_input_tokens / self.read_tps


@dataclass(slots=True, kw_only=True)
class HostedStats:
    """Totals since the last reset (`GET /emulator/hosted`)."""

    requests: int = 0
    input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    ephemeral_5m_input_tokens: int = 0
    ephemeral_1h_input_tokens: int = 0
    output_tokens: int = 0

    def add(self, plan: CachePlan, output_tokens: int) -> None:
        """Count one answered request."""
        self.requests += 1
        self.input_tokens += plan.input_tokens
        self.cache_read_input_tokens += plan.cache_read_input_tokens
        self.cache_creation_input_tokens += plan.cache_creation_input_tokens
        self.ephemeral_5m_input_tokens += plan.ephemeral_5m_input_tokens
        self.ephemeral_1h_input_tokens += plan.ephemeral_1h_input_tokens
        self.output_tokens += output_tokens


def _error(message: str, status: int = 400) -> JSONResponse:
    kind = _ERROR_TYPES.get(status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return JSONResponse(body, status_code=status)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            str(b.get("text", "")) for b in content if isinstance(b, Mapping) and "text" in b
        )
    return ""


def _block_tokens(block: Mapping[str, Any]) -> int:
    kind = block.get("type")
    if kind == "text":
        return count_tokens(str(block.get("text", "")))
    if kind == "tool_use":
        return (
            4
            + count_tokens(str(block.get("name", "")))
            + count_tokens(json.dumps(block.get("input", {})))
        )
    if kind == "tool_result":
        return 4 + count_tokens(_text(block.get("content", "")))
    if kind in ("image", "document"):
        return 1600
    return count_tokens(json.dumps(block, sort_keys=True))


@dataclass(slots=True, kw_only=True)
class _Parsed:
    model: str
    max_tokens: int
    blocks: list[Block]
    openai_messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_choice: Any
    stream: bool


def _as_blocks(content: Any, what: str) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list) and all(isinstance(b, Mapping) for b in content):
        return content
    raise RequestError(f"{what}: content must be a string or a list of content blocks")


def _canonical(block: Mapping[str, Any]) -> dict[str, Any]:
    """A message block as the cache compares it.

    No `cache_control`, and a tool result's string content as the text block it
    stands for (a breakpoint turns the string into a block list in one turn, the
    next turn sends the string again).
    """
    out = strip_cache_control(block)
    content = out.get("content")
    if out.get("type") == "tool_result":
        if isinstance(content, str):
            out["content"] = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            out["content"] = [
                strip_cache_control(b) if isinstance(b, Mapping) else b for b in content
            ]
    return out


def _ttl(block: Mapping[str, Any]) -> str | None:
    cc = block.get("cache_control")
    if cc is None:
        return None
    if not isinstance(cc, Mapping) or cc.get("type") != "ephemeral":
        raise RequestError("cache_control.type must be 'ephemeral'")
    return str(cc.get("ttl", "5m"))


def parse(body: Mapping[str, Any]) -> _Parsed:
    """Check a Messages API body and lay it out as cache blocks (tools, system, messages).

    Raises:
        RequestError: A field is missing or malformed.
    """
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("model: Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise RequestError("max_tokens: Field required (an integer >= 1)")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: Field required (a non-empty list)")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise RequestError("tools: must be a list")
    parts: list[Any] = []
    tokens: list[int] = []
    ttls: list[str | None] = []
    for tool in tools:
        if not isinstance(tool, Mapping) or not tool.get("name"):
            raise RequestError("tools: each tool needs a name")
        stripped = strip_cache_control(tool)
        parts.append({"tool": stripped})
        tokens.append(count_tokens(json.dumps(stripped, sort_keys=True)))
        ttls.append(_ttl(tool))
    system = body.get("system")
    if system is not None:
        for block in _as_blocks(system, "system"):
            parts.append({"system": strip_cache_control(block)})
            tokens.append(_block_tokens(block))
            ttls.append(_ttl(block))
    oai: list[dict[str, Any]] = []
    if system is not None:
        oai.append({"role": "system", "content": _text(system)})
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
            raise RequestError(f"messages.{i}.role: must be 'user' or 'assistant'")
        role = message["role"]
        blocks = _as_blocks(message.get("content"), f"messages.{i}")
        for k, block in enumerate(blocks):
            parts.append({"role": role, "first": k == 0, "block": _canonical(block)})
            tokens.append(_block_tokens(block))
            ttls.append(_ttl(block))
        oai.extend(_to_openai(role, blocks))
    top = body.get("cache_control")
    if top is not None and parts:
        # Automatic caching: a top-level cache_control marks the last block.
        last = len(ttls) - 1
        if ttls[last] is None:
            ttls[last] = _ttl({"cache_control": top})
    digests = chain_digests(model, parts)
    blocks_out = [
        Block(tokens=n, digest=d, ttl=t) for n, d, t in zip(tokens, digests, ttls, strict=True)
    ]
    fns = [
        {"name": t["name"], "parameters": t.get("input_schema") or {"type": "object"}}
        for t in tools
        if "input_schema" in t or "type" not in t or t.get("type") == "custom"
    ]
    return _Parsed(
        model=model,
        max_tokens=max_tokens,
        blocks=blocks_out,
        openai_messages=oai,
        tools=fns,
        tool_choice=_tool_choice(body.get("tool_choice"), bool(fns)),
        stream=bool(body.get("stream")),
    )


def _to_openai(role: str, blocks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The scenario reads OpenAI-format turns: tool results as `tool` messages."""
    if role == "assistant":
        calls = [
            {
                "id": b.get("id"),
                "type": "function",
                "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input", {}))},
            }
            for b in blocks
            if b.get("type") == "tool_use"
        ]
        out: dict[str, Any] = {"role": "assistant", "content": _text(list(blocks))}
        if calls:
            out["tool_calls"] = calls
        return [out]
    msgs: list[dict[str, Any]] = [
        {
            "role": "tool",
            "tool_call_id": b.get("tool_use_id"),
            "content": _text(b.get("content", "")),
        }
        for b in blocks
        if b.get("type") == "tool_result"
    ]
    text = _text([b for b in blocks if b.get("type") == "text"])
    if text or not msgs:
        msgs.append({"role": "user", "content": text})
    return msgs


def _tool_choice(choice: Any, has_tools: bool) -> Any:
    if not has_tools:
        return "none"
    if not isinstance(choice, Mapping):
        return "auto"
    kind = choice.get("type")
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return "none" if kind == "none" else "auto"


def content_blocks(plan: Plan) -> list[dict[str, Any]]:
    """The scenario's answer as Messages content blocks (text, then tool uses)."""
    out: list[dict[str, Any]] = []
    if plan.content:
        out.append({"type": "text", "text": plan.content})
    out.extend(
        {
            "type": "tool_use",
            "id": "toolu_" + uuid.uuid4().hex[:24],
            "name": call.name,
            "input": json.loads(call.arguments or "{}"),
        }
        for call in plan.tool_calls
    )
    return out


def _block_events(block: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A content block's `content_block_start` payload and its deltas."""
    if block["type"] == "text":
        text = str(block["text"])
        step = max(1, len(text) // 8)
        return {"type": "text", "text": ""}, [
            {"type": "text_delta", "text": text[i : i + step]} for i in range(0, len(text), step)
        ]
    raw = json.dumps(block["input"])
    step = max(1, len(raw) // 4)
    return {**block, "input": {}}, [
        {"type": "input_json_delta", "partial_json": raw[i : i + step]}
        for i in range(0, len(raw), step)
    ]


def _sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


@dataclass(slots=True, kw_only=True)
class AnthropicFlavor:
    """The prompt cache, the latency model and the routes of the Anthropic flavour."""

    serving: Serving
    latency: HostedLatency = field(default_factory=HostedLatency)
    cache: PromptCache = field(default_factory=PromptCache)
    stats: HostedStats = field(default_factory=HostedStats)
    _t0: float = field(default_factory=time.monotonic)

    def now(self) -> float:
        """Emulated seconds since start (wall seconds x `time_scale`)."""
        return (time.monotonic() - self._t0) * self.serving.config.time_scale

    async def sleep(self, emulated_s: float) -> None:
        """Wait `emulated_s` emulated seconds."""
        if emulated_s > 0:
            await asyncio.sleep(emulated_s / self.serving.config.time_scale)

    def prepare(
        self, request: HTTPRequest, body: Mapping[str, Any], messages_body: Mapping[str, Any]
    ) -> tuple[_Parsed, Plan, CachePlan]:
        """Parse a Messages body and plan its answer and its cache reads and writes.

        `body` is the request as sent (its `emulator` options and fault apply);
        `messages_body` is it as a Messages body (the same, or Bedrock's
        translated). The answer is the scenario's, fitted to `max_tokens`.

        Raises:
            RequestError: a malformed body, or an injected fault.
            CacheRuleError: a request the cache rules refuse (a 400).
        """
        parsed = parse(messages_body)
        opts = self.serving.options(request, body)
        self.serving.raise_fault(opts)
        plan = plan_chat(
            parsed.openai_messages,
            tools=parsed.tools,
            tool_choice=parsed.tool_choice,
            response_format=None,
            options=opts.scenario,
        )
        plan = self.serving.fit_length(plan, {}, parsed.max_tokens, seed=len(parsed.blocks))
        return parsed, plan, self.cache.plan(parsed.blocks, now=self.now(), model=parsed.model)

    async def messages(self, request: HTTPRequest) -> Response:
        """`POST /v1/messages` (JSON, or SSE with `stream: true`)."""
        try:
            body = await self.serving.body(request)
            parsed, plan, cached = self.prepare(request, body, body)
            headers = {"request-id": "req_" + uuid.uuid4().hex[:24]}
            # Cache reads do not count towards the input-tokens-per-minute limit
            # (docs.claude.com/en/api/rate-limits: "cache-aware ITPM").
            admission = self.serving.admit(
                {"max_tokens": parsed.max_tokens},
                cached.input_tokens + cached.cache_creation_input_tokens,
                headers,
                style="anthropic",
            )
        except RequestError as exc:
            if exc.status == 429:
                return JSONResponse(
                    {"type": "error", "error": {"type": "rate_limit_error", "message": str(exc)}},
                    status_code=429,
                    headers=exc.headers,
                )
            return _error(str(exc), exc.status)
        except CacheRuleError as exc:
            return _error(str(exc))
        msg_id = "msg_" + uuid.uuid4().hex[:24]
        if parsed.stream:
            return StreamingResponse(
                self._stream(msg_id, parsed, plan, cached, admission),
                media_type="text/event-stream",
                headers=headers,
            )
        await self.answer(cached, plan, admission)
        return JSONResponse(self._message(msg_id, parsed, plan, cached), headers=headers)

    async def answer(self, cached: CachePlan, plan: Plan, admission: Admission | None) -> None:
        """Wait out a whole (non-streamed) answer and count it.

        The first token's delay, then the cache entry becomes readable (the
        page: only once the response has begun), then the output; the rate
        limits are settled whatever happens.
        """
        try:
            await self.sleep(self.latency.first_token_s(cached))
            self.cache.commit(cached, now=self.now())
            await self.sleep(plan.num_tokens / self.latency.output_tps)
        finally:
            self.serving.settle(admission, plan.num_tokens)
        self.stats.add(cached, plan.num_tokens)

    def _message(
        self, msg_id: str, parsed: _Parsed, plan: Plan, cached: CachePlan
    ) -> dict[str, Any]:
        return {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": parsed.model,
            "content": content_blocks(plan),
            "stop_reason": _STOP.get(plan.finish_reason, "end_turn"),
            "stop_sequence": None,
            "usage": cached.usage(plan.num_tokens),
        }

    async def _stream(
        self,
        msg_id: str,
        parsed: _Parsed,
        plan: Plan,
        cached: CachePlan,
        admission: Admission | None,
    ) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream_events(msg_id, parsed, plan, cached):
                yield chunk
        finally:
            self.serving.settle(admission, plan.num_tokens)

    async def _stream_events(
        self, msg_id: str, parsed: _Parsed, plan: Plan, cached: CachePlan
    ) -> AsyncIterator[bytes]:
        await self.sleep(self.latency.first_token_s(cached))
        self.cache.commit(cached, now=self.now())
        start = self._message(msg_id, parsed, plan, cached)
        start.update(content=[], stop_reason=None, usage=cached.usage(1))
        yield _sse("message_start", {"type": "message_start", "message": start})
        content = content_blocks(plan)
        events = [_block_events(block) for block in content]
        n_deltas = sum(len(deltas) for _, deltas in events)
        pace = plan.num_tokens / self.latency.output_tps / max(1, n_deltas)
        for index, (opening, deltas) in enumerate(events):
            yield _sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            )
            for delta in deltas:
                await self.sleep(pace)
                yield _sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
        self.stats.add(cached, plan.num_tokens)
        stop = {"stop_reason": _STOP.get(plan.finish_reason, "end_turn"), "stop_sequence": None}
        usage = cached.usage(plan.num_tokens)
        yield _sse("message_delta", {"type": "message_delta", "delta": stop, "usage": usage})
        yield _sse("message_stop", {"type": "message_stop"})

    async def count_tokens(self, request: HTTPRequest) -> Response:
        """`POST /v1/messages/count_tokens`: the prompt's tokens, nothing run."""
        try:
            body = dict(await self.serving.body(request))
            body.setdefault("max_tokens", 1)
            parsed = parse(body)
        except RequestError as exc:
            return _error(str(exc), exc.status)
        return JSONResponse({"input_tokens": sum(b.tokens for b in parsed.blocks)})

    async def hosted_stats(self, request: HTTPRequest) -> Response:
        """`GET /emulator/hosted`: the flavour's token totals and cache size."""
        data = {k: getattr(self.stats, k) for k in HostedStats.__dataclass_fields__}
        data["cache_entries"] = len(self.cache)
        return JSONResponse(data)

    def reset(self) -> None:
        """Empty the cache and zero the totals (`POST /emulator/reset`)."""
        self.cache.clear()
        self.stats = HostedStats()


def routes(flavor: AnthropicFlavor) -> list[Route]:
    """The Anthropic flavour's routes."""
    return [
        Route("/v1/messages", flavor.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", flavor.count_tokens, methods=["POST"]),
        Route("/emulator/hosted", flavor.hosted_stats, methods=["GET"]),
    ]
