"""Fixtures of the distributed tests: real `redis-server` processes, real worker processes.

- `start_redis(appendonly=..., extra=...)`: a `redis-server --port <free> --bind
  127.0.0.1 --dir <tmp> --save ""` stopped by PID at teardown. There is no
  skip: without redis-server the tests fail (`make test` installs it).
- `start_worker(url, graph, *args)`: `langgraph-batch worker ...` as a
  subprocess (debug log to a file), killed at teardown.
- `watch_ttls(url)`: samples every `{lgb:*` key while a run goes on and
  records any that has no TTL (every key the distributed mode writes must).
- `tally(...)`: the Jepsen-style counts of one run (lost and duplicate results
  accepted, duplicate executions, dead-lettered), from the parent's results,
  the graph's execution log and the workers' logs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
GRAPHS = "tests.integration.distributed.graphs"
JEPSEN_OUT = os.environ.get("LGB_JEPSEN_OUT")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found is None:
        pytest.fail(
            "redis-server not found: the distributed tests need it. `make test` installs it "
            "(apt-get install redis-server); install it by hand elsewhere."
        )
    return found


class RedisProc:
    """One redis-server process on loopback; restartable on the same port and dir."""

    def __init__(self, directory: Path, *, appendonly: bool, extra: Sequence[str] = ()) -> None:
        self.dir = directory
        self.port = free_port()
        self.appendonly = appendonly
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.tls_port: int | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        return [
            redis_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            *self.extra,
        ]

    def start(self) -> RedisProc:
        log = (self.dir / "redis.log").open("ab")
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.dir / 'redis.log').read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("redis-server did not become ready")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()


@pytest.fixture
def start_redis(tmp_path: Path) -> Iterator[Callable[..., RedisProc]]:
    started: list[RedisProc] = []

    def start(*, appendonly: bool = False, extra: Sequence[str] = ()) -> RedisProc:
        d = tmp_path / f"redis{len(started)}"
        d.mkdir()
        proc = RedisProc(d, appendonly=appendonly, extra=extra)
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.kill()


class WorkerProc:
    """A `langgraph-batch worker` subprocess with its log in a file."""

    def __init__(self, url: str, graph: str, args: Sequence[str], log: Path, env: dict[str, str]):
        self.url, self.graph, self.args, self.log, self.env = url, graph, list(args), log, env
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> WorkerProc:
        argv = [
            sys.executable,
            "-m",
            "langgraph_batch.cli",
            "worker",
            self.url,
            f"{GRAPHS}:{self.graph}",
            "--app-dir",
            str(REPO),
            "--log-level",
            "debug",
            "--block",
            "0.2",
            *self.args,
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=REPO
            )
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "cluster in-flight cap" in self.text():
                return
            if not self.alive():
                raise RuntimeError(f"worker exited:\n{self.text()[-3000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"worker not ready:\n{self.text()[-3000:]}")


@dataclass
class Harness:
    """Paths shared by one test's workers and checks."""

    dir: Path
    exec_log: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("LGB_", "OPENAI_", "LANGSMITH_", "LANGCHAIN_"))
        }
        env.update(
            LGB_TEST_EXEC_LOG=str(self.exec_log),
            LANGSMITH_TRACING="false",
            PYTHONUNBUFFERED="1",
            **extra,
        )
        return env


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    return Harness(dir=tmp_path, exec_log=tmp_path / "executions.log")


@pytest.fixture
def start_worker(harness: Harness) -> Iterator[Callable[..., WorkerProc]]:
    """`start_worker(url, graph, *args, env={...})`: started and ready (its log line seen)."""
    workers: list[WorkerProc] = []

    def start(url: str, graph: str, *args: str, wait: bool = True, **env: str) -> WorkerProc:
        log = harness.dir / f"worker{len(workers)}.log"
        w = WorkerProc(url, graph, args, log, harness.env(**env)).start()
        workers.append(w)
        if wait:
            w.wait_ready()
        return w

    yield start
    for w in workers:
        w.kill()


@dataclass
class TtlWatch:
    """What `watch_ttls` saw: every key name, and those found without a TTL."""

    samples: int = 0
    seen: set[str] = field(default_factory=set)
    without_ttl: set[str] = field(default_factory=set)


