"""The Ray head killed and restarted mid-run, with GCS fault tolerance (an external Redis).

A cluster of its own (not the session's): its GCS keeps its state in a real
`redis-server` (`RAY_REDIS_ADDRESS`), the second node and the parent's driver
sit on another loopback address (127.0.0.3) so the driver is attached to the
second node's raylet, not the head's (a driver exits with its raylet). The
parent runs in a process of its own (`ray_head_parent.py`, a SQLite
checkpointer). Once 3 of 12 siblings have finished, the head's whole process
group (GCS, raylet, its runner actor) is SIGKILLed and the head started again
on the same port with the same Redis.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.distributed.conftest import RedisProc
from tests.integration.distributed.ray_cluster import RayCluster

pytestmark = pytest.mark.timeout(150)

N = 12
OTHER_IP = "127.0.0.3"


def _rows(log: Path) -> list[list[str]]:
    """The execution log's lines, split: `<index> <pid> start|done|cancel`, or `tool ...`."""
    return [line.split() for line in log.read_text().splitlines() if line.strip()]


def _counts(log: Path, what: str) -> collections.Counter[int]:
    return collections.Counter(int(r[0]) for r in _rows(log) if r[-1] == what and r[0] != "tool")


def _descends_from(pid: int, root: int) -> bool:
    """Whether process `pid` is `root` or one of its descendants (Linux /proc)."""
    while pid > 1:
        if pid == root:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent's pid
    return False


def _running_on(log: Path, root: int) -> bool:
    """Whether a sibling started and not done runs under process `root` (the head)."""
    rows = _rows(log)
    ended = {(r[0], r[1]) for r in rows if r[-1] in ("done", "cancel")}
    return any(
        r[-1] == "start"
        and r[0] != "tool"
        and (r[0], r[1]) not in ended
        and _descends_from(int(r[1]), root)
        for r in rows
    )


def _parent(cluster: RayCluster, mode: str, db: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.distributed.ray_head_parent",
            mode,
            str(db),
            cluster.address,
            OTHER_IP,
            str(N),
        ],
        stdout=subprocess.PIPE,
        stderr=(cluster.tmp / f"parent-{mode}.log").open("wb"),
        env=cluster.env,
    )


def _result(proc: subprocess.Popen[bytes], limit_s: float) -> tuple[int, dict[str, Any]]:
    out, _ = proc.communicate(timeout=limit_s)
    return proc.returncode, json.loads(out.decode().strip().splitlines()[-1])


def test_the_head_restarts_mid_run_and_the_run_finishes_in_order(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # A short directory: Ray's socket paths under it must fit AF_UNIX's 107 bytes.
    tmp_path = tmp_path_factory.mktemp("rayhead")
    redis = RedisProc(tmp_path, appendonly=False).start()
    log = tmp_path / "exec.log"
    log.write_text("")
    cluster = RayCluster(
        tmp_path,
        env={"LGB_TEST_EXEC_LOG": str(log)},
        gcs_redis=f"127.0.0.1:{redis.port}",
        worker_ip=OTHER_IP,
    )
    try:
        cluster.start(workers=1)
        assert cluster.head is not None
        proc = _parent(cluster, "first", tmp_path / "checkpoints.db")
        deadline = time.monotonic() + 60
        # Kill once 3 have finished and the head runs one (a loaded machine may
        # otherwise kill it between its siblings: nothing to run again).
        while len(_counts(log, "done")) < 3 or not _running_on(log, cluster.head.pid):
            assert proc.poll() is None, (tmp_path / "parent-first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run never got going"
            time.sleep(0.05)
        cluster.kill_head()
        killed = time.monotonic()
        cluster.start_head()
        rc, result = _result(proc, limit_s=60)
        took = time.monotonic() - killed
        cluster.wait_alive(2, 30)  # the restarted head and the second node, both alive
    finally:
        cluster.stop()
        redis.kill()
    assert rc == 0, result
    assert result["out"] == [{"y": 2 * i} for i in range(N)]
    starts, dones = _counts(log, "start"), _counts(log, "done")
    assert set(dones) == set(range(N))
    # The head died holding siblings: they ran again on the second node (at least once).
    rerun = sorted(i for i, n in starts.items() if n > 1)
    assert rerun
    print(
        f"\nhead restart: finished {took:.1f} s after the kill; re-run {rerun}; "
        f"finished twice {sorted(i for i, n in dones.items() if n > 1)}"
    )
