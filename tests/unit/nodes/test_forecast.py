"""The run's learned sizes: first-call context, growth per turn, tool latencies."""

from __future__ import annotations

from langgraph_batch.nodes._forecast import MEMORY, MIN_TOOL_SAMPLES, ContextForecast


def test_prior_until_first_calls_then_their_mean_and_the_median_growth() -> None:
    f = ContextForecast(sibling_tokens=4096)
    assert f.fresh_booking() == 4096
    assert f.booking(0) == 4096  # a sibling with no call yet books a fresh one's
    f.observe_context("a", 1000, shared=2048)
    assert f.first_context == 1000
    assert f.growth == 1000  # no turn seen yet: a turn adds about a first call
    f.observe_context("b", 2000, shared=2048)
    assert f.first_context == 1500
    for delta in (100, 300, 200, 900):  # a's later turns
        f.observe_context("a", 1000 + delta, shared=2048)
        f.observe_context("a", 1000, shared=2048)  # shrinks back (trimmed): no growth
    assert f.growth in (100, 200, 300)
    assert f.booking(5000) == 5000 + f.growth


def test_the_shared_prefix_comes_off_the_prior() -> None:
    f = ContextForecast(sibling_tokens=4096)
    f.observe_context("a", 0, shared=3000)  # no usage: nothing learned
    assert f.first_context == 4096
    f._shared = 3000  # as a first call would have shown it
    assert f.first_context == 1096


def test_memory_keeps_the_recent_window() -> None:
    f = ContextForecast(sibling_tokens=10)
    for i in range(MEMORY + 50):
        f.observe_context(("s", i), 1 if i < 50 else 9, shared=0)
    assert f.first_context == 9  # the first 50 (size 1) have been forgotten


def test_long_waits_need_history_and_pass_the_90th_percentile() -> None:
    f = ContextForecast(sibling_tokens=10)
    for _ in range(MIN_TOOL_SAMPLES - 1):
        f.observe_tool("search", 1.0)
    assert not f.long_wait("search", 100.0)  # too few calls to tell
    f.observe_tool("search", 1.0)
    assert f.long_wait("search", 1.5)
    assert not f.long_wait("search", 0.5)
    assert not f.long_wait("other", 100.0)  # learned per tool
    assert not f.long_wait(None, 100.0)
    for _ in range(40):
        f.observe_tool("search", 20.0)  # the tool got slow
    assert not f.long_wait("search", 15.0)


def test_expected_wait_is_the_tools_90th_percentile_else_every_tools() -> None:
    f = ContextForecast(sibling_tokens=1000)
    assert f.expected_wait("grep") is None  # nothing seen yet
    for i in range(MIN_TOOL_SAMPLES - 1):
        f.observe_tool("grep", 1.0 + i)
    assert f.expected_wait("grep") is None  # too few waits of any tool
    for i in range(10):
        f.observe_tool("test", 10.0 + i)  # 10..19 s
    waits = sorted([1.0 + i for i in range(MIN_TOOL_SAMPLES - 1)] + [10.0 + i for i in range(10)])
    pooled = f.expected_wait(None)
    assert pooled is not None
    assert waits[-3] <= pooled <= waits[-1]
    assert f.expected_wait("grep") == pooled  # grep: too few of its own, so every tool's
    assert f.expected_wait("unknown") == pooled
    test = f.expected_wait("test")
    assert test is not None
    assert 17.0 <= test <= 19.0
