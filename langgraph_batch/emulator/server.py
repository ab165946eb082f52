"""The HTTP surface: vLLM's OpenAI-compatible API (and SGLang's) over the engine.

A Starlette app. Each chat or completion request is rendered with the chat
template, tokenized, answered by the scenario (decided up front) and queued
as one engine request; the response (or SSE stream) follows the engine's
progress: one chunk per engine step that produced tokens for the request,
merging several tokens when the client reads slower than the engine steps,
as vLLM's output collector does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from langgraph_batch.emulator import sglang
from langgraph_batch.emulator.config import FAULTS, EmulatorConfig
from langgraph_batch.emulator.costs import get_profile
from langgraph_batch.emulator.driver import RealTimeDriver
from langgraph_batch.emulator.engine import Engine, Request
from langgraph_batch.emulator.metrics import render_metrics, stats_dict
from langgraph_batch.emulator.protocol import chat_chunk, error_response, now_s, sse, usage_dict
from langgraph_batch.emulator.scenarios import (
    Plan,
    ScenarioOptions,
    ToolCallPlan,
    plan_chat,
    plan_text,
    truncate,
)
from langgraph_batch.emulator.tokenizer import render_chat, tokenize

__all__ = ("EmulatorServer", "RequestError")

logger = logging.getLogger(__name__)

_OPTION_KEYS = {
    "scenario",
    "output_tokens",
    "turns",
    "fault",
    "slow_first_token_s",
    "retry_after_s",
}


class RequestError(Exception):
    """A request the server answers with a vLLM error response."""

    def __init__(self, message: str, *, status: int = 400, err_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.headers: dict[str, str] = {}

    def response(self) -> JSONResponse:
        """The error as vLLM's JSON."""
        return error_response(
            str(self), status=self.status, err_type=self.err_type, headers=self.headers or None
        )


class DropConnection(Exception):
    """Raised inside a response to cut the connection (fault injection)."""


class _Watch:
    """The listener the engine calls when a request makes progress."""

    __slots__ = ("fut", "only_finish")

    def __init__(self, *, only_finish: bool = False) -> None:
        self.fut: asyncio.Future[None] | None = None
        self.only_finish = only_finish

    def __call__(self, req: Request) -> None:
        fut = self.fut
        if fut is not None and not fut.done() and (not self.only_finish or req.finished):
            fut.set_result(None)

    def arm(self) -> asyncio.Future[None]:
        self.fut = asyncio.get_running_loop().create_future()
        return self.fut


class RequestOptions:
    """Scenario options plus the fault of one request."""

    __slots__ = ("explicit_output", "fault", "retry_after_s", "scenario", "slow_first_token_s")

    def __init__(
        self,
        scenario: ScenarioOptions,
        *,
        fault: str | None,
        slow_first_token_s: float,
        retry_after_s: float,
        explicit_output: bool,
    ) -> None:
        self.scenario = scenario
        self.fault = fault
        self.slow_first_token_s = slow_first_token_s
        self.retry_after_s = retry_after_s
        self.explicit_output = explicit_output


