"""A real NVIDIA Dynamo stack on loopback: frontend + KV router + mocker workers, no GPU.

- `ensure_venv()`: `ai-dynamo==1.6.1` in a venv of its own, cached across runs
  (`$LGB_DYNAMO_VENV`, else `~/.cache/langgraph-batch/ai-dynamo-1.6.1`), so the
  project's venv stays lean. pip installs `ai-dynamo` without its
  dependencies, then every dependency but `aisimulate`: that one is published
  only on pypi.nvidia.com (a placeholder on PyPI that fails to build), and
  only Dynamo's planner imports it; the frontend and the mocker do not.
  Measured on a 2-core machine: 60-80 s, ~690 MB (the runtime wheel is 75 MB;
  `transformers` and `kubernetes` are the rest). A failed install raises
  `DynamoInstallError` with pip's last lines.
- `ensure_model(venv)`: the tiny tokenizer and config of `benchmarks/vllm_cpu/model.py`
  (the mocker needs a tokenizer and a config, never weights; nothing is downloaded).
- `DynamoStack`: `python -m dynamo.mocker` workers and `python -m
  dynamo.frontend --router-mode kv`, with file discovery (`DYN_FILE_KV` in a
  temporary directory), the TCP request plane and ZMQ KV events; each worker
  serves Prometheus metrics on its own system port. It waits until the
  frontend has every worker, and kills every process group on exit.

```bash
python -m benchmarks.dynamo_stack    # install (cached), start, one request, stop
```
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from langgraph_batch.backends import parse_prometheus

__all__ = (
    "DYNAMO_VERSION",
    "DynamoInstallError",
    "DynamoStack",
    "default_venv",
    "dynamo_unavailable",
    "ensure_model",
    "ensure_venv",
)

DYNAMO_VERSION = "1.6.1"
MODEL = "tiny"

# ai-dynamo 1.6.1's Requires-Dist without `aisimulate` (pypi.nvidia.com only; planner-only).
_DEPS = (
    f"ai-dynamo-runtime=={DYNAMO_VERSION}",
    "aiohttp<4.0,>=3.14.3",
    "certifi>=2026.10.19",
    "kubernetes<33.0.0,>=32.0.1",
    "msgspec>=0.19.0",
    "prometheus-client<1.0,>=0.23.1",
    "pyzmq>=26.0.0",
    "redis<9.0.0,>=6.2.0",
    "tqdm>=4.0.0",
    "transformers>=4.56.0",
    "typing-extensions>=4.10.0",
    "zstandard<1.0,>=0.23.0",
)
_HERE = Path(__file__).resolve().parent
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ADDED = re.compile(r"Adding worker WorkerWithDpRank \{ worker_id: (\d+)")


class DynamoInstallError(RuntimeError):
    """ai-dynamo could not be installed or imported; `log` holds pip's output."""

    def __init__(self, message: str, *, log: str = "") -> None:
        tail = "\n".join(log.strip().splitlines()[-15:])
        super().__init__(f"{message}\n{tail}" if tail else message)
        self.log = log


