"""EndpointPool: routing (affinity, round robin, least loaded), failover, aggregation."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest

from langgraph_batch._context import SiblingInfo, sibling_scope
from langgraph_batch.backends import (
    Backend,
    BackendCapabilities,
    ChatChunk,
    ChatRequest,
    ChatResponse,
    EndpointPool,
    EngineMetrics,
    ModelInfo,
    VLLMBackend,
    backend_from_url,
)
from langgraph_batch.backends.base import sibling_route_key
from langgraph_batch.backends.pool import affinity_key
from langgraph_batch.errors import BackendConnectionError, BackendServerError


class Starts:
    """Calls that reached a fake backend, awaitable without polling."""

    def __init__(self) -> None:
        self.cond = asyncio.Condition()

    async def notify(self) -> None:
        async with self.cond:
            self.cond.notify_all()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        async with self.cond:
            await self.cond.wait_for(predicate)


class PoolMemberBackend(Backend):
    """Records calls; can fail to connect, block, or report metrics."""

    def __init__(
        self,
        name: str,
        *,
        metrics: EngineMetrics | None = None,
        caps: BackendCapabilities | None = None,
    ) -> None:
        self.base_url = f"http://{name}"
        self.name = name
        self.calls: list[ChatRequest] = []
        self.batches: list[list[ChatRequest]] = []
        self.down = False
        self.error: Exception | None = None
        self.gate: asyncio.Event | None = None
        self.started = 0
        self.starts: Starts | None = None
        self._metrics = metrics
        self.closed = False
        self.healthy = True
        if caps is not None:
            self.capabilities = caps

    async def chat(
        self, request: ChatRequest, *, on_chunk: Callable[[ChatChunk], None] | None = None
    ) -> ChatResponse:
        self.calls.append(request)
        if self.down:
            raise BackendConnectionError(f"{self.name} refused", url=self.base_url)
        if self.error is not None:
            raise self.error
        self.started += 1
        if self.starts is not None:
            await self.starts.notify()
        if self.gate is not None:
            await self.gate.wait()
        if on_chunk is not None:
            on_chunk(ChatChunk(content=self.name))
        return ChatResponse(id=f"{self.name}-{len(self.calls)}", model="m", content=self.name)

    async def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]:
        self.batches.append(list(requests))
        if self.down:
            raise BackendConnectionError(f"{self.name} refused", url=self.base_url)
        return [
            ChatResponse(id=r.request_id, model="m", content=self.name, request_id=r.request_id)
            for r in requests
        ]

    async def metrics(self) -> EngineMetrics | None:
        if self.down:
            raise BackendConnectionError("down", url=self.base_url)
        return self._metrics

    async def health(self) -> bool:
        return self.healthy

    async def models(self) -> list[ModelInfo]:
        return [ModelInfo(id="shared"), ModelInfo(id=f"only-{self.name}")]

    async def aclose(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fakes(n: int, starts: Starts | None = None) -> list[PoolMemberBackend]:
    out = [PoolMemberBackend(f"r{i}") for i in range(n)]
    for b in out:
        b.starts = starts
    return out


def req(user: str = "hello", system: str = "sys", rid: str = "") -> ChatRequest:
    return ChatRequest(
        model="m",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        request_id=rid,
    )


def of_sibling(index: int, request: ChatRequest) -> ChatRequest:
    """The request as a fan_out sibling's model builds it: with its route key."""
    return replace(request, route_key=sibling_route_key(f"g/{index}"))


async def as_sibling(pool: EndpointPool, index: int, request: ChatRequest) -> str:
    resp = await pool.chat(of_sibling(index, request))
    assert resp.content is not None
    return resp.content


# ------------------------------------------------------------------ affinity


async def test_sibling_turns_stick_to_one_replica() -> None:
    pool = EndpointPool(fakes(4))
    for i in range(20):
        served = {await as_sibling(pool, i, req(f"turn {t} of {i}")) for t in range(3)}
        assert len(served) == 1, (i, served)


async def test_without_sibling_the_prefix_is_the_key() -> None:
    pool = EndpointPool(fakes(4))
    first = req("task A")
    later = ChatRequest(
        model="m",
        messages=[
            *first.messages,
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": "more"},
        ],
    )
    assert affinity_key(first) == affinity_key(later)
    assert affinity_key(first) != affinity_key(req("task B"))
    assert affinity_key(of_sibling(3, first)) == "sibling:g/3"
    # The pool reads no context variable: the key is the request's.
    with sibling_scope(SiblingInfo(group="g", index=3)):
        assert affinity_key(first) == affinity_key(later)
    a = (await pool.chat(first)).content
    assert [(await pool.chat(later)).content for _ in range(5)] == [a] * 5


