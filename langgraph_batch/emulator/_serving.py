"""One emulated server's state and the request plumbing every route shares.

`Serving` owns the engine, its real-time driver, the agent hints and the
fault dice, and turns an HTTP request into engine requests: parsing and
validating the body and the emulator options, planning the answer, running
it to the end. The routes (`server`'s small endpoints, `_openai_api`,
`sglang`, `metrics`) receive it; none of them reaches back into the app.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from starlette.requests import Request as HTTPRequest

from langgraph_batch.emulator._hints import AgentHints
from langgraph_batch.emulator._http import RequestError, RequestOptions, Watch
from langgraph_batch.emulator._openai_cache import OpenAIPromptCache
from langgraph_batch.emulator._ratelimit import (
    Admission,
    RateLimited,
    RateLimiter,
    anthropic_headers,
    openai_headers,
)
from langgraph_batch.emulator.config import FAULTS, EmulatorConfig
from langgraph_batch.emulator.costs import get_profile
from langgraph_batch.emulator.driver import RealTimeDriver
from langgraph_batch.emulator.engine import Engine, Request
from langgraph_batch.emulator.scenarios import Plan, ScenarioOptions, fit_length, plan_text
from langgraph_batch.emulator.tokenizer import IM_END, piece_ids, tokenize

__all__ = ("Serving",)

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


class Serving:
    """The engine, its driver and the plumbing from an HTTP request to engine requests.

    Args:
        config: Server options.
    """

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.profile = get_profile(config.profile)
        self.engine = Engine(
            profile=self.profile,
            kv_tokens=config.kv_tokens,
            block_size=config.block_size,
            max_num_seqs=config.max_num_seqs,
            max_batched_tokens=config.max_batched_tokens,
            scheduling_policy=config.scheduling_policy,
            enable_prefix_caching=config.enable_prefix_caching,
            flavor=config.flavor,
            offload_tokens=config.offload_tokens,
        )
        self.driver = RealTimeDriver(self.engine, time_scale=config.time_scale)
        self._fault_rng = random.Random(config.seed)
        self.hints = AgentHints(accept=config.agentic_context)
        limiter = RateLimiter(
            requests_per_min=config.rate_limit_rpm,
            tokens_per_min=config.rate_limit_tpm,
            input_tokens_per_min=config.rate_limit_itpm,
            output_tokens_per_min=config.rate_limit_otpm,
            minute_s=60.0 / config.time_scale,
        )
        self.rate_limits = limiter if limiter.active else None
        """The provider-style limits (`--rate-limit-*`), None when none is set."""
        self.rate_limited = 0
        """Requests refused with 429 by `rate_limits` (`/emulator/stats`)."""
        hosted_openai = config.hosted == "openai"
        self.openai_cache = OpenAIPromptCache(seed=config.seed) if hosted_openai else None
        """OpenAI's prompt-caching rules for `cached_tokens` (`hosted="openai"`), else None."""

    # -- rate limits (OpenAI's headers; the Anthropic route writes its own) -----

    def admit(
        self,
        body: Mapping[str, Any],
        input_tokens: int,
        headers: dict[str, str],
        *,
        requests: int = 1,
        style: Literal["openai", "anthropic"] = "openai",
    ) -> Admission | None:
        """Charge a request to the rate limits and add their headers to `headers`.

        Output is charged at the body's `max_tokens` (or `max_completion_tokens`;
        0 when absent; per prompt for a batch of `requests` prompts) and settled
        by `settle` when the request ends. `style` picks the headers' spelling
        (`anthropic` for a Messages route).

        Raises:
            RequestError: a 429 with the limit headers and `retry-after`.
        """
        limiter = self.rate_limits
        if limiter is None:
            return None
        write = anthropic_headers if style == "anthropic" else openai_headers
        raw = body.get("max_completion_tokens", body.get("max_tokens"))
        output = raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else 0
        try:
            admission = limiter.admit(
                input_tokens=input_tokens, output_tokens=output * requests, requests=requests
            )
        except RateLimited as exc:
            self.rate_limited += 1
            err = RequestError(str(exc), status=429, err_type="RateLimitError")
            err.headers.update(write(limiter.snapshot(), retry_after_s=exc.retry_after_s))
            raise err from None
        headers.update(write(limiter.snapshot()))
        return admission

    def settle(self, admission: Admission | None, output_tokens: int) -> None:
        """Charge the output a request really generated (see `admit`)."""
        if admission is not None and self.rate_limits is not None:
            self.rate_limits.settle(admission, output_tokens=output_tokens)

    # -- parsing -------------------------------------------------------------

    async def body(self, request: HTTPRequest) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(f"Invalid JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError("The request body must be a JSON object.")
        return body

    def check_model(self, body: Mapping[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.config.model:
            raise RequestError(
                f"The model `{model}` does not exist.", status=404, err_type="NotFoundError"
            )

    @staticmethod
    def messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
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
        """The longest sequence served: `--max-model-len`, at most the KV cache's usable tokens.

        vLLM refuses to start when its usable blocks cannot hold one sequence
        of `max_model_len` tokens (`kv_cache_utils._check_enough_kv_cache_memory`;
        its estimate counts the null block out: 8,192 KV tokens in blocks of
        32 serve at most 8,160); the emulator serves the longest one its cache
        holds instead, so that a prompt it could never schedule gets vLLM's
        context-length 400 rather than waiting forever.
        """
        return min(self.config.max_model_len, self.engine.usable_kv_tokens)

    def max_tokens(self, body: Mapping[str, Any], prompt_len: int, *, default: int | None) -> int:
        """Validated max_tokens against max_model_len (vLLM's rules and messages).

        vLLM flavour, as vLLM 0.32 (`renderers/params.py`, `_token_len_check`;
        `entrypoints/serve/utils/api_utils.py`, `get_max_tokens`): a prompt
        longer than `max_model_len` is a 400 naming `input_tokens`; otherwise
        `max_tokens` is cut to `max_model_len - prompt` (the answer then ends
        with `length`), and a result below 1 is a 400 naming `max_tokens` (a
        prompt of exactly `max_model_len` tokens gets "got 0"). The SGLang
        flavour refuses a prompt plus `max_tokens` over the limit.
        """
        mml = self.max_model_len
        vllm = self.config.flavor == "vllm"
        if vllm and prompt_len > mml:
            # vLLM's tokenizer may have cut the prompt to one token over: "at least".
            least = "at least " if prompt_len == mml + 1 else ""
            raise RequestError(
                f"This model's maximum context length is {mml} tokens. However, your prompt "
                f"contains {least}{prompt_len} input tokens, which exceeds this limit even "
                f"without any output tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={prompt_len})",
                param="input_tokens",
            )
        if not vllm and prompt_len >= mml:
            raise RequestError(
                f"This model's maximum context length is {mml} tokens. However, your request "
                f"has {prompt_len} input tokens. Please reduce the length of the input messages."
            )
        raw = body.get("max_completion_tokens", body.get("max_tokens"))
        if raw is None:
            raw = default if default is not None else mml - prompt_len
        elif not isinstance(raw, int) or isinstance(raw, bool):
            raise RequestError(f"max_tokens must be an integer, got {raw!r}.", param="max_tokens")
        if vllm:
            raw = min(raw, mml - prompt_len)
        if raw < 1:
            raise RequestError(
                f"max_tokens must be at least 1, got {raw}. (parameter=max_tokens, value={raw})",
                param="max_tokens",
            )
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

    async def delay_first(self, opts: RequestOptions) -> None:
        if opts.fault == "slow_first_token" and opts.slow_first_token_s > 0:
            await asyncio.sleep(opts.slow_first_token_s / self.config.time_scale)

    async def run_to_end(
        self, reqs: list[Request], http: HTTPRequest, opts: RequestOptions
    ) -> bool:
        """Submit requests and wait until all finished; False if the client left."""
        await self.delay_first(opts)
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
