"""Batched HTTP calls shared by the vLLM and SGLang backends: grouping, isolation, usage.

The scheduler may hand a backend several tool-free, non-streaming requests at
once (`Backend.complete_batch_settled`). `settle_batch` sends those that share
a group key as one HTTP call per group and the rest one by one, and keeps the
members of a call isolated from each other:

- **A bad member fails only its caller.** A member whose estimated length
  does not fit the server's `max_model_len` (learned from `/v1/models`) is
  sent alone. The estimate is only a pre-filter (the generous estimate of
  `_estimates`, 3 bytes per token: the server's tokenizer decides, and one
  estimated too long is only sent alone): when a batched call still fails with
  a 4xx that is the request's fault (`BackendBadRequestError`, e.g.
  `ContextLengthExceededError`; not 408 or 429, which are the server's), the
  batch is split and every member is sent on its own, so each gets its own
  answer or its own error. Other failures (5xx, 429, a dropped connection)
  are the server's, not a member's: every member gets the error and the
  scheduler retries each one.
- **Every member carries its own usage.** vLLM answers a list-prompt
  `/v1/completions` or `/v1/chat/completions/batch` call with usage summed
  over the call. `split_usage` gives each member its share: a member that
  stopped on `max_tokens` (`finish_reason="length"`) generated exactly
  `max_tokens` tokens; the rest of the prompt and completion totals is split
  in proportion to each member's prompt length (the typical estimate of
  `_estimates`: 4 bytes per token plus 8 per chat message) and answer
  length, with the largest-remainder rule so the shares add up exactly to
  the server's totals. Such usage has `estimated=True` (exact figures would
  need the prompt token ids or one `/tokenize` call per member, which costs
  more than the batching saves).
  `cached_tokens` is None: vLLM reports it for one prompt of the call only.
  A call of one member keeps the server's usage.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any

from langgraph_batch._estimates import CHARS_PER_TOKEN, generous_tokens, typical_tokens
from langgraph_batch.backends.base import ChatRequest, ChatResponse, Usage
from langgraph_batch.errors import BackendBadRequestError, BackendError, ModelNotFoundError

__all__ = (
    "MAX_PROMPTS_PER_CALL",
    "estimated_tokens",
    "gather_in_order",
    "gather_settled",
    "is_single_choice",
    "settle_batch",
    "split_usage",
)

MAX_PROMPTS_PER_CALL = 1024
"""vLLM accepts at most 1024 prompts in one `/v1/completions` call."""

Outcome = ChatResponse | BackendError


def is_single_choice(request: ChatRequest) -> bool:
    """True when a request may share an HTTP call with others (no stream, tools or n>1)."""
    params = request.params
    return not request.stream and "tools" not in params and params.get("n", 1) == 1


async def gather_in_order(coros: Sequence[Awaitable[Any]]) -> list[Any]:
    """Run coroutines concurrently; return their results in order or raise the first error.

    Unlike `TaskGroup`, a failure does not become an `ExceptionGroup` (backends
    raise only `BackendError`s), and the other calls are allowed to finish.
    """
    if len(coros) == 1:
        return [await coros[0]]
    results = await asyncio.gather(*coros, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return list(results)


async def gather_settled(coros: Sequence[Awaitable[Any]]) -> list[Any]:
    """Run coroutines concurrently; each result or its `BackendError`, in order.

    Any other exception (a bug, a cancellation) is raised once all have finished.
    """
    results = await asyncio.gather(*coros, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, BackendError):
            raise result
    return list(results)


def _text_size(request: ChatRequest) -> tuple[int, int]:
    """(bytes of prompt text, messages): a token id counts as `CHARS_PER_TOKEN` bytes.

    So the typical estimate of a prompt of token ids is exactly its length.
    """
    prompt = request.params.get("prompt")
    if isinstance(prompt, str):
        return len(prompt.encode()), 0
    if isinstance(prompt, list):
        return CHARS_PER_TOKEN * len(prompt), 0
    total = 0
    for m in request.messages:
        content = m.get("content")
        if isinstance(content, str):
            total += len(content.encode())
        elif content is not None:
            total += len(json.dumps(content).encode())
    return total, len(request.messages)


def estimated_tokens(request: ChatRequest) -> int:
    """A generous estimate of the request's prompt plus `max_tokens`, in tokens."""
    params = request.params
    max_tokens = params.get("max_tokens") or params.get("max_completion_tokens") or 0
    size, messages = _text_size(request)
    return generous_tokens(size, messages=messages) + int(max_tokens)


def _usage_weight(request: ChatRequest) -> int:
    """The typical token count, to split a call's prompt total by (at least 1)."""
    size, messages = _text_size(request)
    return max(1, typical_tokens(size, messages=messages))


