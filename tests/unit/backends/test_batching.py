"""Shared batching (`backends/_batching.py`): isolation of members and per-member usage."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import pytest

from langgraph_batch.backends._batching import (
    MAX_PROMPTS_PER_CALL,
    estimated_tokens,
    settle_batch,
    split_usage,
)
from langgraph_batch.backends.base import ChatRequest, ChatResponse, Usage
from langgraph_batch.errors import (
    BackendBadRequestError,
    BackendError,
    BackendServerError,
    ModelNotFoundError,
)


def prompt(text: str, **params: object) -> ChatRequest:
    return ChatRequest(model="m", messages=(), params={"prompt": text, **params}, request_id=text)


def answer(r: ChatRequest, how: str) -> ChatResponse:
    return ChatResponse(id=r.request_id, model="m", content=f"{how}:{r.params['prompt']}")


class Server:
    def __init__(self, batch_error: BackendError | None = None) -> None:
        self.batch_error = batch_error
        self.batches: list[list[str]] = []
        self.singles: list[str] = []

    async def send_batch(self, key: Hashable, batch: Sequence[ChatRequest]) -> list[ChatResponse]:
        self.batches.append([r.request_id for r in batch])
        if self.batch_error is not None:
            raise self.batch_error
        return [answer(r, "batch") for r in batch]

    async def send_one(self, r: ChatRequest) -> ChatResponse:
        self.singles.append(r.request_id)
        if r.request_id == "bad":
            raise BackendBadRequestError("bad prompt", status_code=400)
        return answer(r, "one")


def key(r: ChatRequest) -> Hashable | None:
    return None if r.request_id == "alone" else "k"


async def test_groups_go_together_and_singles_alone_in_order() -> None:
    server = Server()
    reqs = [prompt("a"), prompt("alone"), prompt("b")]
    out = await settle_batch(
        reqs, group_key=key, send_batch=server.send_batch, send_one=server.send_one
    )
    assert [o.content for o in out] == ["batch:a", "one:alone", "batch:b"]  # type: ignore[union-attr]
    assert server.batches == [["a", "b"]]


async def test_a_4xx_batch_is_split_and_only_the_bad_member_fails() -> None:
    server = Server(BackendBadRequestError("one prompt is too long", status_code=400))
    reqs = [prompt(t) for t in ("a", "bad", "b")]
    out = await settle_batch(
        reqs, group_key=key, send_batch=server.send_batch, send_one=server.send_one
    )
    assert isinstance(out[1], BackendBadRequestError)
    assert [getattr(o, "content", None) for o in out] == ["one:a", None, "one:b"]
    assert server.singles == ["a", "bad", "b"]


@pytest.mark.parametrize(
    "error",
    [
        BackendServerError("overloaded", status_code=503),
        ModelNotFoundError("no such model", status_code=404),
    ],
)
async def test_a_server_failure_is_every_members_error(error: BackendError) -> None:
    server = Server(error)
    out = await settle_batch(
        [prompt("a"), prompt("b")],
        group_key=key,
        send_batch=server.send_batch,
        send_one=server.send_one,
    )
    assert out == [error, error]
    assert server.singles == []  # not split: splitting cannot help


async def test_the_length_prefilter_and_the_call_size_limit() -> None:
    server = Server()
    long = prompt("x" * 3000, max_tokens=10)
    assert estimated_tokens(long) == 1010
    reqs = [prompt("a"), long, *(prompt(f"p{i}") for i in range(MAX_PROMPTS_PER_CALL))]
    out = await settle_batch(
        reqs,
        group_key=key,
        send_batch=server.send_batch,
        send_one=server.send_one,
        max_model_len={"m": 1000},
    )
    assert out[1].content.startswith("one:")  # type: ignore[union-attr]
    assert server.singles == [long.request_id]
    assert [len(b) for b in server.batches] == [MAX_PROMPTS_PER_CALL, 1]


def test_split_usage_sums_to_the_servers_totals() -> None:
    reqs = [prompt("a" * 10, max_tokens=5), prompt("b" * 30, max_tokens=5), prompt("c" * 20)]
    answers = [("xxxxx", "length"), ("yy", "stop"), ("zzzzzz", "stop")]
    usages = split_usage(Usage(prompt_tokens=61, completion_tokens=17), reqs, answers)
    assert all(u is not None and u.estimated for u in usages)
    # Weights: the typical estimate (_estimates.typical_tokens), ceil(bytes / 4): 3:8:5.
    assert [u.prompt_tokens for u in usages if u] == [11, 31, 19]
    # The one that stopped on max_tokens generated exactly 5; the other 12 are split
    # by answer length (2:6).
    assert [u.completion_tokens for u in usages if u] == [5, 3, 9]
    assert split_usage(None, reqs, answers) == [None, None, None]
    one = Usage(prompt_tokens=3, completion_tokens=2, cached_tokens=1)
    assert split_usage(one, reqs[:1], answers[:1]) == [one]  # exact for a single member
