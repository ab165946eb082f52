"""Router contenders' parts (`benchmarks/routers/process.py`): names, config, reports."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

from benchmarks import goals, report
from benchmarks.routers import process as routers
from langgraph_batch.bench import cli, harness
from langgraph_batch.bench.contenders import naive
from langgraph_batch.bench.workloads import WORKLOADS, make_job
from langgraph_batch.emulator.costs import get_profile


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("naive", ("naive", None)),
        ("naive-router", ("naive", "router")),
        ("naive-router-ps", ("naive", "router-ps")),
        ("naive-bounded-24-router-ps", ("naive-bounded-24", "router-ps")),
        ("langgraph-batch-router", ("langgraph-batch", "router")),
        ("-router", ("-router", None)),
    ],
)
def test_a_router_contender_names_its_base_and_mode(
    name: str, split: tuple[str, str | None]
) -> None:
    assert routers.split_router(name) == split


def test_the_wheel_alone_takes_no_router_contenders() -> None:
    assert not cli.is_known("W8", "naive-router-ps")
    assert not cli.is_known("W8", "batchagent")
    assert cli.known_contenders("W8") == cli.AGENT_CONTENDERS


@pytest.mark.usefixtures("with_research")
def test_the_cli_takes_router_contenders_on_agent_workloads_only() -> None:
    for name in (
        "naive-router",
        "naive-router-ps",
        "naive-bounded-24-router-ps",
        "naive-bounded-router",
        "langgraph-batch-router-ps",
    ):
        assert cli.is_known("W8", name), name
        assert cli.is_known("W1", name), name
    assert not cli.is_known("W8", "batchagent-router-ps")
    assert not cli.is_known("W8", "naive-bounded-x-router-ps")
    assert not cli.is_known("W7", "langgraph-batch-router-ps")  # single-turn
    assert not cli.is_known("W9", "naive-router-ps")  # the simulation's own module


@pytest.mark.usefixtures("with_research")
def test_a_router_contender_runs_its_base_module_and_job() -> None:
    assert harness.module_for("W8", "naive-bounded-24-router-ps") == harness.MODULES["naive"]
    assert (
        harness.module_for("W8", "langgraph-batch-router-ps") == harness.MODULES["langgraph-batch"]
    )
    wl = WORKLOADS["W8"]
    kw = {"n": 2, "seed": 0, "llm_url": "http://e", "tool_url": "http://t", "model": "m"}
    for name, key, value in (
        ("naive-bounded-24-router-ps", "max_concurrency", 24),
        ("naive-router-ps", "max_concurrency", None),
        ("langgraph-batch-router", "routing", None),
    ):
        base = routers.split_router(name)[0]
        assert make_job(wl, contender=name, base=base, **kw)[key] == value


def test_the_best_bounded_run_is_a_plain_one() -> None:
    contenders = {
        "naive-bounded-24": {"makespan_s": 300.0},
        "naive-bounded-24-router-ps": {"makespan_s": 200.0},
    }
    assert goals.best_bounded(contenders) == "naive-bounded-24"


def test_the_calibration_follows_the_emulated_gpu_on_the_routers_clock() -> None:
    p = get_profile("h100-llama3-8b")
    cal = routers.calibration("h100-llama3-8b", 1.0)
    pre = cal["prefill_cost_model"]
    for n in (4000, 20_000, 40_000):
        chunks, done, want = [], 0, 0.0
        while done < n:
            chunks.append(min(8192, n - done))
            want += p.prefill_time(chunks[-1], cached=done)
            done += chunks[-1]
        x = n / 1000
        got = (
            pre["intercept_seconds"]
            + pre["linear_seconds_per_1k_tokens"] * x
            + pre["quadratic_seconds_per_1k_tokens_squared"] * x * x
        )
        assert got == pytest.approx(want, rel=0.05), n
    dec = cal["decode_throughput_model"]
    assert dec["fixed_step_seconds"] > 0
    assert dec["batch_step_seconds_per_request"] >= 0
    assert dec["context_step_seconds_per_token"] >= 0
    fast = routers.calibration("h100-llama3-8b", 4.0)
    assert fast["prefill_cost_model"]["linear_seconds_per_1k_tokens"] == pytest.approx(
        pre["linear_seconds_per_1k_tokens"] / 4
    )
    assert fast["prefill_cost_model"]["decode_throughput_alpha"] == 0.15  # a ratio, not scaled


def test_the_program_scheduling_config_is_the_documented_one_scaled() -> None:
    cfg = routers.program_scheduling_config(kv_tokens=463_312, profile="h100-llama3-8b",
                                            time_scale=4.0)  # fmt: skip
    assert cfg["program_scheduling_enable_key"] == "auto"  # X-Session-ID names the program
    assert cfg["token_capacity_per_dp_rank"] == 463_312
    assert cfg["global_queue"] is True
    assert cfg["resume_order"] == "mru"
    assert cfg["metrics_interval_seconds"] == 0.25
    assert cfg["max_acting_ttl_seconds"] == 2.5
    assert cfg["queue_timeout_seconds"] == 150.0
    without = routers.program_scheduling_config(kv_tokens=None, profile="h100-llama3-8b",
                                                time_scale=1.0)  # fmt: skip
    assert "token_capacity_per_dp_rank" not in without  # the router's program-count guard


def test_a_missing_router_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routers, "router_unavailable", lambda kind: "vllm-router is not here")
    with pytest.raises(RuntimeError, match="vllm-router is not here"):
        routers.start_router("router-ps", ["http://x:1"], profile="h100-llama3-8b", time_scale=1)


def test_the_router_log_and_metrics_are_counted() -> None:
    proc = routers.RouterProcess("vllm-router", "consistent_hash", ["http://x:1"])
    esc = "\x1b[3mevent\x1b[0m\x1b[2m=\x1b[0m"
    for line in (
        f'INFO Program scheduling decision {esc}"program_admit" program=ab target="t"',
        f'INFO Program scheduling decision {esc}"program_pause" reason="ttl_expired"',
        'INFO Program scheduling decision event="program_pause" reason="capacity_repair"',
        "INFO consistent hash routing: no event here",
    ):
        proc._count(routers._ANSI.sub("", line))
    assert dict(proc.events) == {
        "program_admit": 1,
        "program_pause:ttl_expired": 1,
        "program_pause:capacity_repair": 1,
    }
    text = (
        "# HELP vllm_router_agent_aware_transitions_total x\n"
        'vllm_router_agent_aware_transitions_total{target="a",reason="program_admit"} 3\n'
        'vllm_router_agent_aware_transitions_total{target="b",reason="program_admit"} 2\n'
        'vllm_router_agent_aware_transitions_total{target="a",reason="ttl_expired"} 1\n'
        "vllm_router_other 5\n"
        "vllm_router_agent_aware_queue_wait_seconds_sum 0.5\n"
        "vllm_router_agent_aware_queue_wait_seconds_count 4\n"
    )
    assert routers.program_metrics(text, time_scale=4.0) == {
        "transitions": {"program_admit": 5, "ttl_expired": 1},
        "pool_waits": 4,
        "pool_wait_mean_s": 0.5,
        "pool_wait_total_s": 2.0,
    }
    assert routers.program_metrics("", time_scale=4.0)["pool_wait_mean_s"] is None


def test_a_plain_langgraph_agent_names_its_program_in_a_header() -> None:
    job = {"session_header": "X-Session-ID", "tasks": ["fix issue 1", "fix issue 2"]}
    bind = naive._session(job)
    assert bind is not None
    llm = GenericFakeChatModel(messages=iter(()))
    one, two = bind(llm, 0), bind(llm, 1)
    h1, h2 = one.kwargs["extra_headers"], two.kwargs["extra_headers"]
    assert h1["X-Session-ID"] == naive.session_id("fix issue 1")
    assert h1["X-Session-ID"] != h2["X-Session-ID"]
    assert naive._session({"tasks": ["t"]}) is None  # no router: no header


def test_rerender_leaves_runs_kept_beside_the_workloads_alone(tmp_path: Path) -> None:
    (tmp_path / "W8_router.json").write_text("{}")  # not a W<n>.json: never read
    report.rerender(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["W8_router.json"]
