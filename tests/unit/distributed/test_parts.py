"""Keys, configuration checks, the coalescer and registry hooks, the CLI (no network)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Any, cast

import pytest

from langgraph_batch._redact import safe_url
from langgraph_batch.backends.base import Backend, ChatRequest, ChatResponse
from langgraph_batch.backends.openai_compat import OpenAICompatibleBackend
from langgraph_batch.distributed import ClusterLimitedBackend, RedisExecutor, Worker
from langgraph_batch.distributed._keys import (
    RunKeys,
    attach_key,
    new_run_id,
    semaphore_key,
    sibling_group,
)
from langgraph_batch.distributed._redis_flight import key_digest
from langgraph_batch.distributed._semaphore import endpoint_key, limit_backends
from langgraph_batch.distributed.cli import main as worker_main
from langgraph_batch.scheduler import registry
from langgraph_batch.tools._singleflight import Coalescer, set_flight_store

GRAPH = "tests.integration.distributed.graphs:sleepy"


def test_run_keys_share_one_hash_tag_and_the_acl_prefix() -> None:
    run = RunKeys(new_run_id())
    keys = [*run.all(), *run.flight("abc")]
    assert all(k.startswith(f"{{lgb:{run.run_id}}}:") for k in keys)
    assert len(set(keys)) == len(keys)
    for key in (attach_key("g", "t", "ns", None), semaphore_key("VLLMBackend:http://x")):
        assert key.startswith("{lgb:")


def test_run_ids_are_random_and_not_leaked_by_the_sibling_group() -> None:
    a, b = new_run_id(), new_run_id()
    assert a != b
    assert len(a) == 32
    assert sibling_group(a) != sibling_group(b)
    assert a not in sibling_group(a)
    assert sibling_group(a)[:8] not in a


def test_attach_key_is_stable_and_keyed_by_the_secret() -> None:
    plain = attach_key("g", "thread", "fan:1", None)
    assert plain == attach_key("g", "thread", "fan:1", None)
    assert plain != attach_key("g", "thread", "fan:2", None)
    keyed = attach_key("g", "thread", "fan:1", b"s3cret")
    assert keyed != plain
    assert keyed != attach_key("g", "thread", "fan:1", b"other")


def test_key_digest_only_for_plain_keys() -> None:
    assert key_digest(("search", '{"q":"x"}')) == key_digest(("search", '{"q":"x"}'))
    assert key_digest(("search", 1)) != key_digest(("search", "1"))
    assert key_digest(("search", object())) is None
    assert key_digest(frozenset({1})) is None


def test_safe_url_hides_the_password() -> None:
    assert safe_url("redis://user:pw@host:6379/0") == "redis://user:***@host:6379/0"
    assert safe_url("rediss://:pw@host/0") == "rediss://***@host/0"
    assert safe_url("redis://host:6379/0") == "redis://host:6379/0"
    assert "pw" not in repr(RedisExecutor("redis://u:pw@h:1/0", graph=GRAPH))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"graph": "no_colon"}, "import path"),
        ({"graph": GRAPH, "lease_s": 0}, "lease_s"),
        ({"graph": GRAPH, "max_deliveries": 0}, "max_deliveries"),
        ({"graph": GRAPH, "timeout": -1}, "timeout"),
        ({"graph": GRAPH, "ttl_s": 10, "lease_s": 30}, "twice"),
        ({"graph": GRAPH, "max_payload_bytes": 0}, "max_payload_bytes"),
    ],
)
def test_executor_options_are_checked(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RedisExecutor("redis://127.0.0.1:6379/0", **kwargs)


def test_worker_options_and_graph_path_are_checked() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        Worker("redis://x:1/0", GRAPH, concurrency=0)
    with pytest.raises(ValueError, match="max_active"):
        Worker("redis://x:1/0", GRAPH, max_active=0)
    assert Worker("redis://x:1/0", GRAPH, max_active=3).admission.stats().max_active == 3
    with pytest.raises(ValueError, match=r"package\.module:attribute"):
        Worker("redis://x:1/0", "nocolon")
    with pytest.raises(TypeError, match="not a graph"):
        Worker("redis://x:1/0", "tests.integration.distributed.graphs:log")
    with pytest.raises(ImportError):
        Worker("redis://x:1/0", "no_such_module_xyz:graph")


def test_worker_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        worker_main(["--help"])
    assert info.value.code == 0
    assert "--cluster-inflight" in capsys.readouterr().out
    assert worker_main(["redis://127.0.0.1:1/0", "no_such_module_xyz:graph"]) == 2


class _Store:
    def __init__(self) -> None:
        self.calls: list[tuple[Hashable, Hashable, float | None]] = []

    async def run(
        self,
        scope: Hashable,
        key: Hashable,
        fn: Callable[[], Awaitable[Any]],
        storable: Callable[[Any], bool],
        *,
        ttl: float | None = None,
    ) -> Any:
        self.calls.append((scope, key, ttl))
        return await fn()


async def test_coalescer_routes_kept_scoped_executions_through_the_flight_store() -> None:
    store = _Store()
    previous = set_flight_store(store)
    try:
        c: Coalescer[str] = Coalescer(ttl=30.0)

        async def fn() -> str:
            return "v"

        assert await c.run("k", fn, scope="run-1", keep=True) == "v"
        assert await c.run("k", fn, keep=True) == "v"  # unscoped: process-local only
        # In-flight sharing only (scope="inflight"): never leaves the process,
        # or a late caller on another worker would get a result kept for it.
        assert await c.run("k2", fn, scope="run-1") == "v"
    finally:
        assert set_flight_store(previous) is store
    assert store.calls == [("run-1", "k", 30.0)]


async def test_cluster_cap_is_per_endpoint_whatever_the_credentials() -> None:
    a = OpenAICompatibleBackend("http://127.0.0.1:9", api_key="sk-a")
    b = OpenAICompatibleBackend("http://127.0.0.1:9", api_key="sk-b")
    other = OpenAICompatibleBackend("http://127.0.0.1:10", api_key="sk-a")
    assert a.key != b.key  # schedulers are per credential...
    assert endpoint_key(a) == endpoint_key(b) != endpoint_key(other)  # ...the cap per server
    assert "sk-" not in endpoint_key(a)
    wrap = limit_backends(object(), limit=3, lease_s=1.0, scripts=cast(Any, object()))
    wa, wb, wo = (cast(ClusterLimitedBackend, wrap(x)) for x in (a, b, other))
    assert wa.semaphore is wb.semaphore is not wo.semaphore
    assert wa.key == a.key  # the scheduler still sees the credential-keyed backend
    for backend in (a, b, other):
        await backend.aclose()


class _Inner(Backend):
    base_url = "http://inner"

    async def chat(self, request: ChatRequest, *, on_chunk: Any = None) -> ChatResponse:
        return ChatResponse(id="1", model="m", content="ok")

    async def complete_batch(self, requests: Any) -> list[ChatResponse]:
        return [ChatResponse(id=str(i), model="m") for i, _ in enumerate(requests)]


class _Sem:
    limit = 2

    def __init__(self) -> None:
        self.held: list[int] = []

    @contextlib.asynccontextmanager
    async def hold(self, n: int = 1) -> AsyncIterator[None]:
        self.held.append(n)
        yield


async def test_cluster_limited_backend_holds_one_lease_per_request() -> None:
    sem = _Sem()
    backend = ClusterLimitedBackend(_Inner(), sem)  # type: ignore[arg-type]
    assert backend.key == _Inner().key
    assert backend.base_url == "http://inner"
    assert (await backend.chat(ChatRequest(model="m", messages=[]))).content == "ok"
    out = await backend.complete_batch([ChatRequest(model="m", messages=[])] * 5)
    assert len(out) == 5
    assert sem.held == [1, 2, 2, 1]  # batches split at the cluster limit


async def test_registry_backend_wrapper_wraps_new_schedulers() -> None:
    wrapped: list[Backend] = []

    def wrap(b: Backend) -> Backend:
        wrapped.append(b)
        return ClusterLimitedBackend(b, _Sem())  # type: ignore[arg-type]

    previous = registry.set_backend_wrapper(wrap)
    try:
        s = registry.scheduler_for(key="k-wrap", backend_factory=_Inner)
        assert isinstance(s.backend, ClusterLimitedBackend)
        assert len(wrapped) == 1
    finally:
        registry.set_backend_wrapper(previous)
        registry._by_loop.clear()
        registry._names_by_loop.clear()
    plain = registry.scheduler_for(key="k-plain", backend_factory=_Inner)
    assert isinstance(plain.backend, _Inner)
    registry._by_loop.clear()


class _AbsorbingScripts:
    """Lease scripts whose acquire absorbs a cancellation and answers "no lease" (0),
    as a redis-py call was seen to do: the caller's task keeps `cancelling() == 1`."""

    def __init__(self) -> None:
        self.acquires = 0
        self.released: list[Any] = []
        self.in_acquire = asyncio.Event()

    async def sem_acquire(self, *, keys: Any, args: Any) -> int:
        self.acquires += 1
        self.in_acquire.set()
        with contextlib.suppress(asyncio.CancelledError):  # the lost cancellation
            await asyncio.sleep(0.01)
        return 0

    async def sem_release(self, *, keys: Any, args: Any) -> int:
        self.released.append(args)
        return 1

    async def sem_renew(self, *, keys: Any, args: Any) -> int:
        with contextlib.suppress(asyncio.CancelledError):  # lost here too
            await asyncio.sleep(0.02)
        return len(args) - 1


