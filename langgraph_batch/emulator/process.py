"""Run the emulator: in-process (`serve`) or as its own OS process (`EmulatorProcess`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any, Self

import httpx

from langgraph_batch._extras import missing_extra
from langgraph_batch._process import terminate
from langgraph_batch.emulator.config import EmulatorConfig
from langgraph_batch.emulator.engine import Engine
from langgraph_batch.emulator.server import EmulatorServer

__all__ = ("READY_PREFIX", "EmulatorProcess", "RunningEmulator", "serve")

READY_PREFIX = "langgraph-batch emulator ready at "
"""The line the command prints on stdout once it listens (followed by the URL)."""


class RunningEmulator:
    """An emulator served in the current event loop (from `serve`)."""

    def __init__(self, server: EmulatorServer, url: str) -> None:
        self.server = server
        self.url = url
        """`http://host:port` (no `/v1`)."""

    @property
    def engine(self) -> Engine:
        """The engine (counters readable directly)."""
        return self.server.engine

    @property
    def config(self) -> EmulatorConfig:
        """The options it runs with."""
        return self.server.config


def _uvicorn_config(server: EmulatorServer) -> Any:
    try:
        import uvicorn
    except ImportError:
        raise ImportError(
            "the emulator needs uvicorn and starlette: pip install 'langgraph-batch[emulator]'"
        ) from None
    cfg = server.config
    return uvicorn.Config(
        server.app,
        host=cfg.host,
        port=cfg.port,
        log_level=cfg.log_level,
        access_log=False,
        lifespan="on",
        timeout_keep_alive=30,
        backlog=4096,
    )


def _bound_port(userver: Any) -> int:
    for s in userver.servers:
        for sock in s.sockets:
            return int(sock.getsockname()[1])
    raise RuntimeError("uvicorn started without a listening socket")


def _in_process_server_class() -> Any:
    try:
        import uvicorn
    except ImportError:  # the optional `emulator` extra
        raise missing_extra("emulator", "the emulator needs uvicorn and starlette") from None

    class InProcessServer(uvicorn.Server):
        """A uvicorn server that leaves the host program's signal handlers alone."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return InProcessServer


@contextlib.asynccontextmanager
async def serve(
    config: EmulatorConfig | None = None, **overrides: Any
) -> AsyncIterator[RunningEmulator]:
    """Serve the emulator in the running event loop (a uvicorn task).

    Example:
        ```python
        async with serve(EmulatorConfig(port=0, time_scale=50)) as emu:
            ...  # emu.url, emu.engine.counters
        ```

    Args:
        config: Options (default: `EmulatorConfig()` with port 0).
        **overrides: Option overrides applied to `config`.

    Yields:
        The running emulator; it stops when the block exits.
    """
    base = config if config is not None else EmulatorConfig(port=0)
    cfg = base.with_overrides(**overrides) if overrides else base
    server = EmulatorServer(cfg)
    userver = _in_process_server_class()(_uvicorn_config(server))
    task = asyncio.get_running_loop().create_task(userver.serve(), name="emulator-uvicorn")
    try:
        while not userver.started:
            if task.done():
                task.result()
                raise RuntimeError("the emulator's server stopped before it started")
            await asyncio.sleep(0.01)
        url = f"http://{cfg.host}:{_bound_port(userver)}"
        yield RunningEmulator(server, url)
    finally:
        userver.should_exit = True
        try:
            async with asyncio.timeout(10):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()


class EmulatorProcess:
    """The emulator in its own OS process (`python -m langgraph_batch.emulator`).

    Example:
        ```python
        with EmulatorProcess(EmulatorConfig(port=0, time_scale=50)) as emu:
            httpx.get(emu.url + "/health")
        ```

    Args:
        config: Options; `port=0` picks a free port.
        startup_timeout: Seconds to wait for the ready line and `/health`.
    """

    def __init__(
        self, config: EmulatorConfig | None = None, *, startup_timeout: float = 30.0
    ) -> None:
        if not startup_timeout > 0:
            raise ValueError(f"startup_timeout must be > 0, got {startup_timeout}")
        self.config = config if config is not None else EmulatorConfig(port=0)
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[str] | None = None
        self._url: str | None = None
        self._output: list[str] = []

    @property
    def url(self) -> str:
        """`http://host:port` once started."""
        if self._url is None:
            raise RuntimeError("EmulatorProcess is not running; use `with EmulatorProcess(...)`")
        return self._url

    def start(self) -> None:
        """Start the process and wait until `/health` answers 200.

        Raises:
            RuntimeError: it exited or did not become ready in time (with its output).
        """
        cmd = [sys.executable, "-m", "langgraph_batch.emulator", *self.config.to_argv()]
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        ready = threading.Event()
        pattern = re.compile(re.escape(READY_PREFIX) + r"(\S+)")

        def pump() -> None:
            proc = self._proc
            if proc is None or proc.stdout is None:
                return
            for line in proc.stdout:
                if len(self._output) < 2000:
                    self._output.append(line)
                m = pattern.search(line)
                if m and self._url is None:
                    self._url = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=pump, name="emulator-output", daemon=True).start()
        deadline = time.monotonic() + self.startup_timeout
        ready.wait(self.startup_timeout)
        if self._url is None:
            self.stop()
            raise RuntimeError("the emulator did not start:\n" + "".join(self._output[-40:]))
        while time.monotonic() < deadline:
            try:
                if httpx.get(self._url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("the emulator did not become healthy:\n" + "".join(self._output[-40:]))

    @property
    def output(self) -> str:
        """What the process printed (first 2000 lines)."""
        return "".join(self._output)

    def stop(self) -> None:
        """Terminate the process (kill after 5 s). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        terminate(proc)
        if proc.stdout is not None:
            proc.stdout.close()

    def kill(self) -> None:
        """Kill the process at once (SIGKILL): a crashed server, for failover tests. Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
