"""`langgraph-batch demo` end to end: against its own emulator, a server reached by URL,
a dead URL, and a baseline that fails."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from langgraph_batch.bench.demo_server import EMULATOR_HEADER, EMULATOR_ID

ROOT = Path(__file__).resolve().parents[2]


def run_demo(*args: str, timeout: float = 110) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "langgraph_batch.cli", "demo", *args]
    env = dict(os.environ, LANGSMITH_TRACING="false")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.timeout(120)
def test_demo_prints_summary_stats_and_side_by_side() -> None:
    proc = run_demo("--n", "10", "--time-scale", "20")
    out = proc.stdout
    assert proc.returncode == 0, (out[-3000:], proc.stderr[-3000:])
    assert "EMULATED vLLM (h100-llama3-8b profile" in out
    assert "not a real GPU" in out
    assert "Results: 10/10 siblings answered, 0 failed." in out
    assert "Scheduler stats:" in out
    assert "LLM requests: 20" in out
    # 10 siblings asking 2 distinct queries: 10 tool calls requested, 2 executed.
    assert "tool calls: 10 requested, 2 executed" in out
    assert "prefix cache:" in out
    assert "Side by side" in out
    assert "tool calls requested/executed" in out
    assert "speed-up:" in out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scheme", ["vllm", "http", "sglang"])
def test_demo_against_an_emulator_reached_by_url_says_emulated(
    start_emulator: Callable[..., str], scheme: str
) -> None:
    flavor = "sglang" if scheme == "sglang" else "vllm"
    url = start_emulator(
        flavor=flavor, time_scale=50.0, turns=2, output_tokens=200, model="emulated-llama-3-8b"
    )
    backend_url = url.replace("http://", f"{scheme}://")
    proc = run_demo("--n", "4", "--backend-url", backend_url, "--no-progress")
    out = proc.stdout
    assert proc.returncode == 0, (out[-3000:], proc.stderr[-3000:])
    engine = "SGLang" if flavor == "sglang" else "vLLM"
    assert f"EMULATED {engine} (h100-llama3-8b profile, time scale 50) at {backend_url}" in out
    assert "Real inference server" not in out
    assert "Results: 4/4 siblings answered, 0 failed." in out
    assert "done: 4/4 answered" in out
    assert "speed-up:" in out
    assert "Traceback" not in proc.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scheme", ["vllm", "http"])
def test_demo_against_a_dead_url_fails_clearly(scheme: str) -> None:
    url = f"{scheme}://127.0.0.1:{free_port()}"
    proc = run_demo("--n", "2", "--backend-url", url, timeout=50)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"langgraph-batch demo: cannot use the server at {url}: ")
    assert "BackendConnectionError" in proc.stderr
    assert "speed-up" not in proc.stdout


@pytest.mark.timeout(30)
def test_demo_with_a_url_it_cannot_parse_fails_clearly() -> None:
    proc = run_demo("--backend-url", "ftp://127.0.0.1:1", timeout=25)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "unsupported backend URL 'ftp://127.0.0.1:1'" in proc.stderr


class _Proxy(BaseHTTPRequestHandler):
    """Forwards to the emulator; refuses the baseline's (the OpenAI SDK's) chat calls."""

    upstream: tuple[str, int] = ("127.0.0.1", 0)

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        agent = self.headers.get("User-Agent", "")
        if self.path.startswith("/v1/chat/completions") and "OpenAI/Python" in agent:
            payload = b'{"error": {"message": "baseline refused by the test proxy"}}'
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in {"host"}}
        conn.request(self.command, self.path, body=body or None, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        self.send_response(resp.status)
        for key, value in resp.getheaders():
            if key.lower() not in {"transfer-encoding", "content-length", "connection"}:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        conn.close()

    do_GET = do_POST = _forward


@pytest.fixture
def baseline_refusing_proxy(start_emulator: Callable[..., str]) -> Iterator[str]:
    url = start_emulator(time_scale=50.0, turns=2, output_tokens=200, model="emulated-llama-3-8b")
    parts = urlsplit(url)
    handler = type("Proxy", (_Proxy,), {"upstream": (parts.hostname, parts.port)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"vllm://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(120)
def test_a_failing_baseline_is_reported_not_compared(baseline_refusing_proxy: str) -> None:
    proc = run_demo("--n", "4", "--backend-url", baseline_refusing_proxy, "--no-progress")
    out = proc.stdout
    assert proc.returncode == 3, (out[-3000:], proc.stderr[-3000:])
    assert "Results: 4/4 siblings answered, 0 failed." in out  # langgraph-batch's run is fine
    assert "BASELINE FAILED: 0/4 answered" in out
    assert "baseline refused by the test proxy" in out
    assert "No comparison is reported" in out
    assert "speed-up" not in out
    assert "Side by side" not in out
    assert "Traceback" not in proc.stderr


async def test_the_emulator_identifies_itself_in_version(emulator_url: str) -> None:
    import httpx

    from langgraph_batch.emulator import server

    assert (server.EMULATOR_HEADER, server.EMULATOR_ID) == (EMULATOR_HEADER, EMULATOR_ID)
    async with httpx.AsyncClient() as client:
        resp = await client.get(f"{emulator_url}/version")
    assert resp.status_code == 200
    assert resp.headers[EMULATOR_HEADER] == EMULATOR_ID
    assert resp.json() == {"version": "0.33.0", "emulator": EMULATOR_ID}
