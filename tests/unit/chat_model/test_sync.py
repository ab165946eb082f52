"""Sync calls go through the one background loop (and its scheduler)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from langchain_core.messages import AIMessageChunk

from langgraph_batch._context import SiblingInfo, sibling_scope
from langgraph_batch._loop import BackgroundLoop, background_loop
from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.errors import BackendBadRequestError
from tests.fakes.backends import Reply, ScriptedBackend


def make(**kw: object) -> tuple[BatchedChatModel, ScriptedBackend]:
    backend = ScriptedBackend(base_url=f"fake://{uuid.uuid4().hex}")
    return BatchedChatModel(model="m", backend=backend, **kw), backend  # type: ignore[arg-type]


def test_sync_invoke_runs_on_the_background_loop() -> None:
    llm, backend = make()
    info = SiblingInfo(group="sync", index=2)
    with sibling_scope(info):
        msg = llm.invoke("hi")
    assert msg.content == "hello world"
    assert backend.loops == [background_loop().loop]
    assert backend.requests[0].request_id.startswith("lgb-sync-2-t0-")
    assert info.turn == 1


def test_sync_calls_from_threads_share_one_scheduler() -> None:
    llm, backend = make(max_inflight=3)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: llm.invoke(f"q{i}").content, range(16)))
    assert results == ["hello world"] * 16
    assert set(backend.loops) == {background_loop().loop}
    assert backend.peak <= 3
    # One scheduler served every thread: the same object from the loop.
    sched = background_loop().run(_scheduler_of(llm))
    assert sched.stats().completed == 16


async def _scheduler_of(llm: BatchedChatModel) -> object:
    return llm.get_scheduler()


def test_sync_stream_and_streaming_invoke() -> None:
    llm, _ = make()
    chunks = list(llm.stream("hi"))
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    assert "".join(c.text for c in chunks) == "hello world"
    assert chunks[-1].chunk_position == "last"
    assert chunks[-1].usage_metadata is not None
    streaming, backend2 = make(streaming=True)
    assert streaming.invoke("hi").content == "hello world"
    assert backend2.requests[0].stream is True


def test_closing_a_sync_stream_cancels_the_call() -> None:
    gate = asyncio.Event()  # never set: the call stays open until cancelled
    backend = ScriptedBackend(
        lambda r: Reply(content="a b c"), base_url=f"fake://{uuid.uuid4().hex}", gate=gate
    )
    llm = BatchedChatModel(model="m", backend=backend)
    stream = llm.stream("q")
    assert next(stream).text == "a"
    stream.close()
    assert backend.cancelled_event.wait(10)
    assert backend.cancelled == 1


def test_sync_errors_propagate() -> None:
    backend = ScriptedBackend(
        lambda r: Reply(error=BackendBadRequestError("refused", status_code=400)),
        base_url=f"fake://{uuid.uuid4().hex}",
    )
    llm = BatchedChatModel(model="m", backend=backend)
    with pytest.raises(BackendBadRequestError, match="refused"):
        llm.invoke("hi")
    with pytest.raises(BackendBadRequestError, match="refused"):
        list(llm.stream("hi"))


def test_background_loop_lifecycle() -> None:
    loop = BackgroundLoop(name="test-loop")

    async def where() -> str:
        return threading.current_thread().name

    assert loop.run(where()) == "test-loop"

    async def nested() -> None:
        loop.run(where())

    with pytest.raises(RuntimeError, match="async API"):
        loop.run(nested())
    loop.close()
    loop.close()
    # Restarts lazily after close.
    assert loop.run(where()) == "test-loop"
    loop.close()
