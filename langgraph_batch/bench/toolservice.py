"""A tiny emulated external tool API, run in its own process.

Every contender's tools are HTTP calls to this service, so they all pay the
same latency and share the same concurrency cap (real search APIs rate-limit).

Endpoints:
- `POST /tools/{name}` body `{"args": {...}}` -> `{"result": "..."}` after the
  configured latency; at most `concurrency` calls execute at once, the rest
  queue (FIFO).
- `GET /stats` -> executions in total and per key, peak concurrency and queue.
- `POST /reset` zeroes the counters.
- `GET /health`.

Run: `python -m langgraph_batch.bench.toolservice --port 8123 --config '{"latency_s": 0.8}'`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from langgraph_batch._process import terminate
from langgraph_batch.bench._paths import child_env


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolServiceConfig:
    """How the emulated tool API behaves (latencies in real, already scaled, seconds)."""

    latency_s: float = 0.8
    """Fixed latency of one call, used when `latency_range_s` and `latency_mix` are None."""
    latency_range_s: tuple[float, float] | None = None
    """If set, each distinct (tool, args) key gets a latency drawn (seeded) from this range."""
    latency_mix: tuple[tuple[float, float, float], ...] | None = None
    """A long-tailed latency: (weight, low, high) components; each distinct key picks a
    component by weight, then a latency uniformly in it (seeded). Wins over the others."""
    concurrency: int = 10
    """At most this many calls execute at once; the rest wait in a FIFO queue."""
    result_words: int = 40
    """Length of each result text in words (the emulator tokenizes roughly by words)."""
    result_tokens_range: tuple[int, int] | None = None
    """If set, each distinct key's result is sized (seeded, log-uniform in the range) in
    emulator tokens instead of `result_words` words."""
    seed: int = 0
    latency_table: dict[str, float] | None = None
    """Per-call latencies by canonical key (a replayed job's, `bench --replay`); wins over
    the others for the keys it lists."""
    result_tokens_table: dict[str, int] | None = None
    """Per-call result sizes in emulator tokens by canonical key (a replayed job's)."""
    tokens_per_word: float = 1.0
    """A live server's tokens per result word (its `/tokenize`; the emulator's: 1): result
    lengths are divided by it, so a result holds the same number of that server's tokens
    as the workload asks for (a tokenizer that splits these words is not sent 3x the text)."""

    def _draw(self, what: str, key: str) -> float:
        """A uniform draw in [0, 1) fixed by the seed, `what` and the call's key."""
        digest = hashlib.sha256(f"{self.seed}:{what}{key}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def latency_for(self, key: str) -> float:
        """Latency of one call with canonical key `key`."""
        if self.latency_table and key in self.latency_table:
            return float(self.latency_table[key])
        if self.latency_mix:
            pick = self._draw("mix:", key) * sum(w for w, _, _ in self.latency_mix)
            lo, hi = self.latency_mix[-1][1:]
            for weight, low, high in self.latency_mix:
                if pick < weight:
                    lo, hi = low, high
                    break
                pick -= weight
            return lo + (hi - lo) * self._draw("mixv:", key)
        if self.latency_range_s is None:
            return self.latency_s
        lo, hi = self.latency_range_s
        return lo + (hi - lo) * self._draw("", key)

    def result_for(self, key: str) -> str:
        """The result text of one call with canonical key `key`."""
        scale = 1.0 / self.tokens_per_word if self.tokens_per_word > 0 else 1.0
        if self.result_tokens_table and key in self.result_tokens_table:
            return result_text_tokens(key, round(int(self.result_tokens_table[key]) * scale))
        if self.result_tokens_range is None:
            return result_text(key, round(self.result_words * scale))
        lo, hi = self.result_tokens_range
        tokens = round(lo * (hi / lo) ** self._draw("size:", key)) if lo > 0 else hi
        return result_text_tokens(key, round(tokens * scale))


_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "theta",
    "kappa",
    "lambda",
    "sigma",
    "omega",
    "vector",
    "matrix",
    "cache",
    "batch",
    "token",
    "prefix",
    "kernel",
    "paper",
    "result",
    "method",
    "dataset",
    "model",
    "latency",
    "throughput",
    "memory",
    "search",
    "finding",
    "evidence",
    "source",
    "summary",
]


def result_text(key: str, words: int) -> str:
    """Deterministic result text for `key`, `words` words long."""
    digest = hashlib.sha256(key.encode()).digest()
    out = [f"result[{key}]:"]
    i = 0
    while len(out) < words:
        out.append(_WORDS[(digest[i % len(digest)] + i) % len(_WORDS)])
        i += 1
    return " ".join(out)


# Words of at most four letters: one emulator token each, with their leading space.
_SHORT = (
    "data",
    "row",
    "file",
    "line",
    "test",
    "pass",
    "fail",
    "log",
    "diff",
    "hunk",
    "node",
    "edge",
    "path",
    "call",
    "type",
    "name",
    "list",
    "item",
    "code",
    "span",
)


def result_text_tokens(key: str, tokens: int) -> str:
    """Deterministic result text for `key`, `tokens` emulator tokens long (at least its head)."""
    from langgraph_batch.emulator.tokenizer import count_tokens

    head = f"result[{key}]:"
    digest = hashlib.sha256(key.encode()).digest()
    n = max(0, tokens - count_tokens(head))
    return head + "".join(
        " " + _SHORT[(digest[i % len(digest)] + i) % len(_SHORT)] for i in range(n)
    )


def canonical_key(name: str, args: dict[str, Any]) -> str:
    """Stable key of one tool call: name plus canonical JSON arguments."""
    return f"{name}:{json.dumps(args, sort_keys=True, separators=(',', ':'))}"


@dataclass(slots=True)
class _State:
    config: ToolServiceConfig
    by_key: Counter[str] = field(default_factory=Counter)
    executions: int = 0
    running: int = 0
    waiting: int = 0
    peak_running: int = 0
    peak_waiting: int = 0
    sem: asyncio.Semaphore | None = None


def build_app(config: ToolServiceConfig) -> Any:
    """The Starlette app of the tool service."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    state = _State(config=config)

    async def call(request: Request) -> JSONResponse:
        if state.sem is None:
            state.sem = asyncio.Semaphore(config.concurrency)
        name = request.path_params["name"]
        body = await request.json()
        args = body.get("args", {}) if isinstance(body, dict) else {}
        key = canonical_key(name, args)
        state.waiting += 1
        state.peak_waiting = max(state.peak_waiting, state.waiting)
        acquired = False
        try:
            async with state.sem:
                acquired = True
                state.waiting -= 1
                state.running += 1
                state.peak_running = max(state.peak_running, state.running)
                state.executions += 1
                state.by_key[key] += 1
                try:
                    await asyncio.sleep(config.latency_for(key))
                finally:
                    state.running -= 1
        finally:
            if not acquired:
                state.waiting -= 1
        return JSONResponse({"result": config.result_for(key)})

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "executions": state.executions,
                "distinct_keys": len(state.by_key),
                "by_key": dict(state.by_key),
                "peak_running": state.peak_running,
                "peak_waiting": state.peak_waiting,
                "config": asdict(config),
            }
        )

    async def reset(request: Request) -> JSONResponse:
        state.by_key.clear()
        state.executions = 0
        state.peak_running = state.running
        state.peak_waiting = state.waiting
        return JSONResponse({"ok": True})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/tools/{name}", call, methods=["POST"]),
            Route("/stats", stats, methods=["GET"]),
            Route("/reset", reset, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ]
    )


def free_port() -> int:
    """An unused loopback TCP port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def tool_service(config: ToolServiceConfig) -> Iterator[str]:
    """Run the tool service in its own process; yields its base URL."""
    port = free_port()
    cfg = asdict(config)
    cmd = [sys.executable, "-m", "langgraph_batch.bench.toolservice", "--port", str(port)]
    cmd += ["--config", json.dumps(cfg)]
    proc = subprocess.Popen(cmd, env=child_env())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tool service exited with code {proc.returncode}")
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("tool service did not become healthy within 30 s")
            time.sleep(0.05)
        yield url
    finally:
        terminate(proc, grace_s=10.0)


def main(argv: list[str] | None = None) -> int:
    """Serve the tool service (`python -m langgraph_batch.bench.toolservice --port P`)."""
    parser = argparse.ArgumentParser(prog="python -m langgraph_batch.bench.toolservice")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--config", default="{}", help="ToolServiceConfig as JSON")
    args = parser.parse_args(argv)
    raw = json.loads(args.config)
    for name in ("latency_range_s", "result_tokens_range"):
        if raw.get(name) is not None:
            raw[name] = tuple(raw[name])
    if raw.get("latency_mix") is not None:
        raw["latency_mix"] = tuple(tuple(c) for c in raw["latency_mix"])
    config = ToolServiceConfig(**raw)
    import uvicorn

    uvicorn.run(
        build_app(config),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        backlog=4096,
        # Longer than any client's keep-alive expiry (httpx: 5 s), so a client
        # never reuses a connection the server is just closing (a ReadError
        # that would fail a sibling for the harness's sake, not the contender's).
        timeout_keep_alive=120,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
