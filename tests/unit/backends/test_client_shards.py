"""The backend's client shards: total connection limits, a request keeps its client."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from langgraph_batch.backends.base import ChatChunk, ChatRequest
from langgraph_batch.backends.openai_compat import (
    SHARD_CONNECTIONS,
    OpenAICompatibleBackend,
    _ClientShards,
)
from tests.unit.backends._fakes import chunk, completion, sse


class Gate:
    """Holds every request in the transport until `open` is set; counts who waits."""

    def __init__(self) -> None:
        self.open = anyio.Event()
        self.waiting = 0


class GatedStream(httpx.AsyncByteStream):
    """An SSE body: one chunk now, the rest once the gate opens."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    async def __aiter__(self) -> Any:
        yield sse(chunk(content="a"), done=False)
        await self.gate.open.wait()
        yield sse(chunk(content="b", finish_reason="stop"))


class ShardProbe(OpenAICompatibleBackend):
    """A backend whose shards are MockTransports that tag the requests they get."""

    def __init__(self, gate: Gate, **kwargs: Any) -> None:
        self.gate = gate
        self.made: list[httpx.Limits] = []
        self.seen: list[list[str]] = []  # per shard: the request ids it received
        super().__init__("http://engine:8000", **kwargs)

    def _new_client(self, limits: httpx.Limits) -> httpx.AsyncClient:
        index = len(self.made)
        self.made.append(limits)
        self.seen.append([])
        gate = self.gate

        async def handler(request: httpx.Request) -> httpx.Response:
            self.seen[index].append(json.loads(request.content)["rid"])
            if json.loads(request.content).get("stream"):
                return httpx.Response(
                    200, stream=GatedStream(gate), headers={"content-type": "text/event-stream"}
                )
            gate.waiting += 1
            await gate.open.wait()
            return httpx.Response(200, json=completion("ok"))

        return httpx.AsyncClient(transport=httpx.MockTransport(handler))

    def _extend_body(self, body: dict[str, Any], request: ChatRequest) -> None:
        body["rid"] = request.request_id


def req(rid: str, *, stream: bool = False) -> ChatRequest:
    return ChatRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=stream, request_id=rid
    )


async def wait_until(predicate: Any) -> None:
    with anyio.fail_after(5):
        while not predicate():  # noqa: ASYNC110 - polls state the tasks update
            await anyio.sleep(0.001)


