"""Prefix warming: the pure policy with explicit clocks, the prefix key, the runner."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from langgraph_batch.backends.base import (
    Backend,
    BackendCapabilities,
    ChatChunk,
    ChatRequest,
    ChatResponse,
)
from langgraph_batch.errors import BackendBadRequestError
from langgraph_batch.scheduler import BatchPolicy, Scheduler
from langgraph_batch.scheduler._item import (
    HELD,
    QUEUED,
    RUNNING,
    WITHDRAWN,
    Outcome,
    PolicyItem,
)
from langgraph_batch.scheduler._policy import Planner
from langgraph_batch.scheduler._prefix import prefix_key
from tests.fakes.backends import response


def core(*, warming: bool = True, **kw: object) -> Planner:
    batching = bool(kw.pop("batching", False))
    return Planner(BatchPolicy(**kw), batching=batching, warming=warming)  # type: ignore[arg-type]


def its(prefix: object, *turns: int, **kw: object) -> list[PolicyItem]:
    return [PolicyItem(turn=t, prefix=prefix, **kw) for t in turns]  # type: ignore[arg-type]


def dispatched(c: Planner, now: float) -> list[PolicyItem]:
    return c.plan(now).dispatch


# ---------------------------------------------------------------- the policy


def test_same_prefix_held_until_leader_first_token() -> None:
    c = core(inflight_limit=8)
    lead, *rest = its("P", 0, 0, 0, 0)
    for it in (lead, *rest):
        c.enqueue(it, 0.0)
    assert dispatched(c, 0.0) == [lead]
    assert lead.leading
    assert lead.state == RUNNING
    assert [it.state for it in rest] == [HELD] * 3
    assert (c.queued, c.stats().held, c.ready, c.in_flight) == (3, 3, 0, 1)
    assert dispatched(c, 0.5) == []  # nothing moves on the clock alone
    assert c.on_first_token(lead, 1.0) is True
    assert not lead.leading
    assert dispatched(c, 1.0) == rest
    assert c.is_warm("P", 1.0)
    assert (c.stats().warmups, c.stats().held_total, c.stats().held_s) == (1, 3, pytest.approx(3.0))
    # A second first-token report changes nothing.
    assert c.on_first_token(lead, 1.1) is False


def test_completion_without_first_token_also_warms() -> None:
    c = core(inflight_limit=8)
    lead, f = its("P", 0, 0)
    c.enqueue(lead, 0.0)
    c.enqueue(f, 0.0)
    assert dispatched(c, 0.0) == [lead]
    c.on_complete(lead, Outcome.OK, 2.0)
    assert dispatched(c, 2.0) == [f]
    assert not f.leading


def test_different_prefixes_are_independent() -> None:
    c = core(inflight_limit=8)
    a1, a2 = its("A", 0, 0)
    b1, b2 = its("B", 0, 0)
    none = PolicyItem(turn=0)
    for it in (a1, a2, b1, b2, none):
        c.enqueue(it, 0.0)
    assert dispatched(c, 0.0) == [a1, b1, none]
    c.on_first_token(b1, 1.0)
    assert dispatched(c, 1.0) == [b2]
    assert a2.state == HELD
    c.on_first_token(a1, 2.0)
    assert dispatched(c, 2.0) == [a2]
    assert c.stats().warmups == 2


def test_leader_failure_hands_the_lead_to_the_best_held_item() -> None:
    c = core(inflight_limit=8)
    lead, low, high, mid = its("P", 5, 0, 9, 3)
    for it in (lead, low, high, mid):
        c.enqueue(it, 0.0)
    assert dispatched(c, 0.0) == [lead]
    c.on_complete(lead, Outcome.ERROR, 1.0)
    # depth_first: turn 9 is the best held item; it warms alone.
    assert dispatched(c, 1.0) == [high]
    assert high.leading
    assert c.stats().held == 2
    # The failed leader retries: it is held behind the new leader.
    c.enqueue(lead, 1.0)
    assert lead.state == HELD
    assert not lead.leading
    c.on_first_token(high, 2.0)
    assert dispatched(c, 2.0) == [lead, mid, low]  # priority order among the released
    assert c.stats().warmups == 2


def test_leader_failure_with_no_followers_leaves_the_prefix_cold() -> None:
    c = core(inflight_limit=8)
    (lead,) = its("P", 0)
    c.enqueue(lead, 0.0)
    dispatched(c, 0.0)
    c.on_complete(lead, Outcome.RATE_LIMITED, 1.0)
    assert not c.is_warm("P", 1.0)
    (nxt,) = its("P", 0)
    c.enqueue(nxt, 2.0)
    assert dispatched(c, 2.0) == [nxt]
    assert nxt.leading


def test_cancelled_running_leader_releases_the_next() -> None:
    c = core(inflight_limit=8)
    lead, f1, f2 = its("P", 0, 0, 0)
    for it in (lead, f1, f2):
        c.enqueue(it, 0.0)
    dispatched(c, 0.0)
    c.on_complete(lead, Outcome.CANCELLED, 1.0)
    assert dispatched(c, 1.0) == [f1]
    assert f1.leading
    assert f2.state == HELD


def test_withdrawn_queued_leader_releases_the_next() -> None:
    c = core(inflight_limit=1)
    blocker = PolicyItem(turn=0)
    lead, f1, f2 = its("P", 0, 0, 0)
    for it in (blocker, lead, f1, f2):
        c.enqueue(it, 0.0)
    assert dispatched(c, 0.0) == [blocker]  # the leader waits for a slot
    assert lead.state == QUEUED
    assert c.stats().held == 2
    assert c.withdraw(lead, 1.0)
    assert lead.state == WITHDRAWN
    assert f1.leading
    assert f1.state == QUEUED
    assert c.stats().held == 1
    c.on_complete(blocker, Outcome.OK, 2.0)
    assert dispatched(c, 2.0) == [f1]
    assert c.stats().warmups == 1  # the withdrawn leader never ran


def test_withdrawn_held_item_is_forgotten() -> None:
    c = core(inflight_limit=8)
    lead, f1, f2 = its("P", 0, 0, 0)
    for it in (lead, f1, f2):
        c.enqueue(it, 0.0)
    dispatched(c, 0.0)
    assert c.withdraw(f1, 0.5)
    assert not c.withdraw(f1, 0.5)
    assert (c.stats().held, c.queued) == (1, 1)
    c.on_first_token(lead, 1.0)
    assert dispatched(c, 1.0) == [f2]


def test_warm_prefix_goes_straight_through_until_ttl() -> None:
    c = core(inflight_limit=8, warm_ttl_s=60.0)
    (lead,) = its("P", 0)
    assert c.try_acquire(lead, 0.0)
    assert lead.leading
    c.on_first_token(lead, 0.1)
    c.on_complete(lead, Outcome.OK, 1.0)
    a, b = its("P", 0, 0)
    assert c.try_acquire(a, 30.0)
    assert not a.leading
    c.on_complete(a, Outcome.OK, 31.0)  # use refreshes the key
    assert c.try_acquire(b, 90.0)
    assert not b.leading
    c.on_complete(b, Outcome.OK, 91.0)
    # Idle for more than the TTL: warmed again, siblings held again.
    x, y = its("P", 0, 0)
    assert c.try_acquire(x, 152.0)
    assert x.leading
    assert not c.try_acquire(y, 152.0)
    c.enqueue(y, 152.0)
    assert y.state == HELD
    assert c.stats().warmups == 2


def test_off_never_holds() -> None:
    c = core(warming=False, inflight_limit=8)
    group = its("P", 0, 0, 0)
    for it in group:
        c.enqueue(it, 0.0)
    assert dispatched(c, 0.0) == group
    assert not any(it.leading for it in group)
    assert (c.stats().warmups, c.stats().held_total) == (0, 0)


def test_batchable_followers_rejoin_the_batch_queue_and_leader_skips_it() -> None:
    c = core(inflight_limit=8, batching=True, batch_window_s=0.01, max_batch_size=8)
    lead, f1, f2 = its("P", 0, 0, 0, batchable=True)
    for it in (lead, f1, f2):
        c.enqueue(it, 0.0)
    plan = c.plan(0.0)
    assert plan.dispatch == [lead]
    assert plan.batches == []
    c.on_first_token(lead, 0.5)
    plan = c.plan(0.5)
    assert plan.batches == []
    assert plan.wake_at == pytest.approx(0.51)
    plan = c.plan(0.51)
    assert plan.batches == [[f1, f2]]


def test_drain_returns_held_items() -> None:
    c = core(inflight_limit=8)
    lead, f1 = its("P", 0, 0)
    c.enqueue(lead, 0.0)
    c.enqueue(f1, 0.0)
    assert c.drain() == [lead, f1]  # the queued leader and its held follower
    assert (c.queued, c.stats().held) == (0, 0)
    (again,) = its("P", 0)
    c.enqueue(again, 1.0)
    assert again.leading  # no stale leader survives the drain


@pytest.mark.parametrize(
    ("mode", "flavor", "expected"),
    [
        ("auto", "sglang", True),
        ("auto", "vllm", False),
        ("auto", "openai", False),
        ("on", "vllm", True),
        ("off", "sglang", False),
    ],
)
def test_auto_depends_on_flavor(mode: str, flavor: str, expected: bool) -> None:
    assert BatchPolicy(prefix_warming=mode).warms_prefixes(flavor) is expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"prefix_warming": "maybe"}, "prefix_warming='maybe'"), ({"warm_ttl_s": 0}, "warm_ttl_s")],
)
def test_policy_rejects_bad_warming_values(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BatchPolicy(**kw)  # type: ignore[arg-type]


# ------------------------------------------------------------- the prefix key

SYS = {"role": "system", "content": "You are a careful reviewer. " * 50}
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {}}}]


def req(*msgs: dict[str, object], model: str = "m", **params: object) -> ChatRequest:
    return ChatRequest(model=model, messages=list(msgs), params=params)


def test_prefix_key_shared_by_siblings_and_distinct_otherwise() -> None:
    a = prefix_key(req(SYS, {"role": "user", "content": "a"}, tools=TOOLS))
    b = prefix_key(req(SYS, {"role": "user", "content": "b"}, tools=TOOLS))
    assert a is not None
    assert a == b
    # Same tools content in another list object: same key.
    copy = [dict(TOOLS[0])]
    assert prefix_key(req(SYS, {"role": "user", "content": "c"}, tools=copy)) == a
    assert prefix_key(req(SYS, {"role": "user", "content": "a"})) != a  # no tools
    assert prefix_key(req(SYS, {"role": "user", "content": "a"}, model="n", tools=TOOLS)) != a
    other = {"role": "system", "content": "Something else."}
    assert prefix_key(req(other, {"role": "user", "content": "a"}, tools=TOOLS)) != a
    two = prefix_key(req(SYS, other, {"role": "user", "content": "a"}, tools=TOOLS))
    assert two not in (a, None)
    parts = {"role": "system", "content": [{"type": "text", "text": "x"}]}
    assert prefix_key(req(parts, {"role": "user", "content": "a"})) is not None


def test_prefix_key_none_without_system_or_tools() -> None:
    assert prefix_key(req({"role": "user", "content": "hi"})) is None
    # A system message after the first user message is not a shared prefix.
    assert prefix_key(req({"role": "user", "content": "hi"}, SYS)) is None
    assert prefix_key(req({"role": "user", "content": "hi"}, tools=TOOLS)) is not None


# ---------------------------------------------------------------- the runner


class StreamingBackend(Backend):
    """Streams one chunk, then waits for `gate`; records what it was asked."""

    base_url = "fake://streaming"

    def __init__(self, flavor: str = "sglang") -> None:
        self.capabilities = BackendCapabilities(flavor=flavor)  # type: ignore[arg-type]
        self.gate = asyncio.Event()
        self.first_gate = asyncio.Event()
        self.first_gate.set()
        self.started: list[str] = []
        self.streamed: list[bool] = []
        self.changed = asyncio.Event()
        self.fail: set[str] = set()

    async def wait_started(self, n: int) -> None:
        while len(self.started) < n:
            self.changed.clear()
            await self.changed.wait()

    async def chat(
        self, request: ChatRequest, *, on_chunk: Callable[[ChatChunk], None] | None = None
    ) -> ChatResponse:
        self.started.append(request.request_id)
        self.streamed.append(request.stream)
        self.changed.set()
        if request.request_id in self.fail:
            raise BackendBadRequestError("no")
        await self.first_gate.wait()
        if request.stream and on_chunk is not None:
            on_chunk(ChatChunk(content="x"))
        await self.gate.wait()
        return response(request)


def sreq(rid: str, *, stream: bool = False) -> ChatRequest:
    return ChatRequest(
        model="m",
        messages=[SYS, {"role": "user", "content": rid}],
        params={"tools": TOOLS},
        request_id=rid,
        stream=stream,
    )


async def spin(n: int = 50) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_runner_releases_followers_at_the_leaders_first_token() -> None:
    backend = StreamingBackend()
    backend.first_gate.clear()
    async with Scheduler(backend, policy=BatchPolicy(inflight_limit=16)) as s:
        assert s.prefix_warming
        tasks = [asyncio.create_task(s.submit(sreq(f"r{i}"))) for i in range(5)]
        await backend.wait_started(1)
        await spin()
        assert backend.started == ["r0"]
        assert backend.streamed == [True]  # non-streaming leader streamed internally
        assert s.stats().queued == 4
        backend.first_gate.set()  # the leader's first token arrives
        await backend.wait_started(5)
        assert backend.streamed == [True, False, False, False, False]
        assert not tasks[0].done()  # released before the leader completed
        backend.gate.set()
        results = await asyncio.gather(*tasks)
    assert [r.request_id for r in results] == [f"r{i}" for i in range(5)]
    st = s.stats()
    assert (st.warmups, st.warm_held, st.completed) == (1, 4, 5)
    assert st.warm_held_s >= 0.0


async def test_streaming_leader_still_gets_its_chunks() -> None:
    backend = StreamingBackend()
    backend.gate.set()
    got: list[str] = []
    async with Scheduler(backend) as s:
        resp = await s.submit(sreq("lead", stream=True), on_chunk=lambda c: got.append(c.content))
    assert resp.request_id == "lead"
    assert got == ["x"]
    assert s.stats().warmups == 1


async def test_runner_failed_leader_lets_the_next_warm() -> None:
    backend = StreamingBackend()
    backend.first_gate.clear()
    backend.fail.add("r0")
    backend.gate.set()
    async with Scheduler(backend, policy=BatchPolicy(inflight_limit=16)) as s:
        tasks = [asyncio.create_task(s.submit(sreq(f"r{i}"))) for i in range(3)]
        await backend.wait_started(2)
        await spin()
        assert backend.started == ["r0", "r1"]  # r1 warms alone after r0 failed
        backend.first_gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], BackendBadRequestError)
    assert [r.request_id for r in results[1:]] == ["r1", "r2"]  # type: ignore[union-attr]
    assert s.stats().warmups == 2


async def test_runner_cancelled_held_and_leader() -> None:
    backend = StreamingBackend()
    backend.first_gate.clear()
    backend.gate.set()
    async with Scheduler(backend, policy=BatchPolicy(inflight_limit=16)) as s:
        tasks = [asyncio.create_task(s.submit(sreq(f"r{i}"))) for i in range(4)]
        await backend.wait_started(1)
        await spin()
        tasks[2].cancel()  # a held follower
        tasks[0].cancel()  # the running leader
        await backend.wait_started(2)
        await spin()
        assert backend.started == ["r0", "r1"]
        backend.first_gate.set()
        done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    assert isinstance(done[2], asyncio.CancelledError)
    assert [d.request_id for d in (done[1], done[3])] == ["r1", "r3"]  # type: ignore[union-attr]
    st = s.stats()
    assert (st.queued, st.in_flight, st.cancelled) == (0, 0, 2)


@pytest.mark.parametrize("flavor", ["vllm", "openai"])
async def test_auto_does_not_hold_on_other_flavors(flavor: str) -> None:
    backend = StreamingBackend(flavor)
    backend.first_gate.clear()
    backend.gate.set()
    async with Scheduler(backend, policy=BatchPolicy(inflight_limit=16)) as s:
        assert not s.prefix_warming
        tasks = [asyncio.create_task(s.submit(sreq(f"r{i}"))) for i in range(4)]
        await backend.wait_started(4)
        assert backend.streamed == [False] * 4
        backend.first_gate.set()
        await asyncio.gather(*tasks)
    assert (s.stats().warmups, s.stats().warm_held) == (0, 0)


async def test_close_fails_held_requests() -> None:
    backend = StreamingBackend()
    backend.first_gate.clear()
    s = Scheduler(backend)
    tasks = [asyncio.create_task(s.submit(sreq(f"r{i}"))) for i in range(3)]
    await backend.wait_started(1)
    await spin()
    await s.aclose()
    backend.first_gate.set()
    backend.gate.set()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert done[0].request_id == "r0"  # type: ignore[union-attr]
    assert all(type(d).__name__ == "SchedulerClosedError" for d in done[1:])