def _largest_remainder(total: int, weights: Sequence[int]) -> list[int]:
    """Split `total` in proportion to `weights` into integers that sum to `total`."""
    n = len(weights)
    if n == 0:
        return []
    wsum = sum(weights)
    if wsum <= 0:
        weights, wsum = [1] * n, n
    raw = [total * w / wsum for w in weights]
    shares = [int(x) for x in raw]
    rest = total - sum(shares)
    order = sorted(range(n), key=lambda i: raw[i] - shares[i], reverse=True)
    for i in order[:rest]:
        shares[i] += 1
    return shares


def split_usage(
    total: Usage | None,
    requests: Sequence[ChatRequest],
    answers: Sequence[tuple[str | None, str | None]],
) -> list[Usage | None]:
    """Each member's share of a batched call's usage (see the module doc).

    Args:
        total: the usage the server reported for the whole call.
        requests: the members, in call order.
        answers: `(content, finish_reason)` of each member's choice.

    Returns:
        One `Usage` per member (`estimated=True` when the call had several
        members), or Nones when the server reported no usage.

    Example:
        ```python
        split_usage(Usage(prompt_tokens=30, completion_tokens=9), [a, b], [("x", "stop")] * 2)
        ```
    """
    if total is None:
        return [None] * len(requests)
    if len(requests) == 1:
        return [total]
    prompts = _largest_remainder(total.prompt_tokens, [_usage_weight(r) for r in requests])
    completions: list[int | None] = [None] * len(requests)
    for i, (request, (_, finish)) in enumerate(zip(requests, answers, strict=True)):
        cap = request.params.get("max_tokens") or request.params.get("max_completion_tokens")
        if finish == "length" and isinstance(cap, int):
            completions[i] = cap
    known = sum(c for c in completions if c is not None)
    open_ = [i for i, c in enumerate(completions) if c is None]
    if known > total.completion_tokens:  # the caps do not add up: split everything
        open_, known = list(range(len(requests))), 0
    shares = _largest_remainder(
        total.completion_tokens - known, [len(answers[i][0] or "") for i in open_]
    )
    for i, share in zip(open_, shares, strict=True):
        completions[i] = share
    return [
        Usage(prompt_tokens=p, completion_tokens=c or 0, cached_tokens=None, estimated=True)
        for p, c in zip(prompts, completions, strict=True)
    ]


async def settle_batch(
    requests: Sequence[ChatRequest],
    *,
    group_key: Callable[[ChatRequest], Hashable | None],
    send_batch: Callable[[Hashable, Sequence[ChatRequest]], Awaitable[list[ChatResponse]]],
    send_one: Callable[[ChatRequest], Awaitable[ChatResponse]],
    max_model_len: Mapping[str, int] | None = None,
) -> list[Outcome]:
    """Send `requests` in as few calls as possible; each gets its own outcome, in order.

    Args:
        requests: the requests the scheduler merged.
        group_key: the key of requests that may share a call (None: send alone).
        send_batch: sends one group's members (at most `MAX_PROMPTS_PER_CALL`) in
            one call; returns one response per member, in order.
        send_one: sends one request on its own.
        max_model_len: the server's context window per model, when known.

    Returns:
        A `ChatResponse` or the `BackendError` of each request, in input order.
    """
    groups: dict[Hashable, list[int]] = {}
    singles: list[int] = []
    for i, request in enumerate(requests):
        key = group_key(request)
        limit = max_model_len.get(request.model) if max_model_len else None
        if key is None or (limit is not None and estimated_tokens(request) > limit):
            singles.append(i)
        else:
            groups.setdefault(key, []).append(i)
    results: list[Outcome | None] = [None] * len(requests)

    async def one(i: int) -> None:
        try:
            results[i] = await send_one(requests[i])
        except BackendError as exc:
            results[i] = exc

    async def part(key: Hashable, members: list[int]) -> None:
        batch = [requests[i] for i in members]
        try:
            out = await send_batch(key, batch)
        except ModelNotFoundError as exc:
            for i in members:
                results[i] = exc
        except BackendBadRequestError:
            # Some member is bad (too long, bad params): each goes alone, so that only
            # the bad one's caller gets the error.
            await asyncio.gather(*(one(i) for i in members))
        except BackendError as exc:
            for i in members:
                results[i] = exc
        else:
            for i, response in zip(members, out, strict=True):
                results[i] = response

    jobs: list[Awaitable[None]] = []
    for key, members in groups.items():
        if len(members) == 1:
            singles.extend(members)
            continue
        jobs.extend(
            part(key, members[start : start + MAX_PROMPTS_PER_CALL])
            for start in range(0, len(members), MAX_PROMPTS_PER_CALL)
        )
    jobs.extend(one(i) for i in singles)
    if len(jobs) == 1:
        await jobs[0]
    else:
        await asyncio.gather(*jobs)
    return [r for r in results if r is not None]
