"""Chaos fixtures: an emulator process that can be SIGKILLed and restarted on its port."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from langgraph_batch.emulator import EmulatorConfig


class KillableEmulator:
    """`python -m langgraph_batch.emulator` on a fixed port; `kill()` sends SIGKILL."""

    def __init__(self, config: EmulatorConfig) -> None:
        if config.port == 0:
            with socket.socket() as s:
                s.bind((config.host, 0))
                config = config.with_overrides(port=s.getsockname()[1])
        self.config = config
        self.url = f"http://{config.host}:{config.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout: float = 30.0) -> None:
        """Start the process and wait until `/health` answers (blocking: call in a thread)."""
        cmd = [sys.executable, "-m", "langgraph_batch.emulator", *self.config.to_argv()]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.starts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the emulator exited with {self.proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError("the emulator did not become healthy in time")

    def kill(self) -> None:
        """SIGKILL: no goodbye to any connection."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> None:
        """SIGKILL, then a new process on the same port."""
        self.kill()
        self.start()


@pytest.fixture
def killable_emulator() -> Iterator[type[KillableEmulator]]:
    made: list[KillableEmulator] = []

    class Tracked(KillableEmulator):
        def __init__(self, config: EmulatorConfig) -> None:
            super().__init__(config)
            made.append(self)

    yield Tracked
    for emu in made:
        emu.kill()