async def test_different_siblings_spread_roughly_evenly() -> None:
    backends = fakes(4)
    pool = EndpointPool(backends)
    counts = Counter([await as_sibling(pool, i, req()) for i in range(1000)])
    assert set(counts) == {"r0", "r1", "r2", "r3"}
    assert all(170 <= c <= 330 for c in counts.values()), counts


async def test_bounded_load_overflows_a_hot_replica() -> None:
    starts = Starts()
    backends = fakes(4, starts)
    pool = EndpointPool(backends, load_factor=1.25)
    # Turn 1 of siblings 0..59 with no load: each lands on its ring position.
    homes = [await as_sibling(pool, i, req()) for i in range(60)]
    hot_name = homes[0]
    hot = backends[int(hot_name[1:])]
    same_home = [i for i, h in enumerate(homes) if h == hot_name]
    assert len(same_home) >= 5
    # Park turn 2 of three of them on the hot replica (they stick: remembered keys).
    hot.gate = asyncio.Event()
    parked = [asyncio.create_task(as_sibling(pool, i, req("t2"))) for i in same_home[:3]]
    await starts.wait_for(lambda: pool.inflight()[int(hot_name[1:])] == 3)
    # A fresh sibling whose ring home is the hot replica (found on an idle twin pool,
    # same ring): capacity = ceil(1.25 * 4 / 4) = 2 < 3 + 1, so it walks on.
    twin = EndpointPool(fakes(4))
    fresh = 60
    while await as_sibling(twin, fresh, req()) != hot_name:
        fresh += 1
    moved = await as_sibling(pool, fresh, req())
    assert moved != hot_name
    # Later turns of the moved sibling stick to where it went, even with the load gone.
    hot.gate.set()
    assert await asyncio.gather(*parked) == [hot_name] * 3
    assert pool.inflight() == (0, 0, 0, 0)
    assert await as_sibling(pool, fresh, req("turn 2")) == moved


async def test_affinity_lru_is_bounded() -> None:
    pool = EndpointPool(fakes(2), max_affinity_keys=5)
    for i in range(20):
        await as_sibling(pool, i, req())
    assert len(pool._affinity) == 5


# ------------------------------------------------------------------ failover


async def test_down_replica_fails_over_and_recovers_after_cooldown() -> None:
    backends = fakes(3)
    clock = Clock()
    pool = EndpointPool(backends, clock=clock, cooldown_s=5.0)
    home = await as_sibling(pool, 7, req())
    idx = [b.name for b in backends].index(home)
    backends[idx].down = True
    other = await as_sibling(pool, 7, req("turn 2"))
    assert other != home
    assert pool.is_down(idx)
    # The key re-routed: later turns stay on the new replica, the down one is not tried.
    calls_before = len(backends[idx].calls)
    assert await as_sibling(pool, 7, req("turn 3")) == other
    assert len(backends[idx].calls) == calls_before
    # After the cooldown the replica takes new keys again.
    backends[idx].down = False
    clock.now += 5.01
    assert not pool.is_down(idx)
    served = Counter([await as_sibling(pool, i, req()) for i in range(100, 160)])
    assert served[home] > 0


async def test_cooldown_doubles_on_repeated_failures() -> None:
    backends = fakes(2)
    clock = Clock()
    pool = EndpointPool(backends, clock=clock, cooldown_s=1.0, routing="round_robin")
    backends[0].down = True
    await pool.chat(req())
    await pool.chat(req())
    assert pool.is_down(0)
    clock.now += 1.01
    assert not pool.is_down(0)
    for _ in range(2):  # round robin reaches r0 again, which fails a second time
        await pool.chat(req())
    assert pool.is_down(0)
    clock.now += 1.5
    assert pool.is_down(0)  # second cooldown is 2 s
    clock.now += 0.6
    assert not pool.is_down(0)


async def test_all_down_raises_the_last_connection_error() -> None:
    backends = fakes(2)
    pool = EndpointPool(backends, clock=Clock())
    for b in backends:
        b.down = True
    with pytest.raises(BackendConnectionError, match="refused"):
        await pool.chat(req())
    assert pool.inflight() == (0, 0)
    # While both sit out their cooldown, no replica is even called.
    calls = sum(len(b.calls) for b in backends)
    with pytest.raises(BackendConnectionError):
        await pool.chat(req())
    assert sum(len(b.calls) for b in backends) == calls


