"""What workers share: the cluster-wide in-flight cap, coalesced tools, ACL users, TLS.

The cap is measured at a small HTTP server standing in for the inference
server: it counts requests in flight and records the peak.
"""

from __future__ import annotations

import asyncio
import collections
import re
import socket
import subprocess
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError

from langgraph_batch.distributed import ACL_RULES
from langgraph_batch.distributed._redis import connect
from tests.integration.distributed._parent import executor, parent_graph, run_parent
from tests.integration.distributed.conftest import (
    Harness,
    RedisProc,
    WorkerProc,
    atally,
    executions,
    free_port,
    watch_ttls,
)

pytestmark = pytest.mark.anyio


def _peak_inflight(rows: list[list[Any]]) -> int:
    """Most requests the emulator held at once (rows: id, arrival, ..., finish, ...)."""
    edges = sorted([(r[1], 1) for r in rows] + [(r[4], -1) for r in rows])
    peak = now = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


async def _emulator_rows(url: str, run: Callable[[], Awaitable[Any]]) -> tuple[Any, list[Any]]:
    """Reset the emulator, run, return the result and the requests it served meanwhile."""
    async with httpx.AsyncClient(base_url=url) as client:
        (await client.post("/emulator/reset")).raise_for_status()
        since = (await client.get("/emulator/stats")).json()["engine_time_s"]
        out = await run()
        rows = (await client.get("/emulator/requests", params={"since": since})).json()
    return out, rows["requests"]


