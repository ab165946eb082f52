"""Integration fixtures: the emulator as a real server on loopback.

- `emulator_url`: one emulator subprocess for the whole session (agent
  scenario, h100 profile, time scale 50), e.g. `http://127.0.0.1:PORT`.
- `start_emulator(**overrides)`: a fresh emulator with `EmulatorConfig`
  overrides; returns its URL and stops it at the test's teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess

EMULATOR_TIME_SCALE = 50.0


@pytest.fixture(scope="session")
def emulator_config() -> EmulatorConfig:
    """The options of the session emulator."""
    return EmulatorConfig(port=0, time_scale=EMULATOR_TIME_SCALE)


@pytest.fixture(scope="session")
def emulator_url(emulator_config: EmulatorConfig) -> Iterator[str]:
    """URL of a session-wide emulator subprocess (no `/v1`)."""
    with EmulatorProcess(emulator_config) as emu:
        yield emu.url


@pytest.fixture
def start_emulator() -> Iterator[Callable[..., str]]:
    """Factory: `start_emulator(profile="zero", scenario="echo")` -> URL; stopped at teardown.

    It blocks until the server is healthy; from an async test call it with
    `await asyncio.to_thread(start_emulator, ...)`.
    """
    started: list[EmulatorProcess] = []

    def start(**overrides: Any) -> str:
        overrides.setdefault("port", 0)
        overrides.setdefault("time_scale", EMULATOR_TIME_SCALE)
        emu = EmulatorProcess(EmulatorConfig(**overrides))
        emu.start()
        started.append(emu)
        return emu.url

    yield start
    for emu in started:
        emu.stop()