async def test_non_connection_errors_do_not_fail_over() -> None:
    backends = fakes(2)
    pool = EndpointPool(backends, routing="round_robin")
    backends[0].error = BackendServerError("500", status_code=500)
    backends[1].error = BackendServerError("500", status_code=500)
    with pytest.raises(BackendServerError):
        await pool.chat(req())
    assert sum(len(b.calls) for b in backends) == 1
    assert not pool.is_down(0)
    assert not pool.is_down(1)


async def test_streamed_call_is_forwarded() -> None:
    pool = EndpointPool(fakes(2))
    chunks: list[ChatChunk] = []
    resp = await pool.chat(req(), on_chunk=chunks.append)
    assert [c.content for c in chunks] == [resp.content]


async def test_inflight_is_released_on_cancel() -> None:
    starts = Starts()
    backends = fakes(2, starts)
    for b in backends:
        b.gate = asyncio.Event()
    pool = EndpointPool(backends)
    task = asyncio.create_task(pool.chat(req()))
    await starts.wait_for(lambda: sum(b.started for b in backends) == 1)
    assert sum(pool.inflight()) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pool.inflight() == (0, 0)


# ------------------------------------------------------------------ other routings


async def test_round_robin_cycles_and_ignores_siblings() -> None:
    pool = EndpointPool(fakes(3), routing="round_robin")
    served = [await as_sibling(pool, 1, req()) for _ in range(6)]
    assert served == ["r0", "r1", "r2", "r0", "r1", "r2"]


async def test_least_loaded_picks_the_idlest_replica() -> None:
    starts = Starts()
    backends = fakes(3, starts)
    for b in backends:
        b.gate = asyncio.Event()
    pool = EndpointPool(backends, routing="least_loaded")
    t0 = asyncio.create_task(pool.chat(req()))
    t1 = asyncio.create_task(pool.chat(req()))
    await starts.wait_for(lambda: sum(b.started for b in backends) == 2)
    assert sorted(pool.inflight()) == [0, 1, 1]
    # Two calls parked; the third replica is idle (whichever replicas got the first two).
    idle = pool.inflight().index(0)
    backends[idle].gate = None
    assert (await pool.chat(req())).content == f"r{idle}"
    for b in backends:
        if b.gate is not None:
            b.gate.set()
    assert len({r.content for r in await asyncio.gather(t0, t1)}) == 2


# ------------------------------------------------------------------ batches and aggregates


async def test_complete_batch_groups_by_replica_and_keeps_order() -> None:
    backends = fakes(3)
    pool = EndpointPool(backends)
    requests = [of_sibling(i, req(f"prompt {i}", rid=f"id{i}")) for i in range(12)]
    out = await pool.complete_batch(requests)
    assert [r.request_id for r in out] == [r.request_id for r in requests]
    # One complete_batch call per replica used, each within the load bound.
    sizes = sorted(len(batch) for b in backends for batch in b.batches)
    assert sum(sizes) == 12
    assert len(sizes) == len({r.content for r in out})
    assert max(sizes) <= 5  # ceil(1.25 * 12 / 3)
    assert pool.inflight() == (0, 0, 0)
    # A conversation's later turns, sent by its sibling through chat (the runner
    # batched turn 1), follow turn 1's replica: both carry the sibling's key.
    for i, (request, first) in enumerate(zip(requests, out, strict=True)):
        later = ChatRequest(
            model="m",
            messages=[*request.messages, {"role": "assistant", "content": "a"}],
        )
        assert await as_sibling(pool, i, later) == first.content
        assert await as_sibling(pool, i, later) == first.content


async def test_identical_prefixes_of_different_siblings_still_spread() -> None:
    pool = EndpointPool(fakes(4))
    # Batched or not, a sibling's request routes on its own key.
    batched = (await pool.complete_batch([of_sibling(0, req())]))[0].content
    assert await as_sibling(pool, 0, req()) == batched
    counts = Counter([await as_sibling(pool, i, req()) for i in range(1, 401)])
    assert len(counts) == 4, counts


async def test_complete_batch_reroutes_a_down_replica() -> None:
    backends = fakes(2)
    backends[0].down = True
    pool = EndpointPool(backends, clock=Clock())
    out = await pool.complete_batch([req(f"p{i}", rid=str(i)) for i in range(10)])
    assert {r.content for r in out} == {"r1"}
    assert [r.request_id for r in out] == [str(i) for i in range(10)]


