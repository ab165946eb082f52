"""`with_structured_output(...).astream` streams partial dicts, then the whole (emulator)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.exceptions import OutputParserException
from pydantic import BaseModel
from typing_extensions import TypedDict

from langgraph_batch.chat_model import BatchedChatModel

MODEL = "emulated-llama-3-8b"


class Review(TypedDict):
    """A code review."""

    verdict: str
    score: int
    notes: list[str]


class ReviewModel(BaseModel):
    verdict: str
    score: int
    notes: list[str]


def _model(url: str, **kw: Any) -> BatchedChatModel:
    return BatchedChatModel(model=MODEL, base_url=url, max_retries=0, **kw)


async def test_a_typed_dict_streams_growing_partial_dicts(
    start_emulator: Callable[..., str],
) -> None:
    # Real time (scale 1): each token is its own wake-up, about 10 ms apart. At
    # the session emulator's scale 50 they are 0.2 ms apart, and a loaded machine
    # wakes the stream once for the whole answer, as a late vLLM merges its
    # deltas too: the parser then sees `{}` and the whole, nothing between.
    url = await asyncio.to_thread(start_emulator, time_scale=1.0)
    structured = _model(url, max_tokens=512).with_structured_output(Review)
    parts = [part async for part in structured.astream("review this")]
    whole = await structured.ainvoke("review this")
    assert len(parts) >= 3, parts  # partial dicts as the JSON grows, not one at the end
    assert parts[-1] == whole
    assert set(whole) == {"verdict", "score", "notes"}
    assert all(isinstance(p, dict) for p in parts)
    # Each partial is a prefix of the next: keys only ever appear.
    for before, after in itertools.pairwise(parts):
        assert set(before) <= set(after)


async def test_a_pydantic_schema_streams_one_complete_object(emulator_url: str) -> None:
    structured = _model(emulator_url, max_tokens=512).with_structured_output(ReviewModel)
    parts = [part async for part in structured.astream("review this")]
    assert len(parts) == 1
    assert isinstance(parts[0], ReviewModel)


async def test_a_json_stream_cut_by_max_tokens_raises_not_a_partial_dict(
    emulator_url: str,
) -> None:
    structured = _model(emulator_url, max_tokens=6).with_structured_output(Review)
    parts: list[Any] = []

    async def consume() -> None:
        async for part in structured.astream("review this"):
            parts.append(part)

    with pytest.raises(OutputParserException):
        await consume()
    with pytest.raises(OutputParserException):
        await structured.ainvoke("review this")
