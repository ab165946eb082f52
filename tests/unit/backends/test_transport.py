"""`ShardedTransport`: sharding, admission, pool timeout, cleanup on cancel, pool repair, errors."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anyio
import httpcore
import httpx
import pytest

from langgraph_batch.backends._transport import (
    SHARD_CONNECTIONS,
    CallInfo,
    ShardedTransport,
    map_transport_errors,
    mapped_error,
)
from langgraph_batch.backends.base import ChatChunk, ChatRequest
from langgraph_batch.backends.openai_compat import OpenAICompatibleBackend
from langgraph_batch.errors import (
    BackendConnectionError,
    BackendStreamError,
    BackendTimeoutError,
    PoolTimeoutError,
)
from tests.fakes.http import chunk, completion, sse

URL = "http://engine:8000/v1/chat/completions"


class Gate:
    """Holds every request in its shard until `open` is set; counts who waits."""

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


class Probe:
    """A shard factory of MockTransports that tag the requests they get."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.made: list[httpx.Limits] = []
        self.seen: list[list[str]] = []  # per shard: the request ids it received

    def __call__(self, limits: httpx.Limits) -> httpx.AsyncBaseTransport:
        index = len(self.made)
        self.made.append(limits)
        self.seen.append([])
        gate = self.gate

        async def handler(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content)
            self.seen[index].append(body["rid"])
            if body.get("stream"):
                return httpx.Response(
                    200, stream=GatedStream(gate), headers={"content-type": "text/event-stream"}
                )
            gate.waiting += 1
            await gate.open.wait()
            return httpx.Response(200, json=completion("ok"))

        return httpx.MockTransport(handler)


class ProbedBackend(OpenAICompatibleBackend):
    """A backend whose transport shards over `Probe` MockTransports."""

    def __init__(self, probe: Probe, **kwargs: Any) -> None:
        super().__init__("http://engine:8000", **kwargs)
        limits = kwargs.get("limits") or httpx.Limits(max_connections=1024)
        self._transport = ShardedTransport(
            limits=limits, pool_timeout=kwargs.get("pool_timeout", 30.0), shard_factory=probe
        )
        self._client._transport = self._transport

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


def active_per_shard(backend: OpenAICompatibleBackend) -> list[int]:
    return [s.active for s in backend.transport._shards]


# ------------------------------------------------------------------------ sharding


