"""Real routers in front of 4 emulator replicas: the session key keeps siblings on their replica.

`vllm-router` and `sglang-router` are the pip packages (the `test` extra
installs them; a test skips, saying why, only where the router cannot be
installed or does not run). Each test starts 4 emulator processes, the router
in front of them, and runs W4's `langgraph-batch` contender (the benchmark's
own process and graph: 3 turns, two tool calls, a 2,048-token shared prompt
and a 1,500-token task per sibling) at the router's one URL
(`benchmarks/routers.py`); prefill is what the replicas computed.

- Key-based policies (`vllm-router --policy consistent_hash`, `sglang-router
  --policy manual`): with the library's session key the replicas compute at
  most 0.6x the prefill of the same run without it (`session_affinity=None`:
  vllm-router then hashes the per-call `X-Request-Id`, sglang-router picks at
  random, so each turn lands on a random replica).
- `cache_aware` (both routers' prompt-text policy) does not read the key: the
  key must not cost anything there.
- A replica killed (SIGKILL) mid-run behind the router loses no sibling: the
  router fails over, the scheduler retries.
"""

from __future__ import annotations

import pytest

from benchmarks.routers import measure_router, router_unavailable, run_with_kill

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

N = 32


def need(kind: str) -> None:
    reason = router_unavailable(kind)
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.parametrize(
    ("kind", "policy"), [("vllm-router", "consistent_hash"), ("sglang-router", "manual")]
)
def test_the_session_key_keeps_each_sibling_on_its_replica(kind: str, policy: str) -> None:
    need(kind)
    result = measure_router(kind, policy, n=N, with_pool=False)
    with_key, without = result["with_key"], result["without_key"]
    assert with_key["failures"] == without["failures"] == 0, result
    assert with_key["requests"] == without["requests"] >= 3 * N
    assert result["ratio_with_over_without"] <= 0.6, result
    # Every replica served: the key spreads siblings, it does not pin them to one.
    assert all(r > 0 for r in with_key["requests_per_replica"]), result


@pytest.mark.parametrize("kind", ["vllm-router", "sglang-router"])
def test_the_key_costs_nothing_under_cache_aware(kind: str) -> None:
    need(kind)
    result = measure_router(kind, "cache_aware", n=N, with_pool=False)
    assert result["with_key"]["failures"] == result["without_key"]["failures"] == 0, result
    assert result["ratio_with_over_without"] <= 1.1, result


@pytest.mark.parametrize(
    ("kind", "policy"), [("vllm-router", "consistent_hash"), ("sglang-router", "manual")]
)
def test_a_replica_killed_behind_the_router_loses_no_sibling(kind: str, policy: str) -> None:
    need(kind)
    result = run_with_kill(kind, policy, n=N)
    assert result["killed_mid_run"], result
    assert result["failures"] == 0, result
    assert result["errors"] == [], result
