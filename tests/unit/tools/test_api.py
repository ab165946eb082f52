"""`coalesce()`, its policy, the counters and the hook functions, without a graph."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Annotated, Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.prebuilt import InjectedState, InjectedStore, ToolRuntime
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.store.base import BaseStore

import langgraph_batch.tools as tools_module
from langgraph_batch._context import SiblingInfo, sibling_scope
from langgraph_batch.nodes._admission import SiblingAdmission
from langgraph_batch.tools import (
    CoalescePolicy,
    ToolStats,
    coalesce,
    coalesce_policy,
    coalescing,
    reset_tool_stats,
    tool_stats,
)
from langgraph_batch.tools._coalesce import forget_run
from langgraph_batch.tools._hooks import coalesced_call, in_tool_call
from tests.fakes.fan_out import RecordingAdmission


@tool
def double(x: int) -> int:
    """Double a number."""
    return 2 * x


def request_for(t: BaseTool, args: dict[str, Any], call_id: str) -> ToolCallRequest:
    call = {"name": t.name, "args": args, "id": call_id, "type": "tool_call"}
    return ToolCallRequest(tool_call=call, tool=t, state={}, runtime=None)  # type: ignore[arg-type]


def executor(t: BaseTool, gate: asyncio.Event | None = None) -> Any:
    count = {"n": 0}

    async def execute(request: ToolCallRequest) -> ToolMessage:
        count["n"] += 1
        if gate is not None:
            await gate.wait()
        out = await t.ainvoke(request.tool_call["args"])
        return ToolMessage(str(out), tool_call_id=request.tool_call["id"], name=t.name)

    return execute, count


async def test_coalesced_tool_is_still_an_ordinary_tool() -> None:
    marked = coalesce(double)
    assert isinstance(marked, BaseTool)
    assert marked.name == "double"
    assert marked.invoke({"x": 2}) == 4
    assert await marked.ainvoke({"x": 3}) == 6
    assert coalesce_policy(marked) is not None
    assert coalesce_policy(double) is None  # the original is not marked
    # Metadata reaches tracers: it must stay JSON-safe.
    summary = json.loads(json.dumps(marked.metadata))["langgraph_batch_coalesce"]
    assert summary["scope"] == "run"
    assert coalesce_policy(None) is None


def test_plain_function_and_existing_metadata() -> None:
    def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    marked = coalesce(shout, ttl=5.0, max_concurrency=2, rate_limit=3.0, share_errors=False)
    assert marked.invoke({"text": "hi"}) == "HI"
    policy = coalesce_policy(marked)
    live = coalescing(marked)
    assert live is not None
    assert policy is not None
    assert (policy.scope, policy.ttl, policy.max_concurrency) == ("run", 5.0, 2)
    assert (policy.rate_limit, policy.share_errors) == (3.0, False)
    assert live.coalescer.ttl == 5.0

    tagged = double.model_copy(update={"metadata": {"owner": "me"}})
    assert coalesce(tagged).metadata is not None
    assert coalesce(tagged).metadata["owner"] == "me"  # type: ignore[index]


def test_each_tool_has_its_own_limits() -> None:
    first, second = coalesce(double, max_concurrency=1), coalesce(double, max_concurrency=1)
    a, b = coalescing(first), coalescing(second)
    assert a is not None
    assert b is not None
    # Equal options (the policy is a value), each its own runtime.
    assert a.policy == b.policy
    assert a.coalescer is not b.coalescer


def test_the_policy_is_a_frozen_value_and_its_runtime_lives_apart() -> None:
    policy = CoalescePolicy(ttl=5.0, max_concurrency=2)
    assert policy == CoalescePolicy(ttl=5.0, max_concurrency=2)
    assert hash(policy) == hash(CoalescePolicy(ttl=5.0, max_concurrency=2))
    assert {f.name for f in dataclasses.fields(policy)} == {
        "scope", "ttl", "key", "caller_key", "max_concurrency", "rate_limit", "share_errors"
    }  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.ttl = 1.0  # type: ignore[misc]
    marked = coalesce(double, ttl=5.0)
    live = coalescing(marked)
    assert live is not None
    assert coalesce_policy(marked) is live.policy
    assert (live.coalescer.ttl, live.coalescer.max_concurrency) == (5.0, None)
    assert coalescing(double) is None


@pytest.mark.parametrize("kind", ["state", "store", "runtime"])
def test_refuses_tools_with_injected_state(kind: str) -> None:
    if kind == "state":

        @tool
        def t(x: int, state: Annotated[dict, InjectedState]) -> str:
            """T."""
            return ""
    elif kind == "store":

        @tool
        def t(x: int, store: Annotated[BaseStore, InjectedStore()]) -> str:
            """T."""
            return ""
    else:

        @tool
        def t(x: int, runtime: ToolRuntime) -> str:
            """T."""
            return ""

    with pytest.raises(ValueError, match=r"caller-dependent arguments \['(state|store|runtime)'\]"):
        coalesce(t)


def test_allows_injected_tool_call_id() -> None:
    @tool
    def t(x: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """T."""
        return ""

    assert coalesce_policy(coalesce(t)) is not None


def test_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="scope"):
        coalesce(double, scope="forever")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl"):
        coalesce(double, ttl=-1)
    with pytest.raises(ValueError, match="max_concurrency"):
        coalesce(double, max_concurrency=0)
    with pytest.raises(ValueError, match="rate_limit"):
        coalesce(double, rate_limit=0)
    with pytest.raises(ValueError, match="key"):
        CoalescePolicy(key="x")  # type: ignore[arg-type]
    # The policy checks its limits itself (no runtime is built with it).
    with pytest.raises(ValueError, match="ttl must be > 0"):
        CoalescePolicy(ttl=0)
    with pytest.raises(ValueError, match="max_concurrency must be >= 1"):
        CoalescePolicy(max_concurrency=0)
    with pytest.raises(ValueError, match="rate_limit must be > 0"):
        CoalescePolicy(rate_limit=-1.0)


def test_call_key_is_canonical_json_or_custom() -> None:
    policy = CoalescePolicy()
    assert policy.call_key("t", {"b": 1, "a": [1, {"d": 2, "c": 3}]}) == policy.call_key(
        "t", {"a": [1, {"c": 3, "d": 2}], "b": 1}
    )
    assert policy.call_key("t", {"a": 1}) == ("t", '{"a":1}')
    assert policy.call_key("t", {"a": 1}) != policy.call_key("u", {"a": 1})
    custom = CoalescePolicy(key=lambda args: args["q"].lower())
    assert custom.call_key("t", {"q": "Paris", "page": 1}) == ("t", "paris")


async def test_identical_calls_get_their_own_tool_call_ids() -> None:
    marked = coalesce(double)
    gate = asyncio.Event()
    execute, count = executor(marked, gate)
    group = "api-ids"
    calls = [
        asyncio.create_task(
            call_in_sibling(
                group, i, coalesced_call(request_for(marked, {"x": 4}, f"id{i}"), execute)
            )
        )
        for i in range(5)
    ]
    policy = coalesce_policy(marked)
    live = coalescing(marked)
    assert live is not None
    assert policy is not None
    await until(
        lambda: live.coalescer.waiting(policy.call_key("double", {"x": 4}), scope=group) == 5
    )
    gate.set()
    results = await asyncio.gather(*calls)
    assert count["n"] == 1
    assert [r.tool_call_id for r in results] == [f"id{i}" for i in range(5)]
    assert {r.content for r in results} == {"8"}
    assert tool_stats(group) == ToolStats(
        requested=5,
        executed=1,
        shared=4,
        errors=0,
        by_tool={"double": ToolStats(requested=5, executed=1, shared=4)},
    )


async def call_in_sibling(group: str, index: int, coro: Any, **kw: Any) -> Any:
    with sibling_scope(SiblingInfo(group=group, index=index, **kw)):
        return await coro


async def until(predicate: Any) -> None:
    for _ in range(10_000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


async def test_cancelled_leader_sibling_leaves_tool_and_followers_get_result() -> None:
    marked = coalesce(double)
    gate = asyncio.Event()
    execute, count = executor(marked, gate)
    admission = RecordingAdmission()
    infos = [SiblingInfo(group="api-cancel", index=i, admission=admission) for i in range(3)]

    async def sibling(i: int) -> Any:
        request = request_for(marked, {"x": 1}, f"c{i}")
        with sibling_scope(infos[i]):
            return await in_tool_call(request, lambda r: coalesced_call(r, execute))

    leader = asyncio.create_task(sibling(0))
    await until(lambda: count["n"] == 1)
    followers = [asyncio.create_task(sibling(i)) for i in (1, 2)]
    policy = coalesce_policy(marked)
    live = coalescing(marked)
    assert live is not None
    assert policy is not None
    key = policy.call_key("double", {"x": 1})
    await until(lambda: live.coalescer.waiting(key, scope="api-cancel") == 3)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert infos[0].tools_active == 0  # left the tool despite the cancellation
    gate.set()
    results = await asyncio.gather(*followers)
    assert [r.tool_call_id for r in results] == ["c1", "c2"]
    assert count["n"] == 1
    assert all(info.tools_active == 0 for info in infos)
    # The cancelled sibling left without asking the gate for its place again.
    assert ("acquire", 0, True) not in admission.events
    assert ("acquire", 1, True) in admission.events


async def test_cancelled_sibling_in_a_tool_is_not_held_up_by_the_gate() -> None:
    """max_active=1, taken by another sibling while this one is in a tool: cancelling
    this one ends it at once (it used to wait, in its cleanup, for a place)."""
    gate = SiblingAdmission(max_active=1)
    in_tool = SiblingInfo(group="api-hold", index=0, admission=gate)
    holder = SiblingInfo(group="api-hold", index=1, admission=gate)
    started = asyncio.Event()

    async def slow(_: ToolCallRequest) -> ToolMessage:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def sibling() -> Any:
        with sibling_scope(in_tool):
            await gate.acquire(in_tool, returning=False)
            return await in_tool_call(request_for(double, {"x": 1}, "c"), slow)

    task = asyncio.create_task(sibling())
    await started.wait()
    await gate.acquire(holder, returning=False)  # the place it released in the tool
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert task in done, "the cancelled sibling waits for an admission place"
    assert task.cancelled()
    assert in_tool.tools_active == 0
    assert not gate.holds(in_tool)
    assert gate.holds(holder)
    assert gate.stats().waiting_returning == 0


async def test_non_json_arguments_run_uncoalesced() -> None:
    marked = coalesce(double)
    _execute, count = executor(marked)

    class Opaque:
        pass

    req = request_for(marked, {"x": 1}, "a")
    req = req.override(tool_call={**req.tool_call, "args": {"x": 1, "o": Opaque()}})

    async def run_raw(request: ToolCallRequest) -> ToolMessage:
        count["n"] += 1
        return ToolMessage("raw", tool_call_id=request.tool_call["id"])

    out = await coalesced_call(req, run_raw)
    assert out.content == "raw"
    assert count["n"] == 1


async def test_forget_run_drops_kept_results() -> None:
    marked = coalesce(double)
    execute, count = executor(marked)
    for _ in range(2):
        await call_in_sibling(
            "api-forget", 0, coalesced_call(request_for(marked, {"x": 2}, "a"), execute)
        )
    assert count["n"] == 1
    forget_run("api-forget")
    await call_in_sibling(
        "api-forget", 0, coalesced_call(request_for(marked, {"x": 2}, "a"), execute)
    )
    assert count["n"] == 2


async def test_stats_totals_reset_and_unknown_group() -> None:
    execute, _ = executor(double)
    await coalesced_call(request_for(double, {"x": 1}, "a"), execute)
    assert tool_stats().requested >= 1
    assert tool_stats("no-such-run") == ToolStats()
    reset_tool_stats()
    assert tool_stats() == ToolStats()


def test_batch_middleware_is_lazy_and_unknown_names_fail() -> None:
    from langgraph_batch.tools._middleware import BatchMiddleware

    assert tools_module.BatchMiddleware is BatchMiddleware
    with pytest.raises(AttributeError, match="nope"):
        _ = tools_module.nope


async def test_cancelling_a_call_through_a_sync_user_wrapper_cancels_the_execution() -> None:
    """The sync `wrap_tool_call` runs in a worker thread that cannot be cancelled;
    the execution it started on the loop must not outlive its cancelled caller."""
    from langgraph_batch.tools import _BatchToolHook

    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def execute(request: ToolCallRequest) -> ToolMessage:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("unreachable")

    def user_wrap(request: ToolCallRequest, call: Any) -> Any:
        return call(request)

    hook = _BatchToolHook(None, user_wrap)
    task = asyncio.create_task(hook(request_for(double, {"x": 1}, "c"), execute))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(5):
        await cancelled.wait()