async def test_shards_respect_the_total_limit_and_the_rest_wait_in_order() -> None:
    gate = Gate()
    probe = Probe(gate)
    total = 2 * SHARD_CONNECTIONS + SHARD_CONNECTIONS // 2
    limits = httpx.Limits(max_connections=total, max_keepalive_connections=total // 2)
    backend = ProbedBackend(probe, limits=limits)
    results: list[str | None] = []

    async def one(i: int) -> None:
        results.append((await backend.chat(req(f"r{i}"))).content)

    async with backend, anyio.create_task_group() as tg:
        for i in range(200):  # far more than the limit: the rest wait for a slot
            tg.start_soon(one, i)
        await wait_until(lambda: gate.waiting == total)
        # Only as many shards as the limit allows, and their limits add up to it.
        assert [lim.max_connections for lim in probe.made] == [SHARD_CONNECTIONS] * 2 + [
            SHARD_CONNECTIONS // 2
        ]
        assert sum(lim.max_keepalive_connections or 0 for lim in probe.made) <= total // 2
        assert all(lim.max_keepalive_connections for lim in probe.made)
        state = backend.transport.state()
        assert (state.requests_active, state.requests_waiting) == (total, 200 - total)
        assert active_per_shard(backend) == [SHARD_CONNECTIONS] * 2 + [SHARD_CONNECTIONS // 2]
        gate.open.set()
    assert results == ["ok"] * 200
    assert active_per_shard(backend) == [0, 0, 0]
    seen = [rid for per_shard in probe.seen for rid in per_shard]
    assert sorted(seen) == sorted(f"r{i}" for i in range(200))


async def test_waiters_are_served_in_arrival_order() -> None:
    gate = Gate()
    backend = ProbedBackend(Probe(gate), limits=httpx.Limits(max_connections=1))
    order: list[int] = []

    async def one(i: int) -> None:
        await backend.chat(req(f"r{i}"))
        order.append(i)

    async with backend, anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(one, i)
            await wait_until(lambda i=i: backend.transport.state().requests_waiting == i)
        gate.open.set()
    assert order == [0, 1, 2, 3, 4]


async def test_shards_are_created_on_demand_only() -> None:
    gate = Gate()
    gate.open.set()
    probe = Probe(gate)
    async with ProbedBackend(probe) as backend:
        for i in range(3 * SHARD_CONNECTIONS):  # one at a time: one shard is enough
            await backend.chat(req(f"r{i}"))
        assert len(probe.made) == 1
        assert probe.made[0].max_connections == SHARD_CONNECTIONS


async def test_a_get_does_not_wait_behind_completions_on_a_full_shard() -> None:
    """`models()`/`metrics()` get a free connection like any request.

    A metrics poll that queued behind long completions (seconds on a busy
    server) made the scheduler adapt on stale load figures.
    """
    gate = Gate()
    probe = Probe(gate)
    gets: list[int] = []
    make = probe.__call__

    def factory(limits: httpx.Limits) -> httpx.AsyncBaseTransport:
        index = len(probe.made)
        chat = make(limits)

        async def handler(request: httpx.Request) -> httpx.Response:
            if request.method == "GET":
                gets.append(index)
                return httpx.Response(200, json={"data": [{"id": "m"}]})
            return await chat.handle_async_request(request)

        return httpx.MockTransport(handler)

    backend = ProbedBackend(probe)
    backend.transport._factory = factory
    async with backend, anyio.create_task_group() as tg:
        for i in range(SHARD_CONNECTIONS):
            tg.start_soon(backend.chat, req(f"r{i}"))
        await wait_until(lambda: gate.waiting == SHARD_CONNECTIONS)
        with anyio.fail_after(2):
            assert [m.id for m in await backend.models()] == ["m"]
        assert gets == [1]  # a second shard: the first one's connections are all busy
        gate.open.set()


async def test_a_stream_keeps_its_slot_until_it_is_closed() -> None:
    gate = Gate()
    probe = Probe(gate)
    backend = ProbedBackend(probe, limits=httpx.Limits(max_connections=2 * SHARD_CONNECTIONS))
    first_chunk: set[str] = set()
    results: dict[str, str | None] = {}

    async def one(rid: str) -> None:
        def on_chunk(c: ChatChunk) -> None:
            first_chunk.add(rid)

        results[rid] = (await backend.chat(req(rid, stream=True), on_chunk=on_chunk)).content

    rids = [f"s{i}" for i in range(20)]
    async with backend, anyio.create_task_group() as tg:
        for rid in rids:
            tg.start_soon(one, rid)
        await wait_until(lambda: len(first_chunk) == 2 * SHARD_CONNECTIONS)
        assert active_per_shard(backend) == [len(seen) for seen in probe.seen]
        assert backend.transport.state().requests_waiting == 20 - 2 * SHARD_CONNECTIONS
        gate.open.set()
    assert results == dict.fromkeys(rids, "ab")
    assert active_per_shard(backend) == [0, 0]


async def test_a_cancelled_stream_gives_its_slot_back() -> None:
    gate = Gate()
    backend = ProbedBackend(Probe(gate))
    got: list[ChatChunk] = []
    async with backend:
        with anyio.move_on_after(0.05):
            await backend.chat(req("c", stream=True), on_chunk=got.append)
        assert len(got) == 1
        await wait_until(lambda: backend.transport.state().requests_active == 0)


def test_small_or_unlimited_totals() -> None:
    made: list[httpx.Limits] = []

    def make(limits: httpx.Limits) -> httpx.AsyncBaseTransport:
        made.append(limits)
        return httpx.MockTransport(lambda r: httpx.Response(200))

    small = httpx.Limits(max_connections=SHARD_CONNECTIONS, max_keepalive_connections=4)
    t = ShardedTransport(limits=small, shard_factory=make)
    for _ in range(SHARD_CONNECTIONS):
        assert t._try_acquire() is not None
    assert t._try_acquire() is None  # full: a request would wait
    assert made == [small]  # within one shard: the caller's limits as they are

    made.clear()
    t = ShardedTransport(
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        shard_factory=make,
    )
    for _ in range(3 * SHARD_CONNECTIONS + 1):
        assert t._try_acquire() is not None
    assert [lim.max_connections for lim in made] == [SHARD_CONNECTIONS] * 4
    assert all(lim.max_keepalive_connections is None for lim in made)

    with pytest.raises(ValueError, match="shard_connections"):
        ShardedTransport(shard_connections=0)
    with pytest.raises(ValueError, match="max_connections"):
        ShardedTransport(limits=httpx.Limits(max_connections=0))
    with pytest.raises(ValueError, match="pool_timeout"):
        ShardedTransport(pool_timeout=0)


async def test_custom_transport_is_one_shard_with_mapped_errors() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["messages"][0]["content"] == "boom":
            raise httpx.ConnectError("[Errno 111] Connection refused")
        return httpx.Response(200, json=completion("x"))

    transport = httpx.MockTransport(handler)
    async with OpenAICompatibleBackend("http://engine:8000", transport=transport) as backend:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                for i in range(100):
                    tg.start_soon(backend.chat, req(f"t{i}"))
        assert backend.transport.state().shards == 1
        boom = ChatRequest(model="m", messages=[{"role": "user", "content": "boom"}])
        with pytest.raises(BackendConnectionError, match="is the server running"):
            await backend.chat(boom)
        assert backend.transport.state().requests_active == 0


# ------------------------------------------------------------------------ pool timeout


async def test_pool_timeout_is_a_typed_retryable_error() -> None:
    gate = Gate()
    backend = ProbedBackend(Probe(gate), limits=httpx.Limits(max_connections=1), pool_timeout=0.05)
    async with backend:
        first = asyncio.create_task(backend.chat(req("holder")))
        await wait_until(lambda: gate.waiting == 1)
        with pytest.raises(PoolTimeoutError, match=r"became free within 0\.05 s") as info:
            await backend.chat(req("late"))
        err = info.value
        assert isinstance(err, BackendTimeoutError)
        assert err.is_retryable
        assert (err.pool_timeout_s, err.max_connections) == (0.05, 1)
        assert err.request_id == "late"
        gate.open.set()
        assert (await first).content == "ok"
        assert (await backend.chat(req("after"))).content == "ok"  # the slot is free again
        assert backend.transport.state().requests_waiting == 0


async def test_a_waiter_granted_a_slot_as_it_is_cancelled_hands_it_on() -> None:
    t = ShardedTransport(limits=httpx.Limits(max_connections=1), shard_factory=Probe(Gate()))
    shard = t._try_acquire()
    assert shard is not None
    request = httpx.Request("POST", URL)
    waiter = asyncio.create_task(t._acquire(request))
    nxt = asyncio.create_task(t._acquire(request))
    await wait_until(lambda: len(t._waiters) == 2)
    t._release_slot(shard)  # grants the slot to `waiter` ...
    waiter.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await nxt is shard  # the slot went on to the next waiter
    assert t.state().requests_active == 1


# ------------------------------------------------------------------ cleanup and repair


class FakeConn:
    def __init__(self, state: str = "IDLE") -> None:
        self.state = state

    def is_idle(self) -> bool:
        return self.state == "IDLE"

    def is_closed(self) -> bool:
        return self.state == "CLOSED"


class SlowCloseStream(httpx.AsyncByteStream):
    """A body whose close takes a while (a TLS goodbye, a slow socket)."""

    def __init__(self, conn: FakeConn, closing: asyncio.Event, release: asyncio.Event) -> None:
        self.conn = conn
        self.closing = closing
        self.release = release

    async def __aiter__(self) -> Any:
        yield sse(chunk(content="a"), done=False)
        await asyncio.Event().wait()  # never more

    async def aclose(self) -> None:
        self.closing.set()
        await self.release.wait()
        self.conn.state = "IDLE"


class FakePool(httpx.AsyncBaseTransport):
    """A shard whose connections the test controls (httpcore's introspection shape)."""

    def __init__(self, owner: FakePools) -> None:
        self.owner = owner
        self.connections: list[FakeConn] = []
        self.closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        conn = FakeConn("ACTIVE")
        self.connections.append(conn)
        mode = json.loads(request.content)["messages"][0]["content"]
        if mode == "orphan":
            # httpcore's failure: the request dies and its connection stays busy.
            await asyncio.sleep(0)
            raise httpcore.ReadError("connection reset")
        if mode == "slow-close":
            return httpx.Response(
                200,
                stream=SlowCloseStream(conn, self.owner.closing, self.owner.release),
                headers={"content-type": "text/event-stream"},
            )
        await self.owner.gate.wait()
        conn.state = "IDLE"
        return httpx.Response(200, json=completion("ok"))

    async def aclose(self) -> None:
        self.closed = True


class FakePools:
    def __init__(self) -> None:
        self.pools: list[FakePool] = []
        self.gate = asyncio.Event()
        self.closing = asyncio.Event()
        self.release = asyncio.Event()

    def __call__(self, limits: httpx.Limits) -> httpx.AsyncBaseTransport:
        pool = FakePool(self)
        self.pools.append(pool)
        return pool


def fake_backend(pools: FakePools) -> OpenAICompatibleBackend:
    backend = OpenAICompatibleBackend("http://engine:8000")
    backend._transport = ShardedTransport(shard_factory=pools)
    backend._client._transport = backend._transport
    return backend


def msg(text: str, *, stream: bool = False) -> ChatRequest:
    return ChatRequest(model="m", messages=[{"role": "user", "content": text}], stream=stream)


async def test_a_pool_holding_a_connection_nobody_owns_is_replaced_and_closed() -> None:
    pools = FakePools()
    async with fake_backend(pools) as backend:
        busy = asyncio.create_task(backend.chat(msg("hold")))  # a live request on the pool
        await wait_until(lambda: backend.transport.state().requests_active == 1)
        with pytest.raises(BackendConnectionError, match="before a response"):
            await backend.chat(msg("orphan"))
        state = backend.transport.state()
        assert state.pools_repaired == 1
        assert len(pools.pools) == 2  # new requests go to a fresh pool
        assert state.pools_draining == 1  # the old one waits for its live request
        assert not pools.pools[0].closed
        pools.gate.set()
        assert (await busy).content == "ok"
        await wait_until(lambda: pools.pools[0].closed)
        assert backend.transport.state().pools_draining == 0
        assert (await backend.chat(msg("next"))).content == "ok"
        assert len(pools.pools[1].connections) == 1


async def test_a_second_cancellation_cannot_interrupt_the_close() -> None:
    pools = FakePools()
    async with fake_backend(pools) as backend:
        got: list[ChatChunk] = []
        call = asyncio.create_task(
            backend.chat(msg("slow-close", stream=True), on_chunk=got.append)
        )
        await wait_until(lambda: len(got) == 1)
        call.cancel()
        await pools.closing.wait()
        call.cancel()  # again, while the transport closes the response
        with pytest.raises(asyncio.CancelledError):
            await call
        # The close goes on in its own task: the slot is held until it is done ...
        assert backend.transport.state().requests_active == 1
        pools.release.set()
        await wait_until(lambda: backend.transport.state().requests_active == 0)
        # ... and the connection it closed is idle: nothing to repair.
        assert backend.transport.state().pools_repaired == 0
        assert backend.transport.state().connections_active == 0


# ------------------------------------------------------------------------ error map


@pytest.mark.parametrize(
    ("exc", "expected", "match"),
    [
        (httpx.ConnectError("refused"), BackendConnectionError, "is the server running"),
        (httpcore.ConnectError("refused"), BackendConnectionError, "is the server running"),
        (httpx.ReadError("reset"), BackendConnectionError, "before a response"),
        (httpcore.ReadError("reset"), BackendConnectionError, "before a response"),
        (
            httpcore.RemoteProtocolError("Server disconnected without sending a response."),
            BackendConnectionError,
            "before a response",
        ),
        (ConnectionResetError(104, "reset"), BackendConnectionError, "before a response"),
        (httpx.ReadTimeout("slow"), BackendTimeoutError, r"read timeout \(5.0 s\)"),
        (httpcore.ReadTimeout("slow"), BackendTimeoutError, r"read timeout \(5.0 s\)"),
        (httpx.ConnectTimeout("slow"), BackendTimeoutError, "connecting"),
        (httpcore.PoolTimeout("full"), PoolTimeoutError, "no connection"),
        (httpx.PoolTimeout("full"), PoolTimeoutError, "no connection"),
        (httpx.UnsupportedProtocol("ftp"), BackendConnectionError, "http:// or https://"),
        (httpx.DecodingError("gzip"), BackendStreamError, "could not decode"),
    ],
)
def test_send_phase_mapping(exc: Exception, expected: type[Exception], match: str) -> None:
    with (
        pytest.raises(expected, match=match) as info,
        map_transport_errors(URL, request_id="r9", read_timeout=5.0),
    ):
        raise exc
    assert type(info.value) is expected
    assert info.value.__cause__ is exc
    assert info.value.request_id == "r9"  # type: ignore[attr-defined]
    assert info.value.is_retryable  # type: ignore[attr-defined]


def test_body_phase_mapping_names_the_chunks() -> None:
    err = mapped_error(httpcore.ReadError("reset"), URL, phase="stream", chunks=3)
    assert isinstance(err, BackendStreamError)
    assert err.chunks_received == 3
    assert "3 chunks received" in str(err)
    # A body read whole reached nobody yet: a connection error, safe to retry.
    err = mapped_error(httpcore.RemoteProtocolError("peer closed"), URL, phase="body")
    assert type(err) is BackendConnectionError
    assert "while the response was read" in str(err)
    err = mapped_error(httpx.ReadTimeout("slow"), URL, phase="stream", chunks=2, read_timeout=9.0)
    assert isinstance(err, BackendTimeoutError)
    assert "stopped sending for 9.0 s after 2 chunks" in str(err)


def test_other_exceptions_pass_through() -> None:
    assert mapped_error(KeyError("x"), URL) is None
    with pytest.raises(KeyError), map_transport_errors(URL):
        raise KeyError("x")


async def test_body_errors_carry_the_callers_chunk_count() -> None:
    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self) -> Any:
            yield sse(chunk(content="a"), chunk(content="b"), done=False)
            raise httpcore.ReadError("connection reset by peer")

    transport = ShardedTransport(
        shard_factory=lambda limits: httpx.MockTransport(
            lambda r: httpx.Response(200, stream=Broken())
        )
    )
    async with httpx.AsyncClient(transport=transport) as client:
        info = CallInfo(request_id="r1", stream=True, chunks=7)

        async def read() -> None:
            async with client.stream("GET", URL, extensions={"lgb": info}) as response:
                async for _ in response.aiter_bytes():
                    pass

        with pytest.raises(BackendStreamError, match="7 chunks received") as err:
            await read()
        assert err.value.request_id == "r1"
        assert transport.state().requests_active == 0
