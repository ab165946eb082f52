"""The HTTP surface: vLLM's OpenAI-compatible API (and SGLang's) over the engine.

A Starlette app. Each chat or completion request is rendered with the chat
template, tokenized, answered by the scenario (decided up front) and queued
as one engine request; the response (or SSE stream) follows the engine's
progress: one chunk per engine step that produced tokens for the request,
merging several tokens when the client reads slower than the engine steps,
as vLLM's output collector does.

This module holds the app, the small endpoints and request parsing; the
OpenAI routes live in `_openai_api`, SGLang's in `sglang`, shared request
plumbing in `_http`. The engine steps in the driver's own thread
(`driver.RealTimeDriver`), so the work of this event loop delays admission
of new requests, never the steps of running ones.
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

from langgraph_batch._extras import missing_extra

try:
    from starlette.applications import Starlette
    from starlette.requests import Request as HTTPRequest
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route
except ImportError:  # the optional `emulator` extra
    raise missing_extra("emulator", "the emulator needs starlette and uvicorn") from None

from langgraph_batch.emulator import _openai_api, sglang
from langgraph_batch.emulator._hints import AgentHints
from langgraph_batch.emulator._http import RequestError, RequestOptions, Watch
from langgraph_batch.emulator.config import FAULTS, EmulatorConfig
from langgraph_batch.emulator.costs import get_profile
from langgraph_batch.emulator.driver import RealTimeDriver
from langgraph_batch.emulator.engine import Engine, Request
from langgraph_batch.emulator.metrics import (
    PHASE_FIELDS,
    render_metrics,
    request_phases,
    stats_dict,
)
from langgraph_batch.emulator.protocol import now_s
from langgraph_batch.emulator.scenarios import Plan, ScenarioOptions, fit_length, plan_text
from langgraph_batch.emulator.tokenizer import IM_END, piece_ids, render_chat, tokenize

__all__ = ("EMULATOR_HEADER", "EMULATOR_ID", "EmulatorServer", "RequestError")

logger = logging.getLogger(__name__)

EMULATOR_HEADER = "x-langgraph-batch-emulator"
"""Response header of `/version` saying the server is this emulator (never set by vLLM)."""
EMULATOR_ID = "langgraph-batch"
"""Its value, and the `emulator` field of the `/version` answer."""

_EOS_ID = tokenize(IM_END)[0]
"""The token a chat turn ends with: what `ignore_eos` padding generates."""

_OPTION_KEYS = {
    "scenario",
    "output_tokens",
    "turns",
    "fault",
    "slow_first_token_s",
    "retry_after_s",
}


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
        self.hints = AgentHints(accept=config.agentic_context)
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
            Route("/emulator/requests", self.requests, methods=["GET"]),
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
            "max_model_len": self.max_model_len,
            "permission": [],
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def version(self, request: HTTPRequest) -> Response:
        """The vLLM version the emulator imitates, and that it is the emulator.

        Clients that reach it by URL (`make demo BACKEND_URL=...`) label their
        output EMULATED from the `emulator` field or the header.
        """
        return JSONResponse(
            {"version": "0.33.0", "emulator": EMULATOR_ID},
            headers={EMULATOR_HEADER: EMULATOR_ID},
        )

    async def metrics(self, request: HTTPRequest) -> Response:
        """Prometheus text with vLLM's (or SGLang's) metric names."""
        return PlainTextResponse(
            render_metrics(self), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    async def stats(self, request: HTTPRequest) -> Response:
        """The engine counters as JSON."""
        return JSONResponse(stats_dict(self))

    async def requests(self, request: HTTPRequest) -> Response:
        """Server-side phases of the finished requests since the last reset (debug).

        `?since=<engine seconds>` keeps those that arrived at or after it. Each
        row: `[request_id, arrival, first_scheduled, first_token, finish,
        preemptions, prompt_tokens, cached_tokens, output_tokens]`, times in
        engine seconds (`engine_time_s` of `/emulator/stats` is the same clock).
        """
        try:
            since = float(request.query_params.get("since", "-inf"))
        except ValueError:
            return RequestError("'since' must be a number of engine seconds").response()
        rows = await self.driver.call(lambda: request_phases(self.engine, since))
        return JSONResponse({"fields": list(PHASE_FIELDS), "requests": rows})

    async def reset(self, request: HTTPRequest) -> Response:
        """Zero the counters and clear the prefix cache."""

        def reset() -> None:
            self.engine.reset_counters()
            self.engine.reset_prefix_cache()
            self.hints.reset()
            self.driver.reset_lag()

        await self.driver.call(reset)
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
        return JSONResponse({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids})

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
        """Merge server defaults, the `X-Emulator-Options` header and body `emulator`.

        The vLLM flavour also checks `vllm_xargs` as vLLM does (`_hints.py`).
        """
        cfg = self.config
        if cfg.flavor == "vllm":
            self.hints.check(body)
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
                repeat_tool_args=cfg.repeat_tool_args,
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

    @property
    def max_model_len(self) -> int:
        """The longest sequence served: `--max-model-len`, at most the KV cache's capacity.

        vLLM refuses to start when its KV cache cannot hold one sequence of
        `max_model_len` tokens; the emulator serves the longest one its cache
        holds instead, so that a prompt it could never schedule gets vLLM's
        context-length 400 rather than waiting forever.
        """
        return min(self.config.max_model_len, self.engine.kv_capacity_tokens)

    def max_tokens(self, body: Mapping[str, Any], prompt_len: int, *, default: int | None) -> int:
        """Validated max_tokens against max_model_len (vLLM's messages)."""
        mml = self.max_model_len
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

    def fit_length(
        self, plan: Plan, body: Mapping[str, Any], max_tokens: int, *, seed: object = ""
    ) -> Plan:
        """`plan` under the request's `max_tokens`, `ignore_eos` and `min_tokens` (as vLLM).

        Raises:
            RequestError: `ignore_eos` is not a boolean or `min_tokens` is out of range.
        """
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise RequestError(f"'ignore_eos' must be a boolean, got {ignore_eos!r}.")
        min_tokens = body.get("min_tokens", 0)
        if not isinstance(min_tokens, int) or isinstance(min_tokens, bool) or min_tokens < 0:
            raise RequestError(f"min_tokens must be >= 0, got {min_tokens!r}.")
        if min_tokens > max_tokens:
            raise RequestError(
                f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                f"got {min_tokens}."
            )
        return fit_length(
            plan, max_tokens=max_tokens, ignore_eos=ignore_eos, min_tokens=min_tokens, seed=seed
        )

    # -- running requests ----------------------------------------------------

    def new_request(
        self, rid: str, prompt_ids: list[int], plan: Plan, *, priority: int, salt: str | None
    ) -> Request:
        """An engine request generating `plan`'s tokens (hidden end-of-sequence ones included)."""
        out_ids = piece_ids(plan.pieces)
        if plan.hidden_tokens:
            out_ids += [_EOS_ID] * plan.hidden_tokens
        req = Request(
            request_id=rid,
            prompt_ids=prompt_ids,
            output_ids=out_ids,
            priority=priority,
            cache_salt=salt,
        )
        req.finish_reason = plan.finish_reason
        return req

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
            w = Watch(only_finish=True)
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

    # -- OpenAI routes (in _openai_api) ----------------------------------------

    async def chat(self, request: HTTPRequest) -> Response:
        """`POST /v1/chat/completions` (JSON or SSE)."""
        return await _openai_api.chat(self, request)

    async def chat_batch(self, request: HTTPRequest) -> Response:
        """`POST /v1/chat/completions/batch`: several conversations, one choice each."""
        return await _openai_api.chat_batch(self, request)

    async def completions(self, request: HTTPRequest) -> Response:
        """`POST /v1/completions`: a prompt or a list of prompts, one engine request each."""
        return await _openai_api.completions(self, request)

    def text_plan(self, prompt: str, opts: RequestOptions, max_tokens: int) -> Plan:
        """A plain-completion plan: echo fills max_tokens; agent stops at output_tokens."""
        sopts = opts.scenario
        if sopts.scenario == "echo" and not opts.explicit_output:
            n = max_tokens
        else:
            n = min(sopts.output_tokens, max_tokens)
        plan = plan_text(prompt, options=sopts, max_tokens=n)
        if plan.num_tokens >= max_tokens:
            plan = replace(plan, finish_reason="length")
        return plan


async def _disconnected(http: HTTPRequest) -> None:
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return
