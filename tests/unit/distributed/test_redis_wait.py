"""`RedisWait`: the one way to wait on an unreachable Redis (cap, give-up rule, cancellation)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

import pytest

from langgraph_batch._retry_policy import REDIS_RETRY, RetryPolicy
from langgraph_batch.distributed import _redis_wait
from langgraph_batch.distributed._redis import CONNECTION_ERRORS, RESPONSE_ERRORS
from langgraph_batch.distributed._redis_wait import RedisWait
from langgraph_batch.errors import RedisUnavailableError

DOWN = CONNECTION_ERRORS[0]


class Clock:
    """The outage clock, moved by the fake commands."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    # The spacing is REDIS_RETRY's (tested there); here the pauses are one loop turn.
    monkeypatch.setattr(_redis_wait, "REDIS_RETRY", RetryPolicy(max_interval=0, initial_interval=0))


def test_the_spacing_is_the_one_retry_values() -> None:
    # 0.05 s doubling to the 1 s cap, each wait drawn from [0, ceiling].
    ceilings = [replace(REDIS_RETRY, jitter=False).interval(n) for n in range(1, 9)]
    assert ceilings == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert REDIS_RETRY.jitter


async def test_waits_until_redis_answers_and_says_when_it_is_back(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    replies = [DOWN("refused"), DOWN("refused"), "OK"]

    async def command() -> str:
        clock.now += 3.0
        reply = replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    wait = RedisWait("run 7", give_up_after=60.0, clock=clock)
    caplog.set_level("INFO", logger=_redis_wait.__name__)
    assert await wait.run(command) == "OK"
    assert wait.down_since is None
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING", "INFO"]
    assert "Redis back after 6.0 s" in caplog.records[-1].getMessage()


async def test_gives_up_once_the_outage_outlasts_give_up_after(clock: Clock) -> None:
    calls = 0

    async def command() -> str:
        nonlocal calls
        calls += 1
        clock.now += 10.0
        raise DOWN("refused")

    wait = RedisWait(
        "run 7", give_up_after=25.0, hint="run the thread again to re-attach", clock=clock
    )
    with pytest.raises(RedisUnavailableError) as info:
        await wait.run(command)
    # Failures at 10 s (down 0 s), 20 s (10 s), 30 s (20 s), 40 s (30 s > 25 s): given up.
    assert calls == 4
    assert info.value.down_s == 30.0
    assert "run 7: Redis unreachable for 30 s" in str(info.value)
    assert str(info.value).endswith("run the thread again to re-attach")


async def test_one_outage_is_measured_across_the_callers_commands(clock: Clock) -> None:
    async def down() -> str:
        clock.now += 10.0
        raise DOWN("refused")

    wait = RedisWait("run 7", give_up_after=25.0, clock=clock)
    wait.failed(DOWN("first command"))  # the outage began here
    with pytest.raises(RedisUnavailableError):
        await wait.run(down)
    assert wait.down_since is not None


async def test_an_answer_ends_the_wait_even_an_error_reply() -> None:
    if not RESPONSE_ERRORS:
        pytest.skip("redis-py not installed")

    async def refused() -> str:
        raise RESPONSE_ERRORS[0]("NOPERM")

    with pytest.raises(RESPONSE_ERRORS[0]):
        await RedisWait("worker w", give_up_after=None).run(refused)


async def test_a_caller_that_no_longer_wants_the_answer_stops(clock: Clock) -> None:
    wanted = [True, True, False]

    async def down() -> str:
        raise DOWN("refused")

    wait = RedisWait("worker w", give_up_after=None, clock=clock)
    assert await wait.run(down, abandoned=lambda: not wanted.pop(0)) is None
    assert wanted == []


async def test_a_pending_cancellation_ends_the_wait_when_a_call_absorbed_it() -> None:
    calls = 0

    async def absorbing() -> str:
        nonlocal calls
        calls += 1
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):  # redis-py lost the cancellation
            await asyncio.sleep(0)
        raise DOWN("refused")

    with pytest.raises(asyncio.CancelledError):
        await RedisWait("worker w", give_up_after=None).run(absorbing)
    assert calls == 1  # no second command after the cancel


def test_give_up_after_is_checked() -> None:
    with pytest.raises(ValueError, match="give_up_after"):
        RedisWait("x", give_up_after=0)
