"""The server's per-request hot path and the threaded real-time driver."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading

import pytest

from langgraph_batch.emulator import tokenizer
from langgraph_batch.emulator.costs import get_profile
from langgraph_batch.emulator.driver import RealTimeDriver
from langgraph_batch.emulator.engine import Engine, Request, RequestStatus
from langgraph_batch.emulator.protocol import ChunkEncoder, chat_chunk, sse
from langgraph_batch.emulator.scenarios import _seed_for
from langgraph_batch.emulator.tokenizer import render_chat, tokenize, tokenize_chat

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "You are a careful agent. " * 20},
    {"role": "user", "content": "find  x\tkey=k1"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "search", "arguments": '{"q": "x"}'}}],
    },
    {"role": "tool", "content": "result  \n"},
    {"role": "user", "content": [{"type": "text", "text": "and?"}]},
]


def test_tokenize_chat_equals_whole_prompt_tokenization() -> None:
    for tools in (None, TOOLS):
        for gen in (True, False):
            for msgs in (MESSAGES, MESSAGES[1:], MESSAGES[:2]):
                expected = tokenize(render_chat(msgs, tools=tools, add_generation_prompt=gen))
                assert tokenize_chat(msgs, tools=tools, add_generation_prompt=gen) == expected
                # Second call comes from the cache and must be identical.
                assert tokenize_chat(msgs, tools=tools, add_generation_prompt=gen) == expected


def test_tokenize_chat_caches_the_shared_system_turn() -> None:
    system = {"role": "system", "content": "Shared instructions for every sibling. " * 10}
    tokenize_chat([system, {"role": "user", "content": "a"}], tools=TOOLS)
    cached = [s for s in tokenizer._SEGMENT_IDS if "Shared instructions" in s]
    assert len(cached) == 1
    tokenize_chat([system, {"role": "user", "content": "b"}], tools=TOOLS)
    assert [s for s in tokenizer._SEGMENT_IDS if "Shared instructions" in s] == cached
    # Short turns (per-request user text) are not cached.
    assert not any(s.endswith("user\nb<|im_end|>\n") for s in tokenizer._SEGMENT_IDS)


def test_chunk_encoder_matches_chat_chunk() -> None:
    rid, model, created = 'chatcmpl-a"b\\', "modèle/x", 1_700_000_000
    enc = ChunkEncoder(rid, model, created)
    for delta in (
        {"role": "assistant", "content": ""},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"q": "é\\n"}'}}]},
    ):
        assert enc.delta(delta) == sse(chat_chunk(rid, model, created, delta))
    for text in ("hello", ' "quoted"\n\t', "ünï\u2028"):
        assert enc.content(text) == sse(chat_chunk(rid, model, created, {"content": text}))


def _seed_reference(*parts: object) -> int:
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "big")


def test_seed_fast_path_keeps_the_seeds() -> None:
    for parts in ((0, 'task é "1"', 3, "agent"), (7, "prompt", "completion"), (1, {"b": 1})):
        assert _seed_for(*parts) == _seed_reference(*parts)


def _req(rid: str, out: int) -> Request:
    return Request(request_id=rid, prompt_ids=list(range(1, 40)), output_ids=[9] * out)


async def test_driver_runs_the_engine_in_its_own_thread() -> None:
    engine = Engine(profile=get_profile("h100-llama3-8b"))
    driver = RealTimeDriver(engine, time_scale=20.0)
    driver.start()
    try:
        loop_thread = threading.get_ident()
        seen_threads: set[int] = set()
        done = asyncio.get_running_loop().create_future()
        reqs = [_req(f"r{i}", 5) for i in range(20)]
        finished: list[str] = []

        def listener(req: Request) -> None:
            seen_threads.add(threading.get_ident())
            if req.finished and req.request_id not in finished:
                finished.append(req.request_id)
                if len(finished) == len(reqs) and not done.done():
                    done.set_result(None)

        for r in reqs:
            r.listener = listener
            driver.submit(r)
        await asyncio.wait_for(done, 10)
        # Listeners run in the event loop, never in the engine thread.
        assert seen_threads == {loop_thread}
        assert all(r.status is RequestStatus.FINISHED and r.num_output == 5 for r in reqs)
        assert all(r.arrival <= (r.first_scheduled or 0.0) for r in reqs)
        assert driver.max_lag_s >= driver.lag_s >= 0.0
        # Latency histograms are recorded on the event loop side, once per token.
        assert driver.ttft.count == 20
        assert driver.e2e.count == 20
        assert driver.itl.count == 20 * 4
        assert driver._last_token == {}
        # `call` runs between steps in the engine thread.
        name = await driver.call(lambda: threading.current_thread().name)
        assert name == "emulator-engine"
        assert (await driver.call(lambda: engine.counters.finished)) == 20
    finally:
        await driver.aclose()
    assert driver.alive


async def test_driver_abort_is_applied_at_a_step_boundary() -> None:
    engine = Engine(profile=get_profile("h100-llama3-8b"))
    driver = RealTimeDriver(engine, time_scale=1.0)
    driver.start()
    try:
        loop = asyncio.get_running_loop()
        decoding, aborted = loop.create_future(), loop.create_future()

        def listener(req: Request) -> None:
            if req.num_output > 0 and not decoding.done():
                decoding.set_result(None)
            if req.status is RequestStatus.ABORTED and not aborted.done():
                aborted.set_result(req.num_output)

        long = _req("long", 10_000)
        long.listener = listener
        driver.submit(long)
        await asyncio.wait_for(decoding, 5)  # its first token is out
        driver.abort(long)
        produced = await asyncio.wait_for(aborted, 5)
        assert 0 < produced < 10_000
        assert driver._last_token == {}
        assert (await driver.call(lambda: (engine.num_running, engine.counters.aborted))) == (
            0,
            1,
        )
    finally:
        await driver.aclose()


async def test_driver_reports_a_dead_engine() -> None:
    engine = Engine(profile=get_profile("h100-llama3-8b"))
    driver = RealTimeDriver(engine, time_scale=1.0)

    def boom(now: float) -> None:
        raise RuntimeError("schedule failed")

    engine.schedule = boom  # type: ignore[assignment,method-assign]
    driver.start()
    try:
        driver.submit(_req("x", 1))
        for _ in range(200):
            if not driver.alive:
                break
            await asyncio.sleep(0.01)
        assert not driver.alive
        with pytest.raises(RuntimeError, match="died"):
            driver.submit(_req("y", 1))
    finally:
        await driver.aclose()
