"""The emulator's `/metrics` speaks vLLM 0.32's exposition where the library reads it.

Checked against the real engine in `tests/engine/test_client_metrics.py`; this
keeps `make test` (no engine) guarding the emulator's side.
"""

from __future__ import annotations

from langgraph_batch.backends import parse_prometheus
from langgraph_batch.backends.vllm import parse_vllm_metrics
from langgraph_batch.emulator import EmulatorConfig
from langgraph_batch.emulator._server_metrics import render_metrics
from langgraph_batch.emulator._serving import Serving


def test_cache_config_info_states_the_capacity_in_tokens_as_vllm_does() -> None:
    text = render_metrics(Serving(EmulatorConfig(kv_tokens=8192)))
    ((labels, value),) = parse_prometheus(text).get("vllm:cache_config_info")
    assert value == 1.0
    blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    assert int(labels["kv_cache_size_tokens"]) == blocks * size
    assert parse_vllm_metrics(text).kv_capacity_tokens == blocks * size