@pytest.mark.parametrize("timeout", [0, -1.0])
def test_semaphore_refuses_a_non_positive_unavailable_timeout_at_construction(
    timeout: float,
) -> None:
    # RedisWait refuses it too, but only once a call first waits for a lease:
    # inside a model call, far from the mistake.
    from langgraph_batch.distributed._semaphore import RedisSemaphore

    with pytest.raises(ValueError, match="unavailable_timeout"):
        RedisSemaphore(object(), key="{lgb:sem:t}", limit=1, unavailable_timeout=timeout)


async def test_a_cancelled_lease_wait_ends_even_when_a_call_absorbs_the_cancel() -> None:
    from langgraph_batch.distributed._semaphore import RedisSemaphore

    scripts = _AbsorbingScripts()
    sem = RedisSemaphore(object(), key="{lgb:sem:t}", limit=1, scripts=cast(Any, scripts))

    async def wait_for_a_lease() -> None:
        async with sem.hold():
            raise AssertionError("no lease was granted")

    waiter = asyncio.create_task(wait_for_a_lease())
    await scripts.in_acquire.wait()  # inside the first acquire call
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiter, 2.0)
    assert scripts.acquires == 1  # no second poll after the cancel
    assert len(scripts.released) == 1  # the holder id is released all the same


async def test_a_lease_renewer_stops_even_when_a_call_absorbs_its_cancel() -> None:
    from langgraph_batch.distributed._semaphore import RedisSemaphore

    class Granting(_AbsorbingScripts):
        async def sem_acquire(self, *, keys: Any, args: Any) -> int:
            return 1

    sem = RedisSemaphore(
        object(), key="{lgb:sem:r}", limit=1, lease_s=0.003, scripts=cast(Any, Granting())
    )
    async with sem.hold():
        await asyncio.sleep(0.05)  # the renewer spends ~95% of its time inside sem_renew
        (renewer,) = [t for t in asyncio.all_tasks() if "_renew" in repr(t.get_coro())]
    await asyncio.wait_for(asyncio.wait({renewer}), 2.0)
    assert renewer.cancelled()
