"""SGLang's native endpoints for `--flavor sglang`: `/generate`, `/flush_cache`, info.

`/generate` takes `text` (a string or a list: a batch) or `input_ids`, and
`sampling_params` (one dict, or a list matching the batch). Each result
carries `meta_info` with `cached_tokens`. Priority follows SGLang (a higher
value runs earlier) under `--scheduling-policy priority`.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from langgraph_batch.emulator._http import RequestError, Watch
from langgraph_batch.emulator._serving import Serving
from langgraph_batch.emulator.engine import Request
from langgraph_batch.emulator.protocol import sse
from langgraph_batch.emulator.scenarios import Plan, fit_length, key_of, value_for_schema
from langgraph_batch.emulator.tokenizer import split_pieces, tokenize

__all__ = ("routes",)


def routes(server: Serving) -> list[Route]:
    """The SGLang-only routes bound to `server`."""

    async def generate(request: HTTPRequest) -> Response:
        return await _generate(server, request)

    async def flush_cache(request: HTTPRequest) -> Response:
        def flush() -> bool:
            if server.engine.has_work():
                return False
            server.engine.reset_prefix_cache()
            return True

        if not await server.driver.call(flush):
            return Response("Cache not flushed: there are running or waiting requests.", 400)
        return Response("Cache flushed.", 200)

    async def server_info(request: HTTPRequest) -> Response:
        cfg = server.config
        return JSONResponse(
            {
                "model_path": cfg.model,
                "max_total_num_tokens": server.engine.kv_capacity_tokens,
                "max_running_requests": cfg.max_num_seqs,
                "chunked_prefill_size": cfg.max_batched_tokens,
                "enable_priority_scheduling": cfg.scheduling_policy == "priority",
                "version": "0.5.23",
            }
        )

    async def model_info(request: HTTPRequest) -> Response:
        return JSONResponse({"model_path": server.config.model, "is_generation": True})

    async def health_generate(request: HTTPRequest) -> Response:
        return Response(status_code=200 if server.driver.alive else 503)

    return [
        Route("/generate", generate, methods=["POST"]),
        Route("/flush_cache", flush_cache, methods=["POST", "GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/get_server_info", server_info, methods=["GET"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/health_generate", health_generate, methods=["GET"]),
    ]


def _plan(server: Serving, prompt: str, params: Mapping[str, Any], opts: Any) -> Plan:
    max_new = int(params.get("max_new_tokens", 128))
    schema = params.get("json_schema")
    if schema is not None:
        if isinstance(schema, str):
            schema = json.loads(schema)
        rng = random.Random(hash(prompt) & 0xFFFF)
        text = json.dumps(value_for_schema(schema, key=key_of(prompt), rng=rng))
        plan = Plan(text=text, content=text, pieces=tuple(split_pieces(text)), structured=True)
    else:
        plan = server.text_plan(prompt, opts, max_new)
    return fit_length(
        plan,
        max_tokens=max_new,
        ignore_eos=bool(params.get("ignore_eos")),
        min_tokens=int(params.get("min_new_tokens") or 0),
        seed=prompt,
    )


def _finish(plan: Plan, req: Request, max_new: int) -> dict[str, Any]:
    if req.num_output >= max_new:
        return {"type": "length", "length": req.num_output}
    return {"type": "stop", "matched": 151645}


async def _generate(server: Serving, request: HTTPRequest) -> Response:
    try:
        body = await server.body(request)
        opts = server.options(request, body)
        server.raise_fault(opts)
        text = body.get("text")
        ids = body.get("input_ids")
        batch = isinstance(text, list) or (
            isinstance(ids, list) and ids and isinstance(ids[0], list)
        )
        if text is not None:
            prompts: list[Any] = list(text) if isinstance(text, list) else [text]
        elif ids is not None:
            prompts = list(ids) if batch else [ids]
        else:
            raise RequestError("Either text or input_ids should be provided.")
        params_raw = body.get("sampling_params") or {}
        params_list = (
            list(params_raw) if isinstance(params_raw, list) else [params_raw] * len(prompts)
        )
        if len(params_list) != len(prompts):
            raise RequestError("sampling_params list must match the batch size.")
        rid_raw = body.get("rid")
        rids = (
            list(rid_raw)
            if isinstance(rid_raw, list)
            else [rid_raw or uuid.uuid4().hex] * len(prompts)
        )
        if len(prompts) > 1 and not isinstance(rid_raw, list):
            rids = [f"{r}-{i}" for i, r in enumerate(rids)]
        reqs: list[Request] = []
        plans: list[Plan] = []
        for prompt, params, rid in zip(prompts, params_list, rids, strict=True):
            if isinstance(prompt, str):
                ptext, pids = prompt, tokenize(prompt)
            else:
                ptext, pids = " ".join(map(str, prompt)), [int(t) for t in prompt]
            max_new = int(params.get("max_new_tokens", 128))
            server.max_tokens({"max_tokens": max_new}, len(pids), default=None)
            plan = _plan(server, ptext, params, opts)
            plans.append(plan)
            reqs.append(
                server.new_request(
                    str(rid), pids, plan, priority=server.priority(request, body), salt=None
                )
            )
    except RequestError as exc:
        return exc.response()
    except (TypeError, ValueError) as exc:
        return RequestError(f"Bad /generate request: {exc}").response()
    start = time.monotonic()
    if body.get("stream") and len(reqs) == 1:
        return StreamingResponse(
            _stream(server, reqs[0], plans[0], start), media_type="text/event-stream"
        )
    if not await server.run_to_end(reqs, request, opts):
        return Response(status_code=499)
    results = [
        _result(r, p, params, start) for r, p, params in zip(reqs, plans, params_list, strict=True)
    ]
    return JSONResponse(results if batch else results[0])


def _result(req: Request, plan: Plan, params: Mapping[str, Any], start: float) -> dict[str, Any]:
    max_new = int(params.get("max_new_tokens", 128))
    return {
        "text": plan.text,
        "meta_info": {
            "id": req.request_id,
            "finish_reason": _finish(plan, req, max_new),
            "prompt_tokens": req.prompt_len,
            "completion_tokens": req.num_output,
            "cached_tokens": req.cached_tokens or 0,
            "e2e_latency": time.monotonic() - start,
        },
    }


async def _stream(server: Serving, req: Request, plan: Plan, start: float) -> AsyncIterator[bytes]:
    watch = Watch()
    req.listener = watch
    server.driver.submit(req)
    sent = 0
    try:
        while True:
            # As the OpenAI stream: armed before reading, and `finished` read
            # before `num_output` (the engine thread writes them in that order).
            woken = watch.arm()
            done = req.finished
            produced = req.num_output
            k = min(produced, len(plan.pieces))
            if k > sent:
                sent = k
                text = "".join(plan.pieces[:k])
                item = {
                    "text": text,
                    "meta_info": {
                        "id": req.request_id,
                        "finish_reason": None,
                        "prompt_tokens": req.prompt_len,
                        "completion_tokens": produced,
                        "cached_tokens": req.cached_tokens or 0,
                    },
                }
                yield sse(item)
            if done:
                break
            await woken
        yield sse("[DONE]")
    finally:
        if not req.finished:
            server.driver.abort(req)
