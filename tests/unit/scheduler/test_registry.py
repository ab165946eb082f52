"""Process registry: one shared scheduler per key and event loop, names for JSON configs."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from langgraph_batch.scheduler import (
    BatchPolicy,
    Scheduler,
    SchedulerState,
    find_scheduler,
    register_scheduler,
    registry,
    scheduler_for,
)
from tests.fakes.backends import InstantBackend, request


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    yield
    registry._instances.clear()
    registry._recipes.clear()
    registry._by_loop.clear()
    registry._names_by_loop.clear()


async def test_same_key_shares_one_scheduler_whatever_the_policy() -> None:
    built: list[InstantBackend] = []

    def factory() -> InstantBackend:
        built.append(InstantBackend())
        return built[-1]

    a = scheduler_for(key="vllm:x", backend_factory=factory, policy=BatchPolicy(inflight_limit=3))
    b = scheduler_for(key="vllm:x", backend_factory=factory, policy=BatchPolicy(inflight_limit=9))
    other = scheduler_for(key="vllm:y", backend_factory=factory)
    assert a is b
    assert other is not a
    assert a.policy.inflight_limit == 3  # the first caller's policy wins
    assert len(built) == 2
    await a.submit(request("r"))
    assert scheduler_for(key="vllm:x", backend_factory=factory) is a  # opened: still shared
    await a.aclose()
    await other.aclose()


async def test_closed_or_dead_scheduler_is_replaced_and_owned_backend_closed() -> None:
    closed: list[bool] = []

    class Closing(InstantBackend):
        async def aclose(self) -> None:
            closed.append(True)

    a = scheduler_for(key="k", backend_factory=Closing)
    await a.aclose()
    assert closed == [True]
    b = scheduler_for(key="k", backend_factory=Closing)
    assert b is not a
    assert b.state is SchedulerState.UNOPENED
    await b.submit(request("r"))
    b._life.state = SchedulerState.DEAD  # as if its runner had died
    c = scheduler_for(key="k", backend_factory=Closing)
    assert c is not b
    await b.aclose()
    await c.aclose()


async def test_different_loops_get_different_schedulers() -> None:
    here = scheduler_for(key="k", backend_factory=InstantBackend)
    await here.submit(request("r"))

    async def in_other_loop() -> Scheduler:
        s = scheduler_for(key="k", backend_factory=InstantBackend)
        await s.submit(request("r"))
        await s.aclose()
        return s

    there = await asyncio.to_thread(asyncio.run, in_other_loop())
    assert there is not here
    assert scheduler_for(key="k", backend_factory=InstantBackend) is here
    await here.aclose()


async def test_loops_that_go_away_do_not_leak_schedulers() -> None:
    async def use_and_leave_open() -> weakref.ref[asyncio.AbstractEventLoop]:
        s = scheduler_for(key="k", backend_factory=InstantBackend)
        await s.submit(request("r"))
        return weakref.ref(asyncio.get_running_loop())

    loop_ref = await asyncio.to_thread(asyncio.run, use_and_leave_open())
    gc.collect()
    assert loop_ref() is None  # the registry held the loop only weakly
    assert asyncio.get_running_loop() not in registry._by_loop
    assert len(registry._by_loop) == 0


async def test_get_scheduler_by_name() -> None:
    s = scheduler_for(key="vllm:x", backend_factory=InstantBackend, name="main")
    assert s.name == "main"
    assert find_scheduler("main") is s
    inst = Scheduler(InstantBackend(), name="explicit")
    assert register_scheduler(inst) is inst
    assert find_scheduler("explicit") is inst
    with pytest.raises(KeyError, match=r"no scheduler named 'nope'; known: \['explicit', 'main'\]"):
        find_scheduler("nope")
    await s.aclose()
    await inst.aclose()


async def test_recipe_builds_one_scheduler_per_loop_and_replaces_closed() -> None:
    assert register_scheduler("studio", backend_factory=InstantBackend) is None
    a = find_scheduler("studio")
    assert find_scheduler("studio") is a
    assert (await a.submit(request("r"))).request_id == "r"
    await a.aclose()
    b = find_scheduler("studio")
    assert b is not a
    assert b.state is SchedulerState.UNOPENED

    async def other_loop() -> Scheduler:
        return find_scheduler("studio")

    assert await asyncio.to_thread(asyncio.run, other_loop()) is not b
    await b.aclose()


def test_recipe_needs_a_running_loop_and_unknown_name_says_so() -> None:
    register_scheduler("studio", backend_factory=InstantBackend)
    with pytest.raises(RuntimeError, match="call it from async code"):
        find_scheduler("studio")
    registry.unregister_scheduler("studio")
    with pytest.raises(KeyError, match="known: none"):
        find_scheduler("studio")


def test_register_scheduler_misuse() -> None:
    register_scheduler("x", backend_factory=InstantBackend)
    with pytest.raises(ValueError, match="already registered"):
        register_scheduler("x", backend_factory=InstantBackend)
    register_scheduler("x", backend_factory=InstantBackend, replace=True)
    with pytest.raises(ValueError, match="needs backend_factory"):
        register_scheduler("y")
    with pytest.raises(ValueError, match="takes no backend_factory"):
        register_scheduler(Scheduler(InstantBackend()), backend_factory=InstantBackend)
    assert registry.known_schedulers() == ["x"]


def test_scheduler_for_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        scheduler_for(key="k", backend_factory=InstantBackend)


async def test_named_registration_wins_over_scheduler_for_arguments() -> None:
    recipe_backends: list[InstantBackend] = []

    def recipe_factory() -> InstantBackend:
        recipe_backends.append(InstantBackend())
        return recipe_backends[-1]

    register_scheduler("main", backend_factory=recipe_factory, policy=BatchPolicy(inflight_limit=5))
    # A chat model naming "main" and fan_out resolving "main" land on one scheduler.
    from_model = scheduler_for(key="main", backend_factory=InstantBackend, name="main")
    assert from_model.policy.inflight_limit == 5
    assert from_model.backend is recipe_backends[0]
    assert find_scheduler("main") is from_model
    inst = Scheduler(InstantBackend(), name="explicit")
    register_scheduler(inst)
    assert scheduler_for(key="whatever", backend_factory=InstantBackend, name="explicit") is inst
    await from_model.aclose()
    await inst.aclose()


async def test_scheduler_created_announces_the_next_scheduler_of_the_loop() -> None:
    from langgraph_batch.scheduler.registry import scheduler_created

    backend = InstantBackend()
    first = scheduler_created()
    abandoned = scheduler_created()
    abandoned.cancel()  # a waiter that gave up is skipped, not an error
    assert not first.done()
    made = scheduler_for(key="announce", backend_factory=lambda: backend)
    assert await asyncio.wait_for(first, 1.0) is made
    # Reusing the scheduler announces nothing; the next one created does.
    later = scheduler_created()
    assert scheduler_for(key="announce", backend_factory=lambda: backend) is made
    await asyncio.sleep(0)
    assert not later.done()
    other = scheduler_for(key="announce-2", backend_factory=InstantBackend)
    assert await asyncio.wait_for(later, 1.0) is other
    await made.aclose()
    await other.aclose()