async def test_metrics_aggregate() -> None:
    a = PoolMemberBackend(
        "a",
        metrics=EngineMetrics(
            num_requests_running=3,
            num_requests_waiting=1,
            kv_cache_usage=0.2,
            num_preemptions_total=2,
            prefix_cache_queries_total=100,
            prefix_cache_hits_total=50,
            prompt_tokens_total=1000,
            generation_tokens_total=10,
            kv_capacity_tokens=4000,
            block_size=16,
            prefix_caching=True,
        ),
    )
    b = PoolMemberBackend(
        "b",
        metrics=EngineMetrics(
            num_requests_running=5,
            num_requests_waiting=0,
            kv_cache_usage=0.6,
            num_preemptions_total=1,
            prefix_cache_queries_total=100,
            prefix_cache_hits_total=100,
            prompt_tokens_total=500,
            generation_tokens_total=20,
            kv_capacity_tokens=6000,
            block_size=16,
            prefix_caching=True,
        ),
    )
    c = PoolMemberBackend("c")
    c.down = True  # an unreachable replica is left out
    m = await EndpointPool([a, b, c]).metrics()
    assert m is not None
    assert m.num_requests_running == 8
    assert m.num_requests_waiting == 1
    assert m.num_preemptions_total == 3
    assert m.prompt_tokens_total == 1500
    assert m.generation_tokens_total == 30
    assert m.kv_capacity_tokens == 10000
    assert m.kv_cache_usage == pytest.approx(0.4)
    assert m.cache_hit_rate == pytest.approx(0.75)
    assert m.block_size == 16
    assert m.prefix_caching is True
    assert m.engines == 2  # the replicas that answered (the decode cap is learned per engine)
    assert await EndpointPool([PoolMemberBackend("x")]).metrics() is None


async def test_health_models_close_key_capabilities() -> None:
    backends = fakes(3)
    pool = EndpointPool(backends)
    backends[0].healthy = False
    assert await pool.health()
    for b in backends:
        b.healthy = False
    assert not await pool.health()
    ids = [m.id for m in await pool.models()]
    assert ids == ["shared", "only-r0", "only-r1", "only-r2"]
    assert pool.key == EndpointPool(list(reversed(backends))).key
    assert pool.key != EndpointPool(backends, routing="round_robin").key
    await pool.aclose()
    assert all(b.closed for b in backends)

    prio = BackendCapabilities(priority=True, metrics=True, batch_completions=True, flavor="vllm")
    plain = BackendCapabilities(flavor="openai")
    caps = EndpointPool(
        [PoolMemberBackend("p", caps=prio), PoolMemberBackend("q", caps=plain)]
    ).capabilities
    assert (caps.priority, caps.metrics, caps.batch_completions, caps.flavor) == (
        False,
        True,
        False,
        "vllm",
    )
    assert EndpointPool([PoolMemberBackend("p", caps=prio)] * 2).capabilities.priority


@pytest.mark.parametrize(
    "kwargs",
    [{"routing": "random"}, {"load_factor": 0.5}, {"cooldown_s": 0}, {"virtual_nodes": 0}],
)
def test_bad_options(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        EndpointPool(fakes(2), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        EndpointPool([])


# ------------------------------------------------------------------ URL factory


async def test_url_with_host_list_builds_a_pool() -> None:
    pool = backend_from_url("vllm://h1:8000,h2:8000/v1, h3:8000", routing="round_robin")
    assert isinstance(pool, EndpointPool)
    assert pool.routing == "round_robin"
    assert [type(b) for b in pool.backends] == [VLLMBackend] * 3
    assert [b.base_url for b in pool.backends] == [
        "http://h1:8000",
        "http://h2:8000",
        "http://h3:8000",
    ]
    assert pool.capabilities.flavor == "vllm"
    await pool.aclose()
    single = backend_from_url("sglang://h1:30000", routing="affinity")
    assert not isinstance(single, EndpointPool)
    await single.aclose()
    with pytest.raises(ValueError, match="empty host"):
        backend_from_url("vllm://h1:8000,,h2:8000")
    with pytest.raises(ValueError, match="comma-separated"):
        backend_from_url("ftp://h1")


async def test_the_route_key_is_set_where_requests_are_built() -> None:
    from langgraph_batch.chat_model import BatchedChatModel
    from langgraph_batch.scheduler import Scheduler

    backend = PoolMemberBackend("a")
    info = SiblingInfo(group="g", index=7)
    # Scheduler.submit fills it from its sibling argument...
    async with Scheduler(backend) as scheduler:
        await scheduler.submit(req(), sibling=info)
        # ...and the chat model from the sibling it runs in.
        llm = BatchedChatModel(model="m", scheduler=scheduler)
        with sibling_scope(info):
            await llm.ainvoke("hi")
        await llm.ainvoke("hi")
    assert [r.route_key for r in backend.calls] == ["sibling:g/7", "sibling:g/7", None]