class EmulatorServer:
    """The engine, its real-time driver and the Starlette app around them.

    Args:
        config: Server options.
    """

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.profile = get_profile(config.profile)
        self.engine = Engine(
            profile=self.profile,
            kv_tokens=config.kv_tokens,
            max_num_seqs=config.max_num_seqs,
            max_batched_tokens=config.max_batched_tokens,
            scheduling_policy=config.scheduling_policy,
            enable_prefix_caching=config.enable_prefix_caching,
            flavor=config.flavor,
        )
        self.driver = RealTimeDriver(self.engine, time_scale=config.time_scale)
        self._fault_rng = random.Random(config.seed)
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/chat/completions/batch", self.chat_batch, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/emulator/stats", self.stats, methods=["GET"]),
            Route("/emulator/reset", self.reset, methods=["POST"]),
        ]
        if config.flavor == "sglang":
            routes += sglang.routes(self)
        self.app = Starlette(routes=routes, lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.driver.start()
        try:
            yield
        finally:
            await self.driver.aclose()

    # -- small endpoints -----------------------------------------------------

    async def health(self, request: HTTPRequest) -> Response:
        """200, or 503 once the engine loop died."""
        return Response(status_code=200 if self.driver.alive else 503)

    async def models(self, request: HTTPRequest) -> Response:
        """`/v1/models` with `max_model_len`."""
        cfg = self.config
        card = {
            "id": cfg.model,
            "object": "model",
            "created": now_s(),
            "owned_by": "sglang" if cfg.flavor == "sglang" else "vllm",
            "root": cfg.model,
            "parent": None,
            "max_model_len": cfg.max_model_len,
            "permission": [],
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def version(self, request: HTTPRequest) -> Response:
        """The vLLM version the emulator imitates."""
        return JSONResponse({"version": "0.33.0"})

    async def metrics(self, request: HTTPRequest) -> Response:
        """Prometheus text with vLLM's (or SGLang's) metric names."""
        return PlainTextResponse(
            render_metrics(self), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    async def stats(self, request: HTTPRequest) -> Response:
        """The engine counters as JSON."""
        return JSONResponse(stats_dict(self))

    async def reset(self, request: HTTPRequest) -> Response:
        """Zero the counters and clear the prefix cache."""
        self.engine.reset_counters()
        self.engine.reset_prefix_cache()
        self.driver.reset_lag()
        return JSONResponse({"ok": True})

    async def tokenize(self, request: HTTPRequest) -> Response:
        """`/tokenize`: `{prompt}` or `{messages[, tools]}` -> `{count, max_model_len, tokens}`."""
        try:
            body = await self._body(request)
            self._check_model(body)
            if "messages" in body:
                text = render_chat(
                    self._messages(body),
                    tools=body.get("tools"),
                    add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                )
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
            else:
                raise RequestError("tokenize needs 'prompt' (a string) or 'messages'")
        except RequestError as exc:
            return exc.response()
        ids = tokenize(text)
        return JSONResponse(
            {"count": len(ids), "max_model_len": self.config.max_model_len, "tokens": ids}
        )

    # -- parsing -------------------------------------------------------------

    async def _body(self, request: HTTPRequest) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(f"Invalid JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError("The request body must be a JSON object.")
        return body

    def _check_model(self, body: Mapping[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.config.model:
            raise RequestError(
                f"The model `{model}` does not exist.", status=404, err_type="NotFoundError"
            )

    @staticmethod
    def _messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise RequestError("'messages' must be a non-empty list of message objects.")
        if not all(isinstance(m, Mapping) for m in msgs):
            raise RequestError("Each entry of 'messages' must be an object.")
        return msgs

    def options(self, request: HTTPRequest, body: Mapping[str, Any]) -> RequestOptions:
        """Merge server defaults, the `X-Emulator-Options` header and body `emulator`."""
        cfg = self.config
        merged: dict[str, Any] = {}
        header = request.headers.get("x-emulator-options")
        if header:
            try:
                parsed = json.loads(header)
            except json.JSONDecodeError:
                raise RequestError("X-Emulator-Options must be a JSON object.") from None
            if not isinstance(parsed, dict):
                raise RequestError("X-Emulator-Options must be a JSON object.")
            merged.update(parsed)
        extra = body.get("emulator")
        if extra is not None:
            if not isinstance(extra, dict):
                raise RequestError("'emulator' must be an object.")
            merged.update(extra)
        unknown = sorted(set(merged) - _OPTION_KEYS)
        if unknown:
            raise RequestError(f"unknown emulator options {unknown}; known: {sorted(_OPTION_KEYS)}")
        fault = merged.get("fault")
        if fault is not None and str(fault) not in FAULTS:
            raise RequestError(f"unknown fault {fault!r}; choose from {', '.join(FAULTS)}")
        if fault is None and cfg.fault_rate > 0 and self._fault_rng.random() < cfg.fault_rate:
            fault = self._fault_rng.choice(cfg.faults)
        try:
            scenario = ScenarioOptions(
                scenario=str(merged.get("scenario", cfg.scenario)),
                output_tokens=int(merged.get("output_tokens", cfg.output_tokens)),
                turns=int(merged.get("turns", cfg.turns)),
                seed=cfg.seed,
            )
            slow = float(merged.get("slow_first_token_s", cfg.slow_first_token_s))
            retry = float(merged.get("retry_after_s", cfg.retry_after_s))
        except (TypeError, ValueError) as exc:
            raise RequestError(f"bad emulator option: {exc}") from None
        if scenario.scenario not in ("agent", "echo"):
            raise RequestError(f"unknown scenario {scenario.scenario!r}; use 'agent' or 'echo'")
        return RequestOptions(
            scenario,
            fault=None if fault is None else str(fault),
            slow_first_token_s=slow,
            retry_after_s=retry,
            explicit_output="output_tokens" in merged,
        )

    @staticmethod
    def raise_fault(opts: RequestOptions) -> None:
        """Answer with an injected HTTP error when the request's fault says so."""
        if opts.fault == "429":
            err = RequestError("Rate limit exceeded (injected by the emulator).", status=429)
            err.headers["Retry-After"] = f"{opts.retry_after_s:g}"
            raise err
        if opts.fault in ("500", "503"):
            status = int(opts.fault)
            raise RequestError(f"Injected HTTP {status} from the emulator.", status=status)

    def request_id(self, request: HTTPRequest, body: Mapping[str, Any]) -> str:
        """VLLM's base request id: X-Request-Id, else body `request_id`, else random."""
        rid = request.headers.get("x-request-id") or body.get("request_id")
        return str(rid) if rid else uuid.uuid4().hex

    def priority(self, request: HTTPRequest, body: Mapping[str, Any]) -> int:
        """The engine priority (lower first), 0 unless the priority policy is on."""
        raw = request.headers.get("x-vllm-priority", body.get("priority", 0))
        try:
            value = int(raw or 0)
        except (TypeError, ValueError):
            raise RequestError(f"'priority' must be an integer, got {raw!r}") from None
        if self.config.scheduling_policy != "priority":
            return 0
        # SGLang: a higher value runs earlier; the engine runs lower first.
        return -value if self.config.flavor == "sglang" else value

    def max_tokens(self, body: Mapping[str, Any], prompt_len: int, *, default: int | None) -> int:
        """Validated max_tokens against max_model_len (vLLM's messages)."""
        mml = self.config.max_model_len
        if prompt_len >= mml:
            raise RequestError(
                f"This model's maximum context length is {mml} tokens. However, your request "
                f"has {prompt_len} input tokens. Please reduce the length of the input messages."
            )
        raw = body.get("max_completion_tokens", body.get("max_tokens"))
        if raw is None:
            return default if default is not None else mml - prompt_len
        if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
            raise RequestError(f"max_tokens must be at least 1, got {raw!r}.")
        if prompt_len + raw > mml:
            raise RequestError(
                f"'max_tokens' or 'max_completion_tokens' is too large: {raw}. This model's "
                f"maximum context length is {mml} tokens and your request has {prompt_len} "
                f"input tokens ({raw} > {mml} - {prompt_len})."
            )
        return raw

    # -- running requests ----------------------------------------------------

    def new_request(
        self, rid: str, prompt_ids: list[int], plan: Plan, *, priority: int, salt: str | None
    ) -> Request:
        """An engine request generating `plan`'s tokens."""
        out_ids = tokenize(plan.text) if plan.pieces else []
        return Request(
            request_id=rid,
            prompt_ids=prompt_ids,
            output_ids=out_ids,
            priority=priority,
            cache_salt=salt,
        )

    async def _delay_first(self, opts: RequestOptions) -> None:
        if opts.fault == "slow_first_token" and opts.slow_first_token_s > 0:
            await asyncio.sleep(opts.slow_first_token_s / self.config.time_scale)

    async def run_to_end(
        self, reqs: list[Request], http: HTTPRequest, opts: RequestOptions
    ) -> bool:
        """Submit requests and wait until all finished; False if the client left."""
        await self._delay_first(opts)
        watches = []
        for r in reqs:
            w = _Watch(only_finish=True)
            r.listener = w
            watches.append(w)
            self.driver.submit(r)
        gone = asyncio.ensure_future(_disconnected(http))
        try:
            for r, w in zip(reqs, watches, strict=True):
                while not r.finished:
                    fut = w.arm()
                    await asyncio.wait({fut, gone}, return_when=asyncio.FIRST_COMPLETED)
                    if gone.done():
                        return False
            return True
        finally:
            gone.cancel()
            for r in reqs:
                if not r.finished:
                    self.driver.abort(r)

    # -- chat ----------------------------------------------------------------

    async def chat(self, request: HTTPRequest) -> Response:
        """`POST /v1/chat/completions` (JSON or SSE)."""
        try:
            body = await self._body(request)
            self._check_model(body)
            messages = self._messages(body)
            opts = self.options(request, body)
            self.raise_fault(opts)
            tools = body.get("tools") or None
            if tools is not None and not isinstance(tools, list):
                raise RequestError("'tools' must be a list of tool objects.")
            tool_choice = body.get("tool_choice", "auto" if tools else "none")
            if tools and tool_choice == "auto" and not self.config.enable_auto_tool_choice:
                raise RequestError(
                    '"auto" tool choice requires --enable-auto-tool-choice and '
                    "--tool-call-parser to be set"
                )
            if body.get("n", 1) != 1:
                raise RequestError("The emulator supports only n=1.")
            prompt_ids = tokenize(render_chat(messages, tools=tools))
            max_tokens = self.max_tokens(body, len(prompt_ids), default=None)
            sopts = opts.scenario
            if sopts.scenario == "echo" and not opts.explicit_output and "max_tokens" in body:
                sopts = replace(sopts, output_tokens=max_tokens)
            plan = plan_chat(
                messages,
                tools=tools,
                tool_choice=tool_choice,
                response_format=body.get("response_format") or _structured(body),
                options=sopts,
            )
            plan = truncate(plan, max_tokens)
            if opts.fault == "bad_tool_args" and plan.tool_calls:
                plan = _corrupt_args(plan)
            rid = self.request_id(request, body)
            req = self.new_request(
                rid,
                prompt_ids,
                plan,
                priority=self.priority(request, body),
                salt=_salt(body),
            )
        except RequestError as exc:
            return exc.response()
        chat_id = f"chatcmpl-{rid}"
        headers = {"X-Request-Id": rid}
        if body.get("stream"):
            stream_opts = body.get("stream_options") or {}
            include_usage = bool(stream_opts.get("include_usage"))
            return StreamingResponse(
                self._stream_chat(chat_id, req, plan, opts, include_usage=include_usage),
                media_type="text/event-stream",
                headers=headers,
            )
        if not await self.run_to_end([req], request, opts):
            return Response(status_code=499)
        payload = self._chat_json(chat_id, req, plan)
        if opts.fault == "drop":
            return _DroppingResponse(json.dumps(payload).encode(), headers=headers)
        if opts.fault == "truncate":
            raw = json.dumps(payload).encode()
            return Response(raw[: len(raw) // 2], media_type="application/json", headers=headers)
        return JSONResponse(payload, headers=headers)

    def _usage(self, req: Request) -> dict[str, Any]:
        return usage_dict(
            req.prompt_len,
            req.num_output,
            req.cached_tokens,
            details=self.config.prompt_tokens_details,
        )

    def _chat_json(self, chat_id: str, req: Request, plan: Plan) -> dict[str, Any]:
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
            "model": self.config.model,
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
            "usage": self._usage(req),
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }

    async def _stream_chat(
        self, chat_id: str, req: Request, plan: Plan, opts: RequestOptions, *, include_usage: bool
    ) -> AsyncIterator[bytes]:
        model = self.config.model
        created = now_s()
        watch = _Watch()
        req.listener = watch
        await self._delay_first(opts)
        self.driver.submit(req)
        pieces = plan.pieces
        offsets = [0]
        for p in pieces:
            offsets.append(offsets[-1] + len(p))
        text = plan.text
        call = plan.tool_calls[0] if plan.tool_calls else None
        name_end = args_start = args_end = 0
        if call is not None:
            name_end = text.index(f'"name": "{call.name}"') + len(call.name) + 10
            args_start = text.index('"arguments": ', name_end) + len('"arguments": ')
            args_end = args_start + len(call.arguments)
        sent = 0
        name_sent = False
        args_sent = args_start
        cut_at = max(1, len(pieces) // 2) if opts.fault in ("drop", "truncate") else None
        try:
            while True:
                k = min(req.num_output, len(pieces))
                if k > sent or (req.num_output and sent == 0 and not pieces):
                    if sent == 0:
                        yield sse(
                            chat_chunk(
                                chat_id, model, created, {"role": "assistant", "content": ""}
                            )
                        )
                    pos = offsets[k]
                    if call is None:
                        delta_text = text[offsets[sent] : pos]
                        if delta_text:
                            yield sse(chat_chunk(chat_id, model, created, {"content": delta_text}))
                    else:
                        if not name_sent and pos >= name_end:
                            name_sent = True
                            first = {
                                "index": 0,
                                "id": call.id,
                                "type": "function",
                                "function": {"name": call.name, "arguments": ""},
                            }
                            yield sse(chat_chunk(chat_id, model, created, {"tool_calls": [first]}))
                        upto = min(pos, args_end)
                        if name_sent and upto > args_sent:
                            frag = {"index": 0, "function": {"arguments": text[args_sent:upto]}}
                            args_sent = upto
                            yield sse(chat_chunk(chat_id, model, created, {"tool_calls": [frag]}))
                    sent = k
                    if cut_at is not None and sent >= cut_at:
                        if opts.fault == "drop":
                            raise DropConnection
                        return  # truncated stream: no finish, no [DONE]
                if req.finished:
                    break
                await watch.arm()
            if req.status.value == "aborted":
                return
            yield sse(chat_chunk(chat_id, model, created, {}, finish_reason=plan.finish_reason))
            if include_usage:
                usage_chunk = {
                    "id": chat_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": self._usage(req),
                }
                yield sse(usage_chunk)
            yield sse("[DONE]")
        finally:
            if not req.finished:
                self.driver.abort(req)

    async def chat_batch(self, request: HTTPRequest) -> Response:
        """`POST /v1/chat/completions/batch`: several conversations, one choice each."""
        try:
            body = await self._body(request)
            self._check_model(body)
            convs = body.get("messages")
            if (
                not isinstance(convs, list)
                or not convs
                or not all(isinstance(c, list) for c in convs)
            ):
                raise RequestError("'messages' must be a non-empty list of conversations.")
            if body.get("stream"):
                raise RequestError("The batch endpoint does not support streaming.")
            if body.get("tools"):
                raise RequestError("The batch endpoint does not support tools.")
            opts = self.options(request, body)
            self.raise_fault(opts)
            rid = self.request_id(request, body)
            reqs: list[Request] = []
            plans: list[Plan] = []
            for i, conv in enumerate(convs):
                messages = self._messages({"messages": conv})
                prompt_ids = tokenize(render_chat(messages))
                max_tokens = self.max_tokens(body, len(prompt_ids), default=None)
                plan = truncate(
                    plan_chat(
                        messages,
                        tools=None,
                        tool_choice="none",
                        response_format=body.get("response_format") or _structured(body),
                        options=opts.scenario,
                    ),
                    max_tokens,
                )
                plans.append(plan)
                reqs.append(
                    self.new_request(
                        f"{rid}-{i}",
                        prompt_ids,
                        plan,
                        priority=self.priority(request, body),
                        salt=_salt(body),
                    )
                )
        except RequestError as exc:
            return exc.response()
        if not await self.run_to_end(reqs, request, opts):
            return Response(status_code=499)
        choices = []
        for i, (req, plan) in enumerate(zip(reqs, plans, strict=True)):
            one = self._chat_json(f"chatcmpl-{rid}", req, plan)["choices"][0]
            one["index"] = i
            choices.append(one)
        prompt = sum(r.prompt_len for r in reqs)
        completion = sum(r.num_output for r in reqs)
        return JSONResponse(
            {
                "id": f"chatcmpl-{rid}",
                "object": "chat.completion",
                "created": now_s(),
                "model": self.config.model,
                "choices": choices,
                "usage": usage_dict(
                    prompt,
                    completion,
                    sum(r.cached_tokens or 0 for r in reqs),
                    details=self.config.prompt_tokens_details,
                ),
            },
            headers={"X-Request-Id": rid},
        )

    # -- completions ---------------------------------------------------------

    async def completions(self, request: HTTPRequest) -> Response:
        """`POST /v1/completions`: a prompt or a list of prompts, one engine request each."""
        try:
            body = await self._body(request)
            self._check_model(body)
            prompts = _prompts(body.get("prompt"))
            if body.get("stream"):
                raise RequestError("The emulator does not stream /v1/completions; use chat.")
            opts = self.options(request, body)
            self.raise_fault(opts)
            rid = self.request_id(request, body)
            reqs: list[Request] = []
            plans: list[Plan] = []
            for i, prompt in enumerate(prompts):
                if isinstance(prompt, str):
                    text, ids = prompt, tokenize(prompt)
                else:
                    text, ids = " ".join(map(str, prompt)), list(prompt)
                max_tokens = self.max_tokens(body, len(ids), default=16)
                plan = self.text_plan(text, opts, max_tokens)
                plans.append(plan)
                reqs.append(
                    self.new_request(
                        f"{rid}-{i}",
                        ids,
                        plan,
                        priority=self.priority(request, body),
                        salt=_salt(body),
                    )
                )
        except RequestError as exc:
            return exc.response()
        if not await self.run_to_end(reqs, request, opts):
            return Response(status_code=499)
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
                "model": self.config.model,
                "choices": choices,
                "usage": usage_dict(
                    prompt_tokens,
                    completion,
                    reqs[-1].cached_tokens,
                    details=self.config.prompt_tokens_details,
                ),
                "system_fingerprint": None,
                "service_tier": None,
                "kv_transfer_params": None,
            },
            headers={"X-Request-Id": rid},
        )

    def text_plan(self, prompt: str, opts: RequestOptions, max_tokens: int) -> Plan:
        """A plain-completion plan: echo fills max_tokens; agent stops at output_tokens."""
        sopts = opts.scenario
        if sopts.scenario == "echo" and not opts.explicit_output:
            n = max_tokens
        else:
            n = min(sopts.output_tokens, max_tokens)
        plan = plan_text(prompt, options=sopts, max_tokens=n)
        if n >= max_tokens:
            plan = replace(plan, finish_reason="length")
        return plan


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


def _salt(body: Mapping[str, Any]) -> str | None:
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not 1 <= len(salt) <= 1024:
        raise RequestError("'cache_salt' must be a string of 1-1024 characters.")
    return salt


def _structured(body: Mapping[str, Any]) -> dict[str, Any] | None:
    so = body.get("structured_outputs")
    if isinstance(so, Mapping) and so.get("json") is not None:
        schema = so["json"]
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError:
                raise RequestError("structured_outputs.json is not valid JSON.") from None
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    return None


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
    from langgraph_batch.emulator.tokenizer import split_pieces

    return replace(plan, text=text, tool_calls=calls, pieces=tuple(split_pieces(text)))


async def _disconnected(http: HTTPRequest) -> None:
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return


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
