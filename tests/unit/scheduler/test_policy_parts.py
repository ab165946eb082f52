"""The policy core's parts on their own: states, priority keys, the limit, warming."""

from __future__ import annotations

import pytest

from langgraph_batch.backends.base import EngineMetrics
from langgraph_batch.scheduler._config import BatchPolicy
from langgraph_batch.scheduler._item import PolicyItem, RequestStatus
from langgraph_batch.scheduler._limit import InflightLimit
from langgraph_batch.scheduler._policy import Planner
from langgraph_batch.scheduler._priority import PRIORITY_MODES, Priority
from langgraph_batch.scheduler._warming import WarmingGate


def test_request_status_is_an_int_enum_the_hot_path_compares() -> None:
    item = PolicyItem()
    assert item.state is RequestStatus.NEW
    assert RequestStatus.QUEUED == 0
    assert "NEW" in repr(item)


@pytest.mark.parametrize("mode", PRIORITY_MODES)
def test_the_engine_priority_orders_as_the_queue_key(mode: str) -> None:
    priority = Priority(mode)  # type: ignore[arg-type]
    priority.attained.record("slow", 2.5)
    priority.attained.record("fast", 0.25)
    items = [
        PolicyItem(turn=3, sibling_id="slow"),
        PolicyItem(turn=1, sibling_id="fast"),
        PolicyItem(turn=2, sibling_id=None),
    ]
    by_key = sorted(range(3), key=lambda i: (priority.key(items[i]), i))
    by_engine = sorted(range(3), key=lambda i: (priority.for_engine(items[i]), i))
    assert by_key == by_engine


def test_a_priority_mode_is_parsed_once() -> None:
    with pytest.raises(ValueError, match="priority='lifo'"):
        Priority("lifo")  # type: ignore[arg-type]
    las = Priority("las")
    las.served("g/0", 2.5)
    item = PolicyItem(turn=1, sibling_id="g/0")
    assert (las.key(item), las.for_engine(item), las.recency) == (2.5, 2500, None)
    depth = Priority("depth_first")
    depth.served("g/0", 2.5)  # not recorded outside las
    depth.completed("conv")
    assert depth.attained.get("g/0") == 0.0
    assert depth.key(PolicyItem(turn=1, conversation="conv")) < depth.key(PolicyItem(turn=1))


def test_withdraw_counts_the_wait() -> None:
    core = Planner(BatchPolicy(inflight_limit=1))
    running, waiting = PolicyItem(), PolicyItem()
    assert core.try_acquire(running, 0.0)
    core.enqueue(waiting, 1.0)
    assert core.withdraw(waiting, 3.5)
    assert waiting.queued_s == 2.5
    assert waiting.state is RequestStatus.WITHDRAWN


def test_the_limit_doubles_in_slow_start_then_halves_on_overload() -> None:
    policy = BatchPolicy(inflight_limit=64, initial_inflight=8, inflight_cap=256)
    limit = InflightLimit(policy, has_metrics=True)
    assert (limit.value, limit.slow_start) == (8, True)
    idle_server = EngineMetrics(num_requests_waiting=0)
    limit.on_metrics(idle_server, 1.0, bound_now=True)
    assert limit.value == 16
    limit.decrease(2.0)
    assert limit.value < 16
    assert not limit.slow_start


def test_warming_holds_followers_until_the_leader_is_warm() -> None:
    gate = WarmingGate(ttl=30.0)
    leader, follower = PolicyItem(prefix="p"), PolicyItem(prefix="p")
    follower.entry = (0.0, 1, follower)
    assert gate.admit(leader, 0.0)
    assert leader.leading
    assert not gate.admit(follower, 0.1)
    gate.hold(follower, 0.1)
    assert gate.held_count == 1
    assert gate.end_lead(leader, warm=True, now=0.5) == [follower]
    assert gate.is_warm("p", 1.0)
    assert gate.held_count == 0
    assert gate.held_s == pytest.approx(0.4)
