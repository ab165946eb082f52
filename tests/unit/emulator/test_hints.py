"""The emulator checks `vllm_xargs` as vLLM does and can accept agent hints."""

from __future__ import annotations

import pytest

from langgraph_batch.emulator._hints import AgentHints
from langgraph_batch.emulator._http import RequestError
from langgraph_batch.emulator.cli import build_parser, config_from_args
from langgraph_batch.emulator.config import EmulatorConfig

CTX = {"program_id": "p1", "step_id": 2, "expected_output_length": 64, "priority": 3}


def test_stock_vllm_takes_flat_xargs_only() -> None:
    hints = AgentHints(accept=False)
    hints.check({"vllm_xargs": {"a": "x", "b": 1, "c": 2.5, "d": ["x", 1]}})
    hints.check({})
    for bad in ({"agentic_context": CTX}, {"a": {"b": 1}}, {"a": [["x"]]}, {"a": None}):
        with pytest.raises(RequestError, match="vllm_xargs"):
            hints.check({"vllm_xargs": bad})
    with pytest.raises(RequestError, match="valid dictionary"):
        hints.check({"vllm_xargs": ["x"]})
    assert hints.stats()["requests"] == 0


def test_an_agent_aware_engine_records_the_hints() -> None:
    hints = AgentHints(accept=True)
    hints.check({"vllm_xargs": {"agentic_context": CTX, "other": "x"}})
    hints.check({"vllm_xargs": {"agentic_context": {**CTX, "step_id": 3}}})
    hints.check(
        {"vllm_xargs": {"agentic_context": {"program_id": "p2", "kv_retention_ttl_seconds": 2.5}}}
    )
    assert hints.stats() == {
        "accepted": True,
        "requests": 3,
        "programs": 2,
        "steps_per_program": [0, 2],
        "step_ids": [2, 3],
        "expected_output_length": [64],
        "priorities": [3],
        "kv_retention_ttl_seconds": {"requests": 1, "min": 2.5, "max": 2.5},
    }
    with pytest.raises(RequestError, match="program_id"):
        hints.check({"vllm_xargs": {"agentic_context": {"step_id": 1}}})
    with pytest.raises(RequestError, match="kv_retention_ttl_seconds"):  # as vllm-router
        hints.check({"vllm_xargs": {"agentic_context": {**CTX, "kv_retention_ttl_seconds": -1}}})
    with pytest.raises(RequestError, match="program_id"):
        hints.check({"vllm_xargs": {"agentic_context": {"step_id": 1}}})
    hints.reset()
    assert hints.stats()["programs"] == 0


def test_the_option_round_trips_through_the_command_line() -> None:
    cfg = EmulatorConfig(port=0, agentic_context=True)
    assert config_from_args(build_parser().parse_args(cfg.to_argv())).agentic_context
    assert not config_from_args(
        build_parser().parse_args(EmulatorConfig().to_argv())
    ).agentic_context