@contextlib.asynccontextmanager
async def watch_ttls(url: str, every_s: float = 0.05) -> AsyncIterator[TtlWatch]:
    """Sample every `{lgb:*` key (SCAN + PTTL) while the body runs."""
    from langgraph_batch.distributed._redis import (
        CONNECTION_ERRORS,
        connect,
        raise_if_cancel_requested,
    )

    watch = TtlWatch()
    client = connect(url)

    async def sample() -> None:
        while True:
            raise_if_cancel_requested()  # redis-py may absorb the cancel below
            with contextlib.suppress(*CONNECTION_ERRORS):
                async for raw in client.scan_iter(match="{lgb:*", count=1000):
                    key = raw.decode()
                    watch.seen.add(key)
                    if await client.pttl(key) == -1:  # -2: deleted meanwhile
                        watch.without_ttl.add(key)
                watch.samples += 1
            await asyncio.sleep(every_s)

    task = asyncio.create_task(sample())
    try:
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()


# ---------------------------------------------------------------------------------------
# Jepsen-style accounting
# ---------------------------------------------------------------------------------------

_VERDICT = re.compile(r"job (\d+) of run (\w+): (accepted|duplicate|rejected)")


@dataclass
class Tally:
    case: str
    siblings: int
    lost: int
    duplicate_results_accepted: int
    executions: int
    duplicate_executions: int
    dead_lettered: list[int]
    rejected_late_results: int
    seconds: float
    recover_s: float | None = None

    def report(self) -> None:
        line = json.dumps(asdict(self))
        print(f"JEPSEN {line}")
        if JEPSEN_OUT:
            with open(JEPSEN_OUT, "a") as f:
                f.write(line + "\n")


def executions(exec_log: Path) -> collections.Counter[int]:
    counts: collections.Counter[int] = collections.Counter()
    if exec_log.exists():
        for line in exec_log.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[2] == "start":
                counts[int(parts[0])] += 1
    return counts


def tally(
    case: str,
    results: Sequence[Any],
    expected: Sequence[Any],
    exec_log: Path,
    workers: Sequence[WorkerProc],
    *,
    seconds: float,
    dead_ok: Sequence[int] = (),
    recover_s: float | None = None,
) -> Tally:
    """Count; a result that is not the expected value (or a SiblingError) counts as lost."""
    from langgraph_batch import SiblingError

    dead = [
        r.index
        for r in results
        if isinstance(r, SiblingError) and r.error_type == "DeadLetteredError"
    ]
    lost = sum(
        1
        for i, (got, want) in enumerate(zip(results, expected, strict=True))
        if got != want and i not in dead_ok
    )
    lost += max(0, len(expected) - len(results))
    verdicts: collections.Counter[tuple[str, str]] = collections.Counter()
    rejected = 0
    for w in workers:
        for job, run, verdict in _VERDICT.findall(w.text()):
            if verdict == "accepted":
                verdicts[(run, job)] += 1
            elif verdict == "rejected":
                rejected += 1
    execs = executions(exec_log)
    t = Tally(
        case=case,
        siblings=len(expected),
        lost=lost,
        duplicate_results_accepted=sum(c - 1 for c in verdicts.values() if c > 1),
        executions=sum(execs.values()),
        duplicate_executions=sum(c - 1 for c in execs.values() if c > 1),
        dead_lettered=dead,
        rejected_late_results=rejected,
        seconds=round(seconds, 2),
        recover_s=None if recover_s is None else round(recover_s, 2),
    )
    t.report()
    return t


async def atally(*args: Any, **kwargs: Any) -> Tally:
    """`tally` off the event loop (it reads files)."""
    return await asyncio.to_thread(tally, *args, **kwargs)


@contextlib.contextmanager
def timer() -> Iterator[list[float]]:
    box = [time.monotonic()]
    yield box
    box[0] = time.monotonic() - box[0]


@contextlib.asynccontextmanager
async def supervised(workers: Sequence[WorkerProc]) -> AsyncIterator[None]:
    """Restart dead workers while the body runs (what systemd or compose `restart: always` do)."""
    stop = asyncio.Event()

    async def supervise() -> None:
        while not stop.is_set():
            for w in workers:
                if not w.alive():
                    await asyncio.to_thread(w.start)
            await asyncio.sleep(0.1)

    supervisor = asyncio.create_task(supervise())
    try:
        yield
    finally:
        stop.set()
        await supervisor