def default_venv() -> Path:
    """`$LGB_DYNAMO_VENV`, else `~/.cache/langgraph-batch/ai-dynamo-<version>`."""
    env = os.environ.get("LGB_DYNAMO_VENV")
    if env:
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "langgraph-batch" / f"ai-dynamo-{DYNAMO_VERSION}"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _run(args: Sequence[str], what: str, timeout: float) -> str:
    print(f"[dynamo] {what}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DynamoInstallError(f"{what}: {exc}") from None
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise DynamoInstallError(f"{what} failed (exit {proc.returncode})", log=out)
    return out


def ensure_venv(venv: Path | None = None) -> Path:
    """The venv with ai-dynamo installed and importable (installed here when missing).

    Raises:
        DynamoInstallError: pip failed, or `dynamo.frontend` does not import afterwards.
    """
    venv = venv or default_venv()
    marker = venv / f".lgb-ai-dynamo-{DYNAMO_VERSION}"
    if marker.exists():
        return venv
    with _locked(venv):
        if not marker.exists():
            _install(venv, marker)
    return venv


@contextlib.contextmanager
def _locked(venv: Path) -> Iterator[None]:
    """One installer at a time (pytest-xdist workers, two benchmarks): the others wait."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f".{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _install(venv: Path, marker: Path) -> None:
    py = str(_python(venv))
    if not _python(venv).exists():
        _run([sys.executable, "-m", "venv", str(venv)], f"creating {venv}", 300)
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run(
        [*pip, "--no-deps", f"ai-dynamo=={DYNAMO_VERSION}"],
        f"pip install ai-dynamo=={DYNAMO_VERSION} into {venv} (~60-80 s, ~690 MB; cached after)",
        900,
    )
    _run([*pip, *_DEPS], "pip install its dependencies (all but aisimulate)", 1800)
    check = "import dynamo.frontend.main, dynamo.mocker.main; print('lgb-ok')"
    out = _run([py, "-c", check], "checking that dynamo imports", 300)
    if "lgb-ok" not in out:
        raise DynamoInstallError("dynamo does not import", log=out)
    marker.write_text(DYNAMO_VERSION + "\n")


def ensure_model(venv: Path) -> Path:
    """The tiny model directory (tokenizer + config) inside the venv, made once."""
    path = venv / "lgb-models" / MODEL
    source = (_HERE / "vllm_cpu" / "model.py").read_bytes()
    stamp = path / ".source"
    if stamp.exists() and stamp.read_bytes() == source:
        return path
    with _locked(venv):
        if stamp.exists() and stamp.read_bytes() == source:
            return path
        if path.exists():
            shutil.rmtree(path)
        make = [str(_python(venv)), str(_HERE / "vllm_cpu" / "model.py"), str(path)]
        _run(make, "tiny model", 300)
        stamp.write_bytes(source)
    return path


def dynamo_unavailable() -> str | None:
    """Why a Dynamo stack cannot run here (None: it can; installs it when missing)."""
    if sys.platform != "linux":
        return f"ai-dynamo ships Linux wheels only (this is {sys.platform})"
    try:
        ensure_model(ensure_venv())
    except DynamoInstallError as exc:
        return f"ai-dynamo=={DYNAMO_VERSION} could not be installed: {exc}"
    return None


def _free_port(below: int = 65536) -> int:
    """A free loopback port (below `below`: Dynamo reads `DYN_SYSTEM_PORT` as an i16)."""
    rng = random.Random()
    for _ in range(200):
        port = 0 if below > 65535 else rng.randrange(20000, below)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise RuntimeError(f"no free loopback port below {below}")


class DynamoStack:
    """Frontend (KV router) and `workers` mocker workers on loopback.

    Example:
        ```python
        with DynamoStack(workers=2, affinity_ttl_s=600) as stack:
            url = stack.url                       # http://127.0.0.1:<port>
            stack.worker_requests()               # [requests served, per worker]
        ```

    Args:
        workers: mocker processes (one worker each).
        speedup: the mocker's `--speedup-ratio` (its simulated engine runs this much faster).
        affinity_ttl_s: the frontend's `--router-session-affinity-ttl-secs`
            (None: no session affinity, the router's default).
        gpu_blocks: each mocker's `--num-gpu-blocks-override` (None: its default, 16,384).
        block_size: the mocker's and router's KV block size, tokens.
        startup_timeout: seconds to wait for the frontend to see every worker.
    """

    def __init__(
        self,
        *,
        workers: int = 2,
        speedup: float = 20.0,
        affinity_ttl_s: int | None = 600,
        gpu_blocks: int | None = None,
        block_size: int = 16,
        startup_timeout: float = 90.0,
        extra_frontend_args: Sequence[str] = (),
    ) -> None:
        self.workers = workers
        self.speedup = speedup
        self.affinity_ttl_s = affinity_ttl_s
        self.gpu_blocks = gpu_blocks
        self.block_size = block_size
        self.startup_timeout = startup_timeout
        self.extra_frontend_args = tuple(extra_frontend_args)
        self.port = 0
        self.system_ports: list[int] = []
        self.model = MODEL
        self._procs: list[subprocess.Popen[bytes]] = []
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.ready_s = 0.0

    @property
    def url(self) -> str:
        """The frontend's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self, args: Sequence[str], log: Path, env: dict[str, str]) -> None:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                list(args), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self._procs.append(proc)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of every process's log (for a failure message)."""
        if self._dir is None:
            return ""
        parts = []
        for log in sorted(Path(self._dir.name).glob("*.log")):
            text = log.read_text(errors="replace").strip().splitlines()[-lines:]
            parts.append(f"== {log.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def __enter__(self) -> DynamoStack:
        venv = ensure_venv()
        model = ensure_model(venv)
        py = str(_python(venv))
        self._dir = tempfile.TemporaryDirectory(prefix="lgb-dynamo-")
        root = Path(self._dir.name)
        env = {
            **os.environ,
            "DYN_FILE_KV": str(root / "kv"),
            "DYN_LOG": "warn",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        common = ["--discovery-backend", "file", "--request-plane", "tcp"]
        try:
            for i in range(self.workers):
                port = _free_port(below=32768)
                self.system_ports.append(port)
                args = [py, "-m", "dynamo.mocker", "--model-path", str(model)]
                args += ["--model-name", MODEL, "--speedup-ratio", str(self.speedup)]
                args += ["--block-size", str(self.block_size), *common]
                if self.gpu_blocks is not None:
                    args += ["--num-gpu-blocks-override", str(self.gpu_blocks)]
                worker_env = {**env, "DYN_SYSTEM_PORT": str(port)}
                self._spawn(args, root / f"mocker{i}.log", worker_env)
            self.port = _free_port()
            args = [py, "-m", "dynamo.frontend", "--http-host", "127.0.0.1"]
            args += ["--http-port", str(self.port), "--router-mode", "kv", *common]
            args += ["--kv-cache-block-size", str(self.block_size)]
            if self.affinity_ttl_s is not None:
                args += ["--router-session-affinity-ttl-secs", str(self.affinity_ttl_s)]
            args += list(self.extra_frontend_args)
            # info: the frontend logs its worker set ("members=N"), read by `_wait_ready`.
            self._spawn(args, root / "frontend.log", {**env, "DYN_LOG": "info"})
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def _wait_ready(self) -> None:
        t0 = time.monotonic()
        deadline = t0 + self.startup_timeout
        log = Path(self._dir.name) / "frontend.log"  # type: ignore[union-attr]
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                dead = [p.args for p in self._procs if p.poll() is not None]
                if dead:
                    raise RuntimeError(f"a Dynamo process exited: {dead}\n{self.log_tail()}")
                if self._ready(client, log):
                    self.ready_s = time.monotonic() - t0
                    return
                time.sleep(0.25)
        raise TimeoutError(
            f"Dynamo did not see {self.workers} workers in {self.startup_timeout:.0f} s\n"
            + self.log_tail()
        )

    def _ready(self, client: httpx.Client, log: Path) -> bool:
        """Every worker serves `generate` (`/health`), and the KV router has added each.

        (The frontend's "members=N" line is no signal: it may commit the model with
        the first worker and add the second one later.)
        """
        try:
            if MODEL not in client.get(f"{self.url}/v1/models").text:
                return False
            health = client.get(f"{self.url}/health").json()
        except (httpx.HTTPError, ValueError):
            return False
        instances = {
            i.get("instance_id")
            for i in health.get("instances", [])
            if isinstance(i, dict) and i.get("endpoint") == "generate"
        }
        if len(instances) < self.workers:
            return False
        added = set(_ADDED.findall(_ANSI.sub("", log.read_text(errors="replace"))))
        return len(added) >= self.workers

    def worker_requests(self) -> list[int]:
        """Generate requests each worker served since it started (its own metrics)."""
        out = []
        with httpx.Client(timeout=5.0) as client:
            for port in self.system_ports:
                text = client.get(f"http://127.0.0.1:{port}/metrics").text
                total = 0.0
                for line in text.splitlines():
                    if line.startswith("dynamo_component_requests_total{") and (
                        'dynamo_endpoint="generate"' in line
                    ):
                        total += float(line.rsplit(" ", 1)[1])
                out.append(int(total))
        return out

    def frontend_tokens(self) -> dict[str, int]:
        """The frontend's prompt and cached-prompt token totals (the workers' reports)."""
        with httpx.Client(timeout=5.0) as client:
            text = client.get(f"{self.url}/metrics").text
        s = parse_prometheus(
            text,
            names=frozenset(
                {"dynamo_frontend_input_sequence_tokens_sum", "dynamo_frontend_cached_tokens_sum"}
            ),
        )
        prompt = int(s.sum("dynamo_frontend_input_sequence_tokens_sum") or 0)
        cached = int(s.sum("dynamo_frontend_cached_tokens_sum") or 0)
        return {"prompt_tokens": prompt, "cached_tokens": cached, "prefill": prompt - cached}

    def close(self) -> None:
        """Stop every process (SIGTERM to its group, SIGKILL after 3 s) and clean up."""
        for proc in self._procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 3.0
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5.0)
        self._procs.clear()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __exit__(self, *exc: Any) -> None:
        self.close()


def main() -> None:
    """Install (cached), start 2 workers, send one request, print what happened."""
    t0 = time.monotonic()
    venv = ensure_venv()
    print(f"ai-dynamo {DYNAMO_VERSION} ready in {venv} ({time.monotonic() - t0:.0f} s)")
    with DynamoStack(workers=2) as stack:
        body = {"model": stack.model, "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(f"{stack.url}/v1/chat/completions", json={**body, "max_tokens": 8})
        print(f"up in {stack.ready_s:.1f} s; {r.status_code} {r.text[:200]}")
        print("requests per worker:", stack.worker_requests(), stack.frontend_tokens())


if __name__ == "__main__":
    main()
