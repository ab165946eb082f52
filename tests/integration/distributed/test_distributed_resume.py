"""A parent killed mid-run re-attaches to its run in Redis when its thread runs again.

The parent (SQLite checkpointer) is SIGKILLed after some siblings finished;
the workers keep going. Run again with the same thread, it finds the run by
its attach key, collects every outcome and re-runs nothing.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from langgraph_batch.distributed._redis import connect
from tests.integration.distributed.conftest import (
    REPO,
    Harness,
    RedisProc,
    WorkerProc,
    executions,
    watch_ttls,
)

pytestmark = pytest.mark.anyio

N = 8


def _parent(mode: str, db: Path, url: str, harness: Harness) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.distributed.resume_parent",
            mode,
            str(db),
            url,
            str(N),
        ],
        cwd=REPO,
        env=harness.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_a_dead_parent_reattaches_without_rerunning_siblings(
    start_redis: Callable[..., RedisProc],
    start_worker: Callable[..., WorkerProc],
    harness: Harness,
    tmp_path: Path,
) -> None:
    redis = await asyncio.to_thread(start_redis, appendonly=True)
    await asyncio.to_thread(start_worker, redis.url, "sleepy", "--concurrency", "2")
    db = tmp_path / "checkpoints.sqlite"

    first = await asyncio.to_thread(_parent, "first", db, redis.url, harness)
    deadline = time.monotonic() + 30
    async with watch_ttls(redis.url) as ttls:
        while (
            sum(
                1
                for line in (await asyncio.to_thread(_lines, harness.exec_log))
                if line.endswith("done")
            )
            < 3
        ):
            assert time.monotonic() < deadline, "the first run did not progress"
            assert first.poll() is None, "the first parent exited early"
            await asyncio.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        await asyncio.to_thread(first.wait)
    # Every key of the run, the thread's attach key included, has a TTL: a parent that
    # never comes back leaves nothing behind for good.
    assert any(re.match(r"^\{lgb:a:", k) for k in ttls.seen), ttls.seen
    assert any(k.endswith("}:jobs") for k in ttls.seen), ttls.seen
    assert not ttls.without_ttl, ttls.without_ttl

    second = await asyncio.to_thread(_parent, "resume", db, redis.url, harness)
    out, err = await asyncio.to_thread(second.communicate, timeout=60)
    assert second.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1]) == [2 * i for i in range(N)]
    found = re.search(r"re-attached, (\d+) of (\d+) siblings already have an outcome", err)
    assert found is not None, err[-3000:]
    assert int(found.group(1)) >= 3
    assert int(found.group(2)) == N
    # Every sibling ran exactly once: finished ones were collected, not run again.
    assert await asyncio.to_thread(executions, harness.exec_log) == dict.fromkeys(range(N), 1)
    client = connect(redis.url)
    try:
        left = [k.decode() async for k in client.scan_iter(match="{lgb:*")]
    finally:
        await client.aclose()
    assert not [k for k in left if re.match(r"^\{lgb:(a:|[0-9a-f]{32}\})", k)], left


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
