"""A real local Ray cluster for the tests: `ray start --head` and `ray start --address`.

Each node is its own `ray start --block` process in its own process group, so
a node is killed (SIGKILL to the group: raylet, agents and its actors' worker
processes) and the cluster stopped by the process groups this file started,
never by `ray stop` (which would stop other people's clusters on the machine).
Every node gets `--num-cpus 1`, a small object store, no dashboard, and a
temp dir of its own under a short directory of /tmp: Ray's Unix sockets live
there, and a path of pytest-xdist's (`.../popen-gw1/...`) passes the 107 bytes
AF_UNIX allows.

Ray resolves 127.0.0.1 to the machine's routable address; 127.0.0.2 is a
loopback address it keeps, so the cluster listens on loopback only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.integration.distributed.conftest import REPO, free_port

NODE_IP = "127.0.0.2"
_RAY = str(Path(sys.executable).with_name("ray"))
_MARKER = "LGB_TEST_RAY_NODE"
# Node deaths are noticed in about 1.5 s instead of the default 15 s.
_SYSTEM_CONFIG = '{"health_check_period_ms":500,"health_check_failure_threshold":3}'


class RayCluster:
    """A head node and `workers` more node processes on this machine."""

    def __init__(
        self,
        tmp: Path,
        *,
        env: dict[str, str] | None = None,
        gcs_redis: str | None = None,
        worker_ip: str = NODE_IP,
    ) -> None:
        self.tmp = tmp
        self.sockets = Path(tempfile.mkdtemp(prefix="lgb-ray-"))
        """The nodes' `--temp-dir`s (Ray's sockets): short, removed by `stop`."""
        self.port = free_port()
        self.gcs_redis = gcs_redis
        """`host:port` of an external Redis that keeps the GCS's state (GCS fault tolerance)."""
        self.worker_ip = worker_ip
        """The other nodes' address (another loopback address keeps them apart from the head)."""
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "RAY_USAGE_STATS_ENABLED": "0",
            **(env or {}),
        }
        self.head: subprocess.Popen[bytes] | None = None
        self.head_starts = 0
        self.workers: list[subprocess.Popen[bytes]] = []
        self.exec_log = tmp / "exec.log"
        """Where the test graphs log executions, when `env` names it (`LGB_TEST_EXEC_LOG`)."""

    @property
    def address(self) -> str:
        return f"{NODE_IP}:{self.port}"

    def _start(
        self, args: list[str], name: str, ip: str = NODE_IP, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        # Every process of the node inherits this marker (Ray retitles its workers,
        # so their command lines do not tell which node they belong to).
        env = {**self.env, **(env or {}), _MARKER: f"{self.tmp}/{name}"}
        return subprocess.Popen(
            [
                _RAY,
                "start",
                "--block",
                "--node-ip-address",
                ip,
                "--num-cpus",
                "1",
                "--object-store-memory",
                "80000000",
                "--disable-usage-stats",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def start(self, workers: int = 1, timeout: float = 60.0) -> None:
        """Start the head and `workers` nodes; return once every node is alive."""
        self.start_head()
        self.wait_alive(1, timeout)
        for _ in range(workers):
            self.add_worker()
        self.wait_alive(1 + workers, timeout)

    def start_head(self) -> None:
        """Start the head node's process (again, on the same port, after `kill_head`)."""
        env = None if self.gcs_redis is None else {"RAY_REDIS_ADDRESS": self.gcs_redis}
        self.head = self._start(
            [
                "--head",
                "--port",
                str(self.port),
                "--include-dashboard=false",
                "--temp-dir",
                # A fresh one on restart: `ray start --head` refuses a port that the temp
                # dir's last cluster used while a live node (its raylet) still names it.
                str(self.sockets / f"head{self.head_starts or ''}"),
                "--ray-client-server-port",
                str(free_port()),
                "--system-config",
                _SYSTEM_CONFIG,
            ],
            "head",
            env=env,
        )
        self.head_starts += 1

    def kill_head(self) -> None:
        """SIGKILL the head's whole process group: GCS, raylet, agents and actor processes."""
        assert self.head is not None
        strays = self._strays(f"{self.tmp}/head")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.head.pid, signal.SIGKILL)
        for stray in strays:
            with contextlib.suppress(Exception):
                stray.kill()
        self.head.wait(10)
        # `ray start --head` refuses a port while a GCS process of that address is listed.
        import psutil

        _, alive = psutil.wait_procs(strays, timeout=10)
        if alive:
            raise RuntimeError(f"head processes outlived SIGKILL: {alive}")

    def add_worker(self) -> None:
        """Start one more node process (joins the head)."""
        n = len(self.workers)
        self.workers.append(
            self._start(
                ["--address", self.address, "--temp-dir", str(self.sockets / f"node{n}")],
                f"node{n}",
                ip=self.worker_ip,
            )
        )

    def alive(self) -> int:
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "import ray,sys; ray.init(address=sys.argv[1], log_to_driver=False); "
                "print(sum(1 for n in ray.nodes() if n['Alive']))",
                self.address,
            ],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
            check=False,
        )
        try:
            return int(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0

    def wait_alive(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.head is not None and self.head.poll() is not None:
                raise RuntimeError(f"the Ray head exited; see {self.tmp / 'head.log'}")
            if self.alive() >= n:
                return
            time.sleep(0.5)
        raise RuntimeError(f"fewer than {n} Ray nodes alive after {timeout} s")

    def live_workers(self) -> list[int]:
        """Indices of the node processes started here that still run."""
        return [i for i, p in enumerate(self.workers) if p.poll() is None]

    def kill_worker(self, i: int = 0) -> None:
        """SIGKILL a node's whole process group: raylet, agents and actor processes."""
        proc = self.workers[i]
        # Found first, then killed together: a node dies at once, as a machine would
        # (its actors' processes run in sessions of their own, outside the group).
        strays = self._strays(f"{self.tmp}/node{i}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for stray in strays:
            with contextlib.suppress(Exception):
                stray.kill()
        proc.wait(10)

    def stop(self) -> None:
        """Kill every node this cluster started (workers first), by process group."""
        for proc in [*self.workers, self.head]:
            if proc is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 3
        for proc in [*self.workers, self.head]:
            if proc is None:
                continue
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self._kill_strays(f"{self.tmp}/")
        shutil.rmtree(self.sockets, ignore_errors=True)

    @staticmethod
    def _strays(marker: str) -> list[Any]:
        """Our processes: their environment carries a marker that starts with `marker`."""
        import psutil

        found = []
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error):
                value = proc.environ().get(_MARKER, "")
                if value == marker or (marker.endswith("/") and value.startswith(marker)):
                    found.append(proc)
        return found

    @classmethod
    def _kill_strays(cls, directory: str) -> None:
        """Kill what outlived its group (Ray workers may start sessions of their own)."""
        for proc in cls._strays(directory):
            with contextlib.suppress(Exception):
                proc.kill()
