"""vLLM's OpenAI-compatible routes: chat (JSON and SSE), batch chat, completions."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from langgraph_batch.emulator._http import (
    DropConnection,
    RequestError,
    RequestOptions,
    Watch,
    salt_of,
    structured_of,
)
from langgraph_batch.emulator._openai_cache import CachedPrompt
from langgraph_batch.emulator._ratelimit import Admission
from langgraph_batch.emulator._serving import Serving
from langgraph_batch.emulator.engine import Request
from langgraph_batch.emulator.protocol import (
    ChunkEncoder,
    chat_chunk,
    logprobs_json,
    now_s,
    sse,
    usage_dict,
)
from langgraph_batch.emulator.scenarios import Plan, ToolCallPlan, plan_chat
from langgraph_batch.emulator.tokenizer import split_pieces, tokenize, tokenize_chat

__all__ = ("chat", "chat_batch", "completions")


async def chat(server: Serving, request: HTTPRequest) -> Response:
    """`POST /v1/chat/completions` (JSON or SSE)."""
    try:
        body = await server.body(request)
        server.check_model(body)
        messages = server.messages(body)
        opts = server.options(request, body)
        server.raise_fault(opts)
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise RequestError("'tools' must be a list of tool objects.")
        tool_choice = body.get("tool_choice", "auto" if tools else "none")
        if tools and tool_choice == "auto" and not server.config.enable_auto_tool_choice:
            raise RequestError(
                '"auto" tool choice requires --enable-auto-tool-choice and '
                "--tool-call-parser to be set"
            )
        if body.get("n", 1) != 1:
            raise RequestError("The emulator supports only n=1.")
        top = _top_logprobs(body)
        prompt_ids = tokenize_chat(messages, tools=tools)
        max_tokens = server.max_tokens(body, len(prompt_ids), default=None)
        hosted = _hosted_lookup(server, body, prompt_ids)
        sopts = opts.scenario
        if sopts.scenario == "echo" and not opts.explicit_output and "max_tokens" in body:
            sopts = replace(sopts, output_tokens=max_tokens)
        plan = plan_chat(
            messages,
            tools=tools,
            tool_choice=tool_choice,
            response_format=body.get("response_format") or structured_of(body),
            options=sopts,
        )
        plan = server.fit_length(plan, body, max_tokens, seed=len(messages))
        if opts.fault == "bad_tool_args" and plan.tool_calls:
            plan = _corrupt_args(plan)
        rid = server.request_id(request, body)
        headers = {"X-Request-Id": rid}
        admission = server.admit(body, len(prompt_ids), headers)
        req = server.new_request(
            rid,
            prompt_ids,
            plan,
            priority=server.priority(request, body),
            salt=salt_of(body),
        )
    except RequestError as exc:
        return exc.response()
    chat_id = f"chatcmpl-{rid}"
    if body.get("stream"):
        stream_opts = body.get("stream_options") or {}
        include_usage = bool(stream_opts.get("include_usage"))
        return StreamingResponse(
            _settled(
                _stream_chat(
                    server,
                    chat_id,
                    req,
                    plan,
                    opts,
                    include_usage=include_usage,
                    top_logprobs=top,
                    hosted=hosted,
                ),
                server,
                admission,
                req,
            ),
            media_type="text/event-stream",
            headers=headers,
        )
    try:
        done = await server.run_to_end([req], request, opts)
    finally:
        server.settle(admission, req.num_output)
    if not done:
        return Response(status_code=499)
    _hosted_commit(server, hosted)
    payload = _chat_json(server, chat_id, req, plan, hosted)
    if top is not None:
        payload["choices"][0]["logprobs"] = logprobs_json(plan.pieces, top)
    if opts.fault == "drop":
        return _DroppingResponse(json.dumps(payload).encode(), headers=headers)
    if opts.fault == "truncate":
        raw = json.dumps(payload).encode()
        return Response(raw[: len(raw) // 2], media_type="application/json", headers=headers)
    return JSONResponse(payload, headers=headers)


async def _settled(
    frames: AsyncIterator[bytes], server: Serving, admission: Admission | None, req: Request
) -> AsyncIterator[bytes]:
    """A stream that settles its rate-limit charge when it ends, however it ends."""
    try:
        async for frame in frames:
            yield frame
    finally:
        server.settle(admission, req.num_output)


def _top_logprobs(body: Mapping[str, Any]) -> int | None:
    """None without `logprobs`; else how many `top_logprobs` per token (vLLM's checks)."""
    top = body.get("top_logprobs")
    if not body.get("logprobs"):
        if top:
            raise RequestError("when using `top_logprobs`, `logprobs` must be set to true.")
        return None
    if top is None:
        return 0
    if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20:
        raise RequestError("`top_logprobs` must be an integer between 0 and 20.")
    return top


def _hosted_lookup(
    server: Serving, body: Mapping[str, Any], prompt_ids: list[int]
) -> CachedPrompt | None:
    """OpenAI's cache rules for this prompt (`hosted="openai"`), else None (the engine's)."""
    cache = server.openai_cache
    if cache is None:
        return None
    key = body.get("prompt_cache_key")
    retention = body.get("prompt_cache_retention")
    if key is not None and not isinstance(key, str):
        raise RequestError("'prompt_cache_key' must be a string.", param="prompt_cache_key")
    try:
        return cache.lookup(
            prompt_ids,
            key=key,
            retention=retention,
            now=time.monotonic() * server.config.time_scale,
        )
    except ValueError as exc:
        raise RequestError(str(exc), param="prompt_cache_retention") from None


def _hosted_commit(server: Serving, hosted: CachedPrompt | None) -> None:
    if hosted is not None and server.openai_cache is not None:
        server.openai_cache.commit(hosted, now=time.monotonic() * server.config.time_scale)


def _usage(server: Serving, req: Request, hosted: CachedPrompt | None = None) -> dict[str, Any]:
    return usage_dict(
        req.prompt_len,
        req.num_output,
        req.cached_tokens if hosted is None else hosted.cached_tokens,
        details=server.config.prompt_tokens_details or hosted is not None,
    )


def _chat_json(
    server: Serving, chat_id: str, req: Request, plan: Plan, hosted: CachedPrompt | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": plan.content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [_tool_call_json(c) for c in plan.tool_calls],
        "reasoning_content": None,
    }
    return {
        "id": chat_id,
        "object": "chat.completion",
        "created": now_s(),
        "model": server.config.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": plan.finish_reason,
                "stop_reason": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": _usage(server, req, hosted),
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


async def _stream_chat(
    server: Serving,
    chat_id: str,
    req: Request,
    plan: Plan,
    opts: RequestOptions,
    *,
    include_usage: bool,
    top_logprobs: int | None = None,
    hosted: CachedPrompt | None = None,
) -> AsyncIterator[bytes]:
    model = server.config.model
    created = now_s()
    watch = Watch()
    req.listener = watch
    await server.delay_first(opts)
    server.driver.submit(req)
    pieces = plan.pieces
    offsets = [0]
    for p in pieces:
        offsets.append(offsets[-1] + len(p))
    text = plan.text
    call = plan.tool_calls[0] if plan.tool_calls else None
    name_end = args_start = args_end = 0
    # Text before a tool call (an agent's reasoning) streams as content, as vLLM's
    # tool parsers send what precedes `<tool_call>`.
    content_end = len(plan.content or "") if call is not None else 0
    if call is not None:
        name_end = text.index(f'"name": "{call.name}"') + len(call.name) + 10
        args_start = text.index('"arguments": ', name_end) + len('"arguments": ')
        args_end = args_start + len(call.arguments)
    sent = 0
    sent_text = 0
    name_sent = False
    args_sent = args_start
    cut_at = max(1, len(pieces) // 2) if opts.fault in ("drop", "truncate") else None
    enc = ChunkEncoder(chat_id, model, created)
    try:
        while True:
            # The engine thread commits tokens while this loop runs. Arm the
            # wake-up before reading, so news during a write is not lost, and
            # read `finished` before `num_output`: the thread counts the last
            # token and then finishes, so a finished request's count is final.
            woken = watch.arm()
            done = req.finished
            # Every event vLLM would send for the tokens that arrived since
            # the last wake-up, written in one go (same events, fewer writes).
            frames: list[bytes] = []
            k = min(req.num_output, len(pieces))
            if k > sent or (req.num_output and sent == 0 and not pieces):
                if sent == 0:
                    frames.append(enc.delta({"role": "assistant", "content": ""}))
                pos = offsets[k]
                if call is None:
                    delta_text = text[offsets[sent] : pos]
                    if delta_text and top_logprobs is not None:
                        lp = logprobs_json(pieces[sent:k], top_logprobs)
                        delta = {"content": delta_text}
                        frames.append(sse(chat_chunk(chat_id, model, created, delta, logprobs=lp)))
                    elif delta_text:
                        frames.append(enc.content(delta_text))
                else:
                    if sent_text < content_end:
                        upto_text = min(pos, content_end)
                        if upto_text > sent_text:
                            frames.append(enc.content(text[sent_text:upto_text]))
                            sent_text = upto_text
                    if not name_sent and pos >= name_end:
                        name_sent = True
                        first = {
                            "index": 0,
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": ""},
                        }
                        frames.append(enc.delta({"tool_calls": [first]}))
                    upto = min(pos, args_end)
                    if name_sent and upto > args_sent:
                        frag = {"index": 0, "function": {"arguments": text[args_sent:upto]}}
                        args_sent = upto
                        frames.append(enc.delta({"tool_calls": [frag]}))
                sent = k
                if cut_at is not None and sent >= cut_at:
                    yield b"".join(frames)
                    if opts.fault == "drop":
                        raise DropConnection
                    return  # truncated stream: no finish, no [DONE]
            if done:
                break
            if frames:
                yield b"".join(frames)
            await woken
        if req.status.value == "aborted":
            if frames:
                yield b"".join(frames)
            return
        frames.append(
            sse(chat_chunk(chat_id, model, created, {}, finish_reason=plan.finish_reason))
        )
        _hosted_commit(server, hosted)
        if include_usage:
            usage_chunk = {
                "id": chat_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": _usage(server, req, hosted),
            }
            frames.append(sse(usage_chunk))
        frames.append(b"data: [DONE]\n\n")
        yield b"".join(frames)
    finally:
        if not req.finished:
            server.driver.abort(req)


async def chat_batch(server: Serving, request: HTTPRequest) -> Response:
    """`POST /v1/chat/completions/batch`: several conversations, one choice each."""
    try:
        body = await server.body(request)
        server.check_model(body)
        convs = body.get("messages")
        if not isinstance(convs, list) or not convs or not all(isinstance(c, list) for c in convs):
            raise RequestError("'messages' must be a non-empty list of conversations.")
        if body.get("stream"):
            raise RequestError("The batch endpoint does not support streaming.")
        if body.get("tools"):
            raise RequestError("The batch endpoint does not support tools.")
        opts = server.options(request, body)
        server.raise_fault(opts)
        rid = server.request_id(request, body)
        planned: list[tuple[list[int], Plan]] = []
        for i, conv in enumerate(convs):
            messages = server.messages({"messages": conv})
            prompt_ids = tokenize_chat(messages)
            max_tokens = server.max_tokens(body, len(prompt_ids), default=None)
            plan = server.fit_length(
                plan_chat(
                    messages,
                    tools=None,
                    tool_choice="none",
                    response_format=body.get("response_format") or structured_of(body),
                    options=opts.scenario,
                ),
                body,
                max_tokens,
                seed=i,
            )
            planned.append((prompt_ids, plan))
        reqs, admission, headers = _group(server, request, body, rid, planned)
    except RequestError as exc:
        return exc.response()
    if not await _run_group(server, request, opts, reqs, admission):
        return Response(status_code=499)
    plans = [plan for _, plan in planned]
    choices = []
    for i, (req, plan) in enumerate(zip(reqs, plans, strict=True)):
        one = _chat_json(server, f"chatcmpl-{rid}", req, plan)["choices"][0]
        one["index"] = i
        choices.append(one)
    prompt = sum(r.prompt_len for r in reqs)
    completion = sum(r.num_output for r in reqs)
    return JSONResponse(
        {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion",
            "created": now_s(),
            "model": server.config.model,
            "choices": choices,
            "usage": usage_dict(
                prompt,
                completion,
                sum(r.cached_tokens or 0 for r in reqs),
                details=server.config.prompt_tokens_details,
            ),
        },
        headers=headers,
    )


async def completions(server: Serving, request: HTTPRequest) -> Response:
    """`POST /v1/completions`: a prompt or a list of prompts, one engine request each."""
    try:
        body = await server.body(request)
        server.check_model(body)
        prompts = _prompts(body.get("prompt"))
        if body.get("stream"):
            raise RequestError("The emulator does not stream /v1/completions; use chat.")
        opts = server.options(request, body)
        server.raise_fault(opts)
        rid = server.request_id(request, body)
        planned: list[tuple[list[int], Plan]] = []
        for prompt in prompts:
            if isinstance(prompt, str):
                text, ids = prompt, tokenize(prompt)
            else:
                text, ids = " ".join(map(str, prompt)), list(prompt)
            max_tokens = server.max_tokens(body, len(ids), default=16)
            plan = server.fit_length(server.text_plan(text, opts, max_tokens), body, max_tokens)
            planned.append((ids, plan))
        reqs, admission, headers = _group(server, request, body, rid, planned)
    except RequestError as exc:
        return exc.response()
    if not await _run_group(server, request, opts, reqs, admission):
        return Response(status_code=499)
    plans = [plan for _, plan in planned]
    choices = [
        {
            "index": i,
            "text": plan.text,
            "logprobs": None,
            "finish_reason": plan.finish_reason,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        for i, plan in enumerate(plans)
    ]
    prompt_tokens = sum(r.prompt_len for r in reqs)
    completion = sum(r.num_output for r in reqs)
    # vLLM quirk: cached_tokens comes from one prompt only (the last one).
    return JSONResponse(
        {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": now_s(),
            "model": server.config.model,
            "choices": choices,
            "usage": usage_dict(
                prompt_tokens,
                completion,
                reqs[-1].cached_tokens,
                details=server.config.prompt_tokens_details,
            ),
            "system_fingerprint": None,
            "service_tier": None,
            "kv_transfer_params": None,
        },
        headers=headers,
    )


def _group(
    server: Serving,
    request: HTTPRequest,
    body: Mapping[str, Any],
    rid: str,
    planned: Sequence[tuple[list[int], Plan]],
) -> tuple[list[Request], Admission | None, dict[str, str]]:
    """One engine request per prompt of a multi-prompt call, charged to the limits together.

    Raises:
        RequestError: a 429 from the rate limits.
    """
    reqs = [
        server.new_request(
            f"{rid}-{i}",
            ids,
            plan,
            priority=server.priority(request, body),
            salt=salt_of(body),
        )
        for i, (ids, plan) in enumerate(planned)
    ]
    headers = {"X-Request-Id": rid}
    admission = server.admit(body, sum(r.prompt_len for r in reqs), headers, requests=len(reqs))
    return reqs, admission, headers


async def _run_group(
    server: Serving,
    request: HTTPRequest,
    opts: RequestOptions,
    reqs: list[Request],
    admission: Admission | None,
) -> bool:
    """Run a group to its end; False when the client went away. Settles the limits."""
    try:
        return await server.run_to_end(reqs, request, opts)
    finally:
        server.settle(admission, sum(r.num_output for r in reqs))


def _prompts(raw: Any) -> list[str | list[int]]:
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw:
        if all(isinstance(p, str) for p in raw):
            if len(raw) > 1024:
                raise RequestError("At most 1024 prompts per request.")
            return list(raw)
        if all(isinstance(t, int) for t in raw):
            return [list(raw)]
        if all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in raw):
            return [list(p) for p in raw]
    raise RequestError(
        "'prompt' must be a string, a list of strings, a list of token ids or a list of "
        "token-id lists."
    )


def _tool_call_json(call: ToolCallPlan) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _corrupt_args(plan: Plan) -> Plan:
    calls = tuple(replace(c, arguments=c.arguments[:-1]) for c in plan.tool_calls)
    text = plan.text
    for old, new in zip(plan.tool_calls, calls, strict=True):
        text = text.replace(old.arguments, new.arguments, 1)
    return replace(plan, text=text, tool_calls=calls, pieces=tuple(split_pieces(text)))


class _DroppingResponse(Response):
    """Sends headers and half the body, then cuts the connection."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send(
            {
                "type": "http.response.body",
                "body": self.body[: len(self.body) // 2],
                "more_body": True,
            }
        )
        raise DropConnection