async def test_shards_respect_the_total_connection_limit() -> None:
    gate = Gate()
    total = 2 * SHARD_CONNECTIONS + SHARD_CONNECTIONS // 2
    limits = httpx.Limits(max_connections=total, max_keepalive_connections=total // 2)
    backend = ShardProbe(gate, limits=limits)
    results: list[str | None] = []

    async def one(i: int) -> None:
        results.append((await backend.chat(req(f"r{i}"))).content)

    async with backend, anyio.create_task_group() as tg:
        for i in range(200):  # far more than the limit: the extra ones share shards
            tg.start_soon(one, i)
        await wait_until(lambda: gate.waiting == 200)
        # Only as many shards as the limit allows, and their limits add up to it.
        assert [lim.max_connections for lim in backend.made] == [SHARD_CONNECTIONS] * 2 + [
            SHARD_CONNECTIONS // 2
        ]
        assert sum(lim.max_connections or 0 for lim in backend.made) == total
        assert sum(lim.max_keepalive_connections or 0 for lim in backend.made) <= total // 2
        assert all(lim.max_keepalive_connections for lim in backend.made)
        loads = [s.inflight for s in backend._shards.shards]
        assert sum(loads) == 200
        assert (
            max(loads) - min(loads) <= 1 + SHARD_CONNECTIONS - SHARD_CONNECTIONS // 2
        )  # least-loaded first
        gate.open.set()
    assert results == ["ok"] * 200
    assert [s.inflight for s in backend._shards.shards] == [0, 0, 0]
    assert all(s.client.is_closed for s in backend._shards.shards)


async def test_shards_are_created_on_demand_only() -> None:
    gate = Gate()
    gate.open.set()
    async with ShardProbe(gate) as backend:
        for i in range(3 * SHARD_CONNECTIONS):  # one at a time: one client is enough
            await backend.chat(req(f"r{i}"))
        assert len(backend.made) == 1
        assert backend.made[0].max_connections == SHARD_CONNECTIONS


async def test_streamed_request_keeps_its_client() -> None:
    gate = Gate()
    backend = ShardProbe(gate, limits=httpx.Limits(max_connections=2 * SHARD_CONNECTIONS))
    first_chunk: set[str] = set()
    results: dict[str, str | None] = {}

    async def one(rid: str) -> None:
        def on_chunk(c: ChatChunk) -> None:
            first_chunk.add(rid)

        results[rid] = (await backend.chat(req(rid, stream=True), on_chunk=on_chunk)).content

    rids = [f"s{i}" for i in range(70)]
    async with backend, anyio.create_task_group() as tg:
        for rid in rids:
            tg.start_soon(one, rid)
        await wait_until(lambda: len(first_chunk) == 70)
        # Every open stream still counts on the shard that received it.
        shards = backend._shards.shards
        assert len(shards) == 2
        assert [s.inflight for s in shards] == [len(seen) for seen in backend.seen]
        assert sum(s.inflight for s in shards) == 70
        gate.open.set()
    assert results == dict.fromkeys(rids, "ab")
    seen = [rid for per_shard in backend.seen for rid in per_shard]
    assert sorted(seen) == sorted(rids)  # each request went to exactly one client
    assert [s.inflight for s in backend._shards.shards] == [0, 0]


async def test_cancelled_stream_releases_its_shard() -> None:
    gate = Gate()
    backend = ShardProbe(gate)
    got: list[ChatChunk] = []
    async with backend:
        with anyio.move_on_after(0.05):
            await backend.chat(req("c", stream=True), on_chunk=got.append)
        assert len(got) == 1
        assert backend._shards.shards[0].inflight == 0


def test_small_or_unlimited_totals() -> None:
    made: list[httpx.Limits] = []

    def make(limits: httpx.Limits) -> httpx.AsyncClient:
        made.append(limits)
        return httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200)))

    small = httpx.Limits(max_connections=SHARD_CONNECTIONS, max_keepalive_connections=4)
    shards = _ClientShards(make, small)
    for _ in range(20):
        shards.acquire()
    assert made == [small]  # within one shard: the caller's limits as they are
    assert shards.shards[0].inflight == 20

    made.clear()
    shards = _ClientShards(make, httpx.Limits(max_connections=None, max_keepalive_connections=None))
    for _ in range(3 * SHARD_CONNECTIONS + 1):
        shards.acquire()
    assert [lim.max_connections for lim in made] == [SHARD_CONNECTIONS] * 4
    assert all(lim.max_keepalive_connections is None for lim in made)

    with pytest.raises(ValueError, match="shard_connections"):
        _ClientShards(make, small, 0)


async def test_custom_transport_uses_one_client() -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(200, json=completion("x")))
    async with OpenAICompatibleBackend("http://engine:8000", transport=transport) as backend:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                for i in range(100):
                    tg.start_soon(backend.chat, req(f"t{i}"))
        assert len(backend._shards.shards) == 1
        assert backend._shards.shards[0].client is backend._client


async def test_a_get_does_not_wait_behind_completions_on_a_full_shard() -> None:
    """`models()`/`metrics()` take a shard with a free connection, like completions.

    On the primary client a metrics poll waited behind its long completions
    (seconds on a busy server), and the scheduler adapted on stale figures.
    """
    gate = Gate()
    gets: list[int] = []

    class Probe(ShardProbe):
        def _new_client(self, limits: httpx.Limits) -> httpx.AsyncClient:
            client = super()._new_client(limits)
            index = len(self.made) - 1
            chat = client._transport

            async def handler(request: httpx.Request) -> httpx.Response:
                if request.method == "GET":
                    gets.append(index)
                    return httpx.Response(200, json={"data": [{"id": "m"}]})
                return await chat.handle_async_request(request)  # type: ignore[attr-defined]

            return httpx.AsyncClient(transport=httpx.MockTransport(handler))

    backend = Probe(gate)
    async with backend, anyio.create_task_group() as tg:
        for i in range(SHARD_CONNECTIONS):
            tg.start_soon(backend.chat, req(f"r{i}"))
        await wait_until(lambda: gate.waiting == SHARD_CONNECTIONS)
        assert [m.id for m in await backend.models()] == ["m"]
        assert gets == [1]  # a second client: the first one's connections are all busy
        assert [s.inflight for s in backend._shards.shards] == [SHARD_CONNECTIONS, 0]
        gate.open.set()
