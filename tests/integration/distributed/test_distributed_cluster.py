"""What workers share: the cluster-wide in-flight cap, coalesced tools, ACL users, TLS.

The cap is measured at a small HTTP server standing in for the inference
server: it counts requests in flight and records the peak.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
)

pytestmark = pytest.mark.anyio


class _CountingServer:
    """An OpenAI-compatible chat endpoint that answers after `delay_s` and counts concurrency."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.port = free_port()
        self.inflight = self.peak = self.total = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        self._ready.wait(5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def serve() -> None:
            await asyncio.start_server(self._handle, "127.0.0.1", self.port)
            self._ready.set()

        self._loop.run_until_complete(serve())
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                self.inflight += 1
                self.total += 1
                self.peak = max(self.peak, self.inflight)
                try:
                    await asyncio.sleep(self.delay_s)
                finally:
                    self.inflight -= 1
                body = json.dumps(
                    {
                        "id": f"chatcmpl-{self.total}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "test-model",
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": "ok"},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                    }
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


async def _workers(
    start_worker: Callable[..., WorkerProc], n: int, *args: Any, **env: str
) -> list[WorkerProc]:
    workers = [await asyncio.to_thread(start_worker, *args, wait=False, **env) for _ in range(n)]
    await asyncio.gather(*(asyncio.to_thread(w.wait_ready) for w in workers))
    return workers


async def test_cluster_inflight_cap_holds_across_workers(
    start_redis: Callable[..., RedisProc], start_worker: Callable[..., WorkerProc], harness: Harness
) -> None:
    server = await asyncio.to_thread(_CountingServer, 0.1)
    try:
        redis = await asyncio.to_thread(start_redis)
        await _workers(
            start_worker,
            2,
            redis.url,
            "asker",
            "--concurrency",
            "8",
            "--cluster-inflight",
            "3",
            LGB_TEST_LLM_URL=server.url,
        )
        graph = parent_graph(
            executor(redis.url, "asker"),
            make_input=lambda x, i: {"prompt": f"question {i}"},
            result=lambda final: final["answer"],
        )
        out, _ = await run_parent(graph, list(range(24)))
        assert out == ["ok"] * 24
        assert server.total == 24
        # 16 siblings at once would put up to 16 requests on the wire; the cap is 3.
        assert server.peak == 3, server.peak
        client = connect(redis.url)
        try:
            leases = [k async for k in client.scan_iter(match="{lgb:sem:*")]
            for key in leases:
                assert await client.zcard(key) == 0, key  # every lease released
        finally:
            await client.aclose()
    finally:
        await asyncio.to_thread(server.close)


async def test_coalesced_tool_runs_once_across_workers(
    start_redis: Callable[..., RedisProc], start_worker: Callable[..., WorkerProc], harness: Harness
) -> None:
    redis = await asyncio.to_thread(start_redis)
    workers = await _workers(start_worker, 2, redis.url, "tooly", "--concurrency", "6")
    qs = ["same"] * 12 + ["other"] * 4
    graph = parent_graph(
        executor(redis.url, "tooly"),
        make_input=lambda q, i: {"q": q, "messages": []},
        result=lambda final: final["messages"][-1].content,
    )
    out, _ = await run_parent(graph, qs)
    assert out == [f"result:{q}" for q in qs]
    log = await asyncio.to_thread(harness.exec_log.read_text)
    tool_runs = [line.split() for line in log.splitlines() if line.startswith("tool ")]
    assert sorted(q for _, q, _ in tool_runs) == ["other", "same"], tool_runs
    logs = [await asyncio.to_thread(w.text) for w in workers]
    assert all("accepted" in log for log in logs), "both workers ran siblings of the run"


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
