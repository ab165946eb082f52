"""A stream reads a request the engine thread is advancing: no token may be lost.

The emulator's engine commits tokens in its own thread (`RealTimeDriver`), and
a stream's loop reads `num_output` and `finished` from the event loop. Two
races, each once seen in the chaos test as a sibling "successfully" answered
with a truncated text (`finish_reason` "stop", usage counting every token):

- the thread commits the last tokens between the loop's read of the count and
  its read of `finished`: the stream closed with the tokens it had counted;
- the thread's news arrives while the loop writes a frame: armed only after
  the write, the loop would wait for news that already came.

Here a fake request plays the engine thread at exactly those points.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest

from langgraph_batch.backends._sse import SSEDecoder
from langgraph_batch.emulator import sglang
from langgraph_batch.emulator._openai_api import _stream_chat
from langgraph_batch.emulator.engine import RequestStatus
from langgraph_batch.emulator.scenarios import Plan

PIECES = ("Final", " answer", " for", " k5", ":", " at")
PLAN = Plan(text="".join(PIECES), content="".join(PIECES), pieces=PIECES)


class RacingRequest:
    """A request whose engine commits tokens when the test (or a read of its count) says."""

    def __init__(self) -> None:
        self.request_id = "r1"
        self.prompt_len = 10
        self.cached_tokens = 0
        self.status = RequestStatus.RUNNING
        self.listener: Callable[[Any], None] | None = None
        self._produced = 0
        self.finish_on_read: int | None = None
        """Finish (every token) right after a read of the count returns this value."""

    @property
    def finished(self) -> bool:
        return self.status in (RequestStatus.FINISHED, RequestStatus.ABORTED)

    @property
    def num_output(self) -> int:
        value = self._produced
        if value == self.finish_on_read:
            self.finish_on_read = None
            self.commit(len(PIECES), finish=True)  # the thread ran just after the read
        return value

    def commit(self, produced: int, *, finish: bool = False) -> None:
        """What the engine thread does, then the driver's notice on the event loop."""
        self._produced = produced
        if finish:
            self.status = RequestStatus.FINISHED
        asyncio.get_running_loop().call_soon(self.notify)

    def notify(self) -> None:
        if self.listener is not None:
            self.listener(self)


def _server() -> Any:
    async def delay_first(opts: object) -> None:
        return None

    driver = SimpleNamespace(submit=lambda req: None, abort=lambda req: None)
    return SimpleNamespace(
        config=SimpleNamespace(model="m"), delay_first=delay_first, driver=driver
    )


def _openai_stream(req: RacingRequest) -> AsyncIterator[bytes]:
    opts: Any = SimpleNamespace(fault=None)
    return _stream_chat(_server(), "chatcmpl-r1", req, PLAN, opts, include_usage=False)  # type: ignore[arg-type]


def _openai_text(frames: list[bytes]) -> str:
    """The streamed answer; its last event must say it stopped."""
    text, finish = "", None
    for data in SSEDecoder().feed(b"".join(frames)):
        if data == b"[DONE]":
            continue
        choice = json.loads(data)["choices"][0]
        text += choice["delta"].get("content") or ""
        finish = choice["finish_reason"] or finish
    assert finish == "stop"
    return text


def _sglang_stream(req: RacingRequest) -> AsyncIterator[bytes]:
    return sglang._stream(_server(), req, PLAN, 0.0)  # type: ignore[arg-type]


def _sglang_text(frames: list[bytes]) -> str:
    """The text of the last event (SGLang streams the whole text so far)."""
    items = [json.loads(d) for d in SSEDecoder().feed(b"".join(frames)) if d != b"[DONE]"]
    return str(items[-1]["text"])


Stream = Callable[[RacingRequest], AsyncIterator[bytes]]
FLAVOURS = pytest.mark.parametrize(
    ("open_stream", "answer"),
    [(_openai_stream, _openai_text), (_sglang_stream, _sglang_text)],
    ids=["openai", "sglang"],
)


async def _next(stream: AsyncIterator[bytes]) -> bytes:
    async with asyncio.timeout(2):  # a lost wake-up would wait for ever
        return await anext(stream)


async def _drain(stream: AsyncIterator[bytes], frames: list[bytes]) -> None:
    async with asyncio.timeout(2):
        async for frame in stream:
            frames.append(frame)


async def _started(
    open_stream: Stream,
) -> tuple[RacingRequest, AsyncIterator[bytes], list[bytes]]:
    """A stream whose request has 2 tokens, and its first frame ("Final answer")."""
    req = RacingRequest()
    stream = open_stream(req)
    req.commit(2)
    return req, stream, [await _next(stream)]


@FLAVOURS
async def test_a_stream_sends_tokens_committed_after_the_count_was_read(
    open_stream: Stream, answer: Callable[[list[bytes]], str]
) -> None:
    req, stream, frames = await _started(open_stream)
    req.commit(3)
    req.finish_on_read = 3  # the thread finishes just after the loop reads 3
    await _drain(stream, frames)
    assert answer(frames) == PLAN.text


@FLAVOURS
async def test_a_stream_sees_news_that_came_while_it_wrote(
    open_stream: Stream, answer: Callable[[list[bytes]], str]
) -> None:
    req, stream, frames = await _started(open_stream)
    # The loop is suspended in the write of that frame: the request finishes now.
    req.commit(len(PIECES), finish=True)
    await asyncio.sleep(0)  # the notice runs before the loop resumes
    await _drain(stream, frames)
    assert answer(frames) == PLAN.text
