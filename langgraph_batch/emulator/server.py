"""The HTTP surface: vLLM's OpenAI-compatible API (and SGLang's) over the engine.

A Starlette app. Each chat or completion request is rendered with the chat
template, tokenized, answered by the scenario (decided up front) and queued
as one engine request; the response (or SSE stream) follows the engine's
progress: one chunk per engine step that produced tokens for the request,
merging several tokens when the client reads slower than the engine steps,
as vLLM's output collector does.

This module holds the app and the small endpoints; the engine, its driver
and request parsing live in `_serving` (`Serving`, which every route
receives), the OpenAI routes in `_openai_api`, SGLang's in `sglang`, shared
request types in `_http`. The engine steps in the driver's own thread
(`driver.RealTimeDriver`), so the work of this event loop delays admission
of new requests, never the steps of running ones.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from langgraph_batch._extras import missing_extra

try:
    from starlette.applications import Starlette
    from starlette.requests import Request as HTTPRequest
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route
except ImportError:  # the optional `emulator` extra
    raise missing_extra("emulator", "the emulator needs starlette and uvicorn") from None

from langgraph_batch.emulator import _anthropic_api, _batch_api, _bedrock_api, _openai_api, sglang
from langgraph_batch.emulator._http import RequestError
from langgraph_batch.emulator._server_metrics import (
    PHASE_FIELDS,
    render_metrics,
    request_phases,
    stats_dict,
)
from langgraph_batch.emulator._serving import Serving
from langgraph_batch.emulator.config import EmulatorConfig
from langgraph_batch.emulator.protocol import now_s
from langgraph_batch.emulator.tokenizer import render_chat, tokenize

__all__ = ("EMULATOR_HEADER", "EMULATOR_ID", "EmulatorServer", "RequestError")

logger = logging.getLogger(__name__)

EMULATOR_HEADER = "x-langgraph-batch-emulator"
"""Response header of `/version` saying the server is this emulator (never set by vLLM)."""
EMULATOR_ID = "langgraph-batch"
"""Its value, and the `emulator` field of the `/version` answer."""


class EmulatorServer:
    """The engine, its real-time driver and the Starlette app around them.

    Args:
        config: Server options.
    """

    def __init__(self, config: EmulatorConfig) -> None:
        self.serving = Serving(config)
        """What every route receives: the engine, its driver and the request plumbing."""
        self.config = config
        self.profile = self.serving.profile
        self.engine = self.serving.engine
        self.driver = self.serving.driver
        self.hints = self.serving.hints
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
            routes += sglang.routes(self.serving)
        else:
            # vLLM's dev-mode routes (VLLM_SERVER_DEV_MODE=1): what a test needs
            # to queue requests before the first step and to empty the cache.
            routes += [
                Route("/pause", self.pause, methods=["POST"]),
                Route("/resume", self.resume, methods=["POST"]),
                Route("/is_paused", self.is_paused, methods=["GET"]),
                Route("/reset_prefix_cache", self.reset_prefix_cache, methods=["POST"]),
            ]
        # The providers' batch APIs (OpenAI Batch, Anthropic Message Batches); each item
        # runs through this app's chat route.
        self.batches = _batch_api.BatchAPI(self.serving, lambda: self.app)
        routes += self.batches.routes()
        self.anthropic: _anthropic_api.AnthropicFlavor | None = None
        """The hosted Anthropic flavour (`config.hosted == "anthropic"`), else None."""
        if config.hosted == "anthropic":
            self.anthropic = _anthropic_api.AnthropicFlavor(serving=self.serving)
            routes += _anthropic_api.routes(self.anthropic)
            # Bedrock's Converse API serves Claude with the same cache (`_bedrock_api`).
            routes += _bedrock_api.routes(self.anthropic)
        self.app = Starlette(routes=routes, lifespan=self._lifespan)

    @property
    def max_model_len(self) -> int:
        """The longest sequence served (`Serving.max_model_len`)."""
        return self.serving.max_model_len

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.driver.start()
        try:
            yield
        finally:
            await self.batches.aclose()
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
            render_metrics(self.serving), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    async def stats(self, request: HTTPRequest) -> Response:
        """The engine counters as JSON."""
        return JSONResponse(stats_dict(self.serving))

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
        """Zero the counters, clear the prefix caches and start a fresh rate-limit minute."""

        def reset() -> None:
            self.engine.reset_counters()
            self.engine.reset_prefix_cache()
            self.hints.reset()
            self.driver.reset_lag()
            if self.serving.openai_cache is not None:
                self.serving.openai_cache.clear()

        await self.driver.call(reset)
        if self.anthropic is not None:
            self.anthropic.reset()
        if self.serving.rate_limits is not None:
            self.serving.rate_limits.refill_all()
        return JSONResponse({"ok": True})

    async def pause(self, request: HTTPRequest) -> Response:
        """`POST /pause?mode=keep`: schedule nothing until `/resume`; requests queue up.

        Only vLLM's `keep` mode (`EngineCore.pause_scheduler`: `PAUSED_ALL`,
        requests frozen in their queues) is emulated; `abort` and `wait` are a 400.
        """
        mode = request.query_params.get("mode", "abort")
        if mode != "keep":
            return JSONResponse({"error": f"the emulator pauses with mode=keep only, not {mode!r}"},
                                status_code=400)  # fmt: skip

        def pause() -> None:
            self.engine.paused = True

        await self.driver.call(pause)
        return JSONResponse({"status": "paused"})

    async def resume(self, request: HTTPRequest) -> Response:
        """`POST /resume`: steps go on, the queued requests first."""

        def resume() -> None:
            self.engine.paused = False

        await self.driver.call(resume)
        return JSONResponse({"status": "resumed"})

    async def is_paused(self, request: HTTPRequest) -> Response:
        """`GET /is_paused`."""
        return JSONResponse({"is_paused": self.engine.paused})

    async def reset_prefix_cache(self, request: HTTPRequest) -> Response:
        """`POST /reset_prefix_cache`: `{"success": false}` while requests hold blocks (vLLM)."""

        def reset() -> bool:
            if self.engine.running:
                return False
            self.engine.reset_prefix_cache()
            return True

        return JSONResponse({"success": await self.driver.call(reset)})

    async def tokenize(self, request: HTTPRequest) -> Response:
        """`/tokenize`: `{prompt}` or `{messages[, tools]}` -> `{count, max_model_len, tokens}`."""
        try:
            body = await self.serving.body(request)
            self.serving.check_model(body)
            if "messages" in body:
                text = render_chat(
                    self.serving.messages(body),
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

    # -- OpenAI routes (in _openai_api) ----------------------------------------

    async def chat(self, request: HTTPRequest) -> Response:
        """`POST /v1/chat/completions` (JSON or SSE)."""
        return await _openai_api.chat(self.serving, request)

    async def chat_batch(self, request: HTTPRequest) -> Response:
        """`POST /v1/chat/completions/batch`: several conversations, one choice each."""
        return await _openai_api.chat_batch(self.serving, request)

    async def completions(self, request: HTTPRequest) -> Response:
        """`POST /v1/completions`: a prompt or a list of prompts, one engine request each."""
        return await _openai_api.completions(self.serving, request)
