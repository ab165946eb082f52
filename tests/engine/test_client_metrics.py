"""The library's reading of vLLM's own `/metrics`, against the real engine and the emulator.

Every figure `VLLMBackend.metrics()` reads from the emulator must be read from
vLLM 0.32 too (names, labels, units), and the emulator's exposition must not
offer the library anything vLLM does not.
"""

from __future__ import annotations

import asyncio
from dataclasses import fields

from benchmarks.vllm_cpu import VLLMCPUServer
from langgraph_batch import BatchedChatModel
from langgraph_batch.backends import parse_prometheus
from langgraph_batch.backends.vllm import VLLMBackend, parse_vllm_metrics
from langgraph_batch.emulator import EmulatorConfig
from langgraph_batch.emulator._server_metrics import render_metrics
from langgraph_batch.emulator._serving import Serving
from tests.engine._client import metrics_text, vllm_url, wait_metric

READ = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:cache_config_info",
)
"""What `parse_vllm_metrics` reads (`vllm:gpu_cache_usage_perc` is only the fallback of
vLLM < 0.10, which v1 engines no longer export)."""


def _names_and_cache_labels(text: str) -> tuple[set[str], set[str]]:
    samples = parse_prometheus(text)
    names = {n for n in samples.names() if n.startswith("vllm:")}
    (labels, _), *_ = samples.get("vllm:cache_config_info")
    return names, set(labels)


async def test_every_figure_is_read_from_the_engine(engine: VLLMCPUServer) -> None:
    llm = BatchedChatModel(model=engine.model, base_url=vllm_url(engine), max_tokens=2)
    prompt = "warm the prefix cache " * 16  # several 32-token blocks: the second call hits
    await llm.ainvoke(prompt)
    await llm.ainvoke(prompt)
    backend = VLLMBackend(engine.url)
    m = await backend.metrics()
    assert m is not None
    # Every figure but the second KV tier's: this server has none (vllm-cpu refuses
    # `--kv-offloading-size`), which `kv_offload_tokens=None` says.
    missing = [f.name for f in fields(m) if getattr(m, f.name) is None]
    assert missing == ["kv_offload_tokens"]
    assert (m.num_requests_running, m.num_requests_waiting) == (0.0, 0.0)
    assert m.kv_capacity_tokens == engine.config.kv_tokens
    assert (m.block_size, m.prefix_caching, m.engines) == (32, True, 1)
    assert m.prefix_cache_hits_total
    assert m.prefix_cache_hits_total > 0
    assert m.cache_hit_rate is not None
    assert 0 < m.cache_hit_rate < 1
    assert m.kv_cache_usage is not None
    assert 0 <= m.kv_cache_usage <= 1
    text = await metrics_text(engine)
    names, labels = _names_and_cache_labels(text)
    assert set(READ) <= names
    assert {"block_size", "num_gpu_blocks", "kv_cache_size_tokens"} <= labels
    # The scheduler sizes its KV ledger from the same reading.
    assert await llm.get_scheduler().kv_capacity() == engine.config.kv_tokens
    await llm.get_scheduler().aclose()
    await backend.aclose()


async def test_load_and_kv_usage_are_read_while_a_request_runs(engine: VLLMCPUServer) -> None:
    llm = BatchedChatModel(
        model=engine.model,
        base_url=vllm_url(engine),
        max_tokens=20000,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    task = asyncio.create_task(llm.ainvoke("word " * 600))
    m, _ = await wait_metric(
        engine,
        lambda m: m.num_requests_running == 1 and (m.kv_cache_usage or 0) > 0,
        what="one request running with KV in use",
    )
    # 600+ tokens of a 131,072-token cache: vLLM's usage is blocks in use / all blocks.
    assert m.kv_cache_usage is not None
    assert 600 / 131072 <= m.kv_cache_usage < 0.2
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await wait_metric(engine, lambda m: m.num_requests_running == 0, what="idle")
    await llm.get_scheduler().aclose()


async def test_the_emulator_exposes_nothing_vllm_does_not(engine: VLLMCPUServer) -> None:
    real_names, real_labels = _names_and_cache_labels(await metrics_text(engine))
    emulated = render_metrics(Serving(EmulatorConfig(kv_tokens=131072)))
    emu_names, emu_labels = _names_and_cache_labels(emulated)
    assert emu_names - real_names == set()
    assert emu_labels - real_labels == set()
    assert set(READ) <= emu_names
    # Both read the same way: the capacity the server states.
    assert parse_vllm_metrics(emulated).kv_capacity_tokens == 131072
