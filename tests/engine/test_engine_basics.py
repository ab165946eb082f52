"""The engine tier's own parts: the server answers as vLLM, on loopback, with the asked KV."""

from __future__ import annotations

import httpx

from benchmarks.vllm_cpu import VLLM_CPU_VERSION, VLLMCPUServer
from langgraph_batch.backends import parse_prometheus


def test_server_is_vllm_on_loopback(engine: VLLMCPUServer) -> None:
    assert engine.url.startswith("http://127.0.0.1:")
    models = httpx.get(f"{engine.url}/v1/models", timeout=30).json()["data"]
    assert [m["id"] for m in models] == ["tiny-llama"]
    assert httpx.get(f"{engine.url}/version", timeout=30).json()["version"] == VLLM_CPU_VERSION


def test_kv_capacity_and_block_size_are_the_configured_ones(engine: VLLMCPUServer) -> None:
    text = httpx.get(f"{engine.url}/metrics", timeout=30).text
    info = next(line for line in text.splitlines() if line.startswith("vllm:cache_config_info{"))
    assert f'block_size="{engine.config.block_size}"' in info
    assert f'kv_cache_size_tokens="{engine.config.kv_tokens}"' in info
    assert 'enable_prefix_caching="True"' in info
    assert parse_prometheus(text).sum("vllm:num_requests_running") == 0.0