async def _workers(
    start_worker: Callable[..., WorkerProc], n: int, *args: Any, **env: str
) -> list[WorkerProc]:
    workers = [await asyncio.to_thread(start_worker, *args, wait=False, **env) for _ in range(n)]
    await asyncio.gather(*(asyncio.to_thread(w.wait_ready) for w in workers))
    return workers


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape_completed(port: int) -> float:
    """`lgb_scheduler_completed_total`, summed over the worker's schedulers."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "lgb_scheduler_completed_total"
    )


async def test_workers_batch_and_the_cluster_cap_holds(
    start_redis: Callable[..., RedisProc],
    start_worker: Callable[..., WorkerProc],
    start_emulator: Callable[..., str],
    harness: Harness,
) -> None:
    # The emulator process stands in for the inference server: its per-request phases
    # (arrival, finish) give how many requests it held at once.
    url = await asyncio.to_thread(
        start_emulator, scenario="echo", time_scale=1.0, model="test-model"
    )
    llm = {"LGB_TEST_LLM_URL": "vllm://" + url.split("://", 1)[1], "LGB_TEST_LLM_MAX_TOKENS": "16"}
    redis = await asyncio.to_thread(start_redis)
    capped = [
        await asyncio.to_thread(
            start_worker,
            redis.url,
            "asker",
            "--concurrency",
            "8",
            "--cluster-inflight",
            "3",
            wait=False,
            **llm,
        )
        for _ in range(2)
    ]
    metrics_port = _free_port()
    free = await asyncio.to_thread(
        start_worker,
        redis.url,
        "asker_free",
        "--concurrency",
        "8",
        "--metrics-port",
        str(metrics_port),
        wait=False,
        **llm,
    )
    await asyncio.gather(*(asyncio.to_thread(w.wait_ready) for w in [*capped, free]))

    def graph(name: str) -> Any:
        return parent_graph(
            executor(redis.url, name),
            make_input=lambda x, i: {"prompt": f"question {i}"},
            result=lambda final: final["answer"],
        )

    # One worker, no cap: it runs its 8 siblings at once and its scheduler sends their
    # calls together, tagged with their sibling (the run's group, the sibling's index,
    # its turn) in the request id; a batch (one call for several siblings' requests)
    # is named after its first request, with a suffix per request.
    (out, _), rows = await _emulator_rows(url, lambda: run_parent(graph("asker_free"), [0] * 8))
    assert len(out) == len(rows) == 8
    assert _peak_inflight(rows) >= 4, rows
    ids = [re.fullmatch(r"lgb-([0-9a-f]{16})-(\d+)-t0-[0-9a-f]{8}(-\d+)?", r[0]) for r in rows]
    assert all(ids), [r[0] for r in rows]
    assert len({m.group(1) for m in ids if m}) == 1  # one run: one sibling group
    # --metrics-port: the worker's scheduler on its own Prometheus endpoint (loopback).
    log = await asyncio.to_thread(free.text)
    assert f"metrics on http://127.0.0.1:{metrics_port}/metrics" in log
    scraped = await asyncio.to_thread(_scrape_completed, metrics_port)
    assert scraped == 8, scraped

    # Two workers, 16 siblings at once, a cluster-wide cap of 3 requests in flight.
    async with watch_ttls(redis.url) as ttls:
        (out, _), rows = await _emulator_rows(
            url, lambda: run_parent(graph("asker"), list(range(24)))
        )
    assert len(out) == len(rows) == 24
    assert all(isinstance(answer, str) and answer for answer in out)
    assert _peak_inflight(rows) == 3, rows  # never more, and the cap was used
    logs = [await asyncio.to_thread(w.text) for w in capped]
    assert all("accepted" in log for log in logs), "both workers ran siblings"
    assert any(k.startswith("{lgb:sem:") for k in ttls.seen), ttls.seen
    assert not ttls.without_ttl, ttls.without_ttl
    client = connect(redis.url)
    try:
        leases = [k async for k in client.scan_iter(match="{lgb:sem:*")]
        for key in leases:
            assert await client.zcard(key) == 0, key  # every lease released
    finally:
        await client.aclose()


async def test_coalesced_tool_runs_once_per_run_across_workers(
    start_redis: Callable[..., RedisProc], start_worker: Callable[..., WorkerProc], harness: Harness
) -> None:
    redis = await asyncio.to_thread(start_redis)
    workers = await _workers(start_worker, 2, redis.url, "tooly", "--concurrency", "6")
    qs = ["same"] * 12 + ["other"] * 4

    def graph() -> Any:
        return parent_graph(
            executor(redis.url, "tooly"),
            make_input=lambda q, i: {"q": q, "messages": []},
            result=lambda final: final["messages"][-1].content,
        )

    # Two runs at once on the same workers, asking the same questions: each run's
    # calls share one execution across both workers; the runs never share.
    async with watch_ttls(redis.url) as ttls:
        (out_a, _), (out_b, _) = await asyncio.gather(
            run_parent(graph(), qs), run_parent(graph(), qs)
        )
    assert out_a == out_b == [f"result:{q}" for q in qs]
    log = await asyncio.to_thread(harness.exec_log.read_text)
    tool_runs = collections.Counter(
        line.split()[1] for line in log.splitlines() if line.startswith("tool ")
    )
    assert tool_runs == {"same": 2, "other": 2}, tool_runs  # once per run, not once overall
    logs = [await asyncio.to_thread(w.text) for w in workers]
    assert all("accepted" in log for log in logs), "both workers ran siblings of the runs"
    # Every key (the runs', their single-flight locks and results) had a TTL while it lived.
    assert any(":sf:" in k for k in ttls.seen), ttls.seen
    assert not ttls.without_ttl, ttls.without_ttl


async def test_acl_user_limited_to_lgb_keys(
    start_redis: Callable[..., RedisProc], start_worker: Callable[..., WorkerProc], harness: Harness
) -> None:
    redis = await asyncio.to_thread(start_redis)
    admin = connect(redis.url)
    try:
        await admin.execute_command("ACL", "SETUSER", "lgb", "on", ">s3cret", *ACL_RULES.split())
        await admin.set("other-app:key", "private")
    finally:
        await admin.aclose()
    url = f"redis://lgb:s3cret@127.0.0.1:{redis.port}/0"
    workers = await _workers(start_worker, 1, url, "sleepy", "--concurrency", "4")
    out, _ = await run_parent(parent_graph(executor(url)), list(range(8)))
    assert out == [2 * i for i in range(8)]
    counts = await atally("ACL user", out, out, harness.exec_log, workers, seconds=0)
    assert counts.executions == 8
    assert "NOPERM" not in await asyncio.to_thread(workers[0].text)
    user = connect(url)
    try:
        with pytest.raises(NoPermissionError):
            await user.get("other-app:key")
        with pytest.raises(NoPermissionError):
            await user.flushall()
        with pytest.raises(NoPermissionError):
            await user.config_get("*")
    finally:
        await user.aclose()


def _certificates(d: Path) -> Path:
    """A throwaway CA and a server certificate for 127.0.0.1 (openssl CLI)."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=lgb-test-ca",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    )
    return d


async def test_tls_rediss_url(
    start_redis: Callable[..., RedisProc],
    start_worker: Callable[..., WorkerProc],
    harness: Harness,
    tmp_path: Path,
) -> None:
    # Debian's redis-server 7.0 is built with TLS (`--tls-port` works).
    certs = await asyncio.to_thread(_certificates, tmp_path)
    tls_port = free_port()
    await asyncio.to_thread(
        start_redis,
        extra=[
            "--tls-port",
            str(tls_port),
            "--tls-cert-file",
            str(certs / "server.pem"),
            "--tls-key-file",
            str(certs / "server.key"),
            "--tls-ca-cert-file",
            str(certs / "ca.pem"),
            "--tls-auth-clients",
            "no",
        ],
    )
    url = f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={certs / 'ca.pem'}"
    workers = await _workers(start_worker, 1, url, "sleepy", "--concurrency", "4")
    out, _ = await run_parent(parent_graph(executor(url)), list(range(6)))
    assert out == [2 * i for i in range(6)]
    assert sum((await asyncio.to_thread(executions, harness.exec_log)).values()) == 6
    assert workers[0].alive()
    # Plain TCP to the TLS port does not work: the traffic above was encrypted.
    plain = connect(f"redis://127.0.0.1:{tls_port}/0", socket_timeout=1.0)
    try:
        with pytest.raises(RedisConnectionError):
            await plain.ping()
    finally:
        await plain.aclose()
