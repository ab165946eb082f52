"""Real routers in front of the emulator: the router process and the router contenders.

`RouterProcess` runs `vllm-router` or `sglang-router` (the pip packages' binaries)
on a loopback port in front of emulator replicas; `benchmarks/routers.py` and
`tests/integration/test_routers.py` use it for W4 behind a router.

**Router contenders** (`<base>-router`, `<base>-router-ps`, with `<base>` any agent
contender: `naive`, `naive-bounded-<k>`, `langgraph-batch`): the same contender
process with every model call sent to `vllm-router` in front of the workload's
replicas, which the harness starts for that contender only and stops after it.
Each agent's requests carry its program identity the way a user would set it
against stock vLLM: an `X-Session-ID` header per agent (`naive`:
`ChatOpenAI.bind(extra_headers=...)` with an id per task; `langgraph-batch`: its
default session key). The body's `vllm_xargs.agentic_context` is not sent: stock
vLLM answers HTTP 400 to an object in `vllm_xargs`, and the router forwards it.

- `-router`: `--policy consistent_hash` (the router routes; nothing held back).
- `-router-ps`: the same plus `--enable-program-scheduling` with
  `program_scheduling_enable_key: "auto"` (what makes the router read
  `X-Session-ID` as a program id) and the settings its docs
  (`docs/program_scheduling.md`) recommend for a vLLM backend: the rank's KV
  capacity in tokens (`token_capacity_per_dp_rank`, read from the replica's
  `vllm:cache_config_info`), `global_queue: true`, `resume_order: "mru"`, and
  prefill/decode coefficients calibrated on the backend (here fitted to the
  emulator's own cost model, `calibration`). Every time-valued setting
  (coefficients, polling interval, TTL cap, timeouts) is divided by the time
  scale, as tool latencies are: the router runs on wall time, the emulator
  `time_scale` times faster than the modelled GPU.

What the router did is in each entry's `router` (`router_report`): its
program-scheduling transitions (admissions, pauses by reason, forced resumes),
the time requests were held in its pool, and the events in its log.
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

from langgraph_batch._process import terminate
from langgraph_batch.backends import parse_prometheus
from langgraph_batch.bench.toolservice import free_port

ROUTERS: dict[str, tuple[str, ...]] = {
    "vllm-router": ("consistent_hash", "cache_aware"),
    "sglang-router": ("manual", "cache_aware"),
}
"""The routers and the policies `benchmarks/routers.py` measures (`manual`,
`consistent_hash`: key-based)."""

# Replicas that die are noticed within a second or two (the routers' defaults check
# health every 60 s and only trip a circuit breaker after 10 failures).
FAST_HEALTH = (
    "--health-check-interval-secs",
    "1",
    "--health-failure-threshold",
    "1",
    "--health-check-timeout-secs",
    "1",
)

ROUTER_MODES = ("router-ps", "router")
"""Contender-name suffixes: through vllm-router with program scheduling, and without."""
ROUTER_KIND = "vllm-router"
ROUTER_POLICY = "consistent_hash"
SESSION_HEADER = "X-Session-ID"
"""The header a plain LangGraph agent sets per agent (vllm-router's generic schema)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EVENT = re.compile(r'\bevent="?([A-Za-z_]+)"?')
_REASON = re.compile(r'\breason="?([A-Za-z_]+)"?')


@functools.cache
def router_unavailable(kind: str) -> str | None:
    """Why the `kind` router cannot run here (None: it installs and starts)."""
    if kind == "vllm-router":
        exe = Path(sys.executable).with_name("vllm-router")
        if not exe.exists() and shutil.which("vllm-router") is None:
            return "vllm-router is not installed (pip install vllm-router: the `test` extra)"
        cmd = [str(exe) if exe.exists() else "vllm-router", "--help"]
    elif kind == "sglang-router":
        if importlib.util.find_spec("sglang_router") is None:
            return "sglang-router is not installed (pip install sglang-router: the `test` extra)"
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--help"]
    else:
        raise ValueError(f"unknown router {kind!r}; use one of {sorted(ROUTERS)}")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{kind} is installed but cannot run here: {exc}"
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-300:]
        return f"{kind} is installed but cannot run here (exit {done.returncode}): {tail}"
    return None


def router_command(
    kind: str, policy: str, port: int, workers: Sequence[str], *, extra: Sequence[str] = ()
) -> list[str]:
    """The command line that serves `kind` with `policy` on loopback `port`."""
    prom = ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers]
    common += ["--policy", policy, *prom, *extra]
    if kind == "vllm-router":
        exe = Path(sys.executable).with_name("vllm-router")
        return [str(exe) if exe.exists() else "vllm-router", *common]
    if kind == "sglang-router":
        return [sys.executable, "-m", "sglang_router.launch_router", *common]
    raise ValueError(f"unknown router {kind!r}; use one of {sorted(ROUTERS)}")


class RouterProcess:
    """A router in front of `workers`, in its own process, on a free loopback port.

    `events` counts the structured events of its log as they stream by
    (`program_admit`, `program_pause:<reason>`, ...).

    Example:
        ```python
        with RouterProcess("vllm-router", "consistent_hash", urls) as router:
            llm = BatchedChatModel(model=MODEL, base_url=f"vllm://{router.address}")
        ```
    """

    def __init__(
        self,
        kind: str,
        policy: str,
        workers: Sequence[str],
        *,
        extra: Sequence[str] = FAST_HEALTH,
        startup_timeout: float = 60.0,
    ) -> None:
        self.kind = kind
        self.policy = policy
        self.workers = list(workers)
        self.port = free_port()
        self.command = router_command(kind, policy, self.port, self.workers, extra=extra)
        self.prometheus_port = int(self.command[self.command.index("--prometheus-port") + 1])
        self.startup_timeout = startup_timeout
        self.events: collections.Counter[str] = collections.Counter()
        self.ps_config: dict[str, Any] | None = None
        """The program-scheduling config it was started with (None: none)."""
        self._proc: subprocess.Popen[str] | None = None
        self._output: list[str] = []

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        """`127.0.0.1:PORT` (for `vllm://` and `sglang://` URLs)."""
        return f"127.0.0.1:{self.port}"

    @property
    def output(self) -> str:
        """What the router printed (its last 400 lines)."""
        return "".join(self._output[-400:])

    def start(self) -> None:
        """Start the router and wait until it lists every worker and serves `/v1/models`.

        Raises:
            RuntimeError: it exited or was not ready in time (with its output).
        """
        self._proc = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        threading.Thread(target=self._pump, name=f"{self.kind}-output", daemon=True).start()
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited at start:\n{self.output[-4000:]}")
            if self._ready():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.kind} was not ready in time:\n{self.output[-4000:]}")

    def _pump(self) -> None:
        proc = self._proc
        if proc is None or proc.stdout is None:
            return
        for line in proc.stdout:
            self._output.append(line)
            if len(self._output) > 4000:
                del self._output[:2000]
            if "event" in line:
                self._count(_ANSI.sub("", line))

    def _count(self, line: str) -> None:
        event = _EVENT.search(line)
        if event is None:
            return
        name = event.group(1)
        reason = _REASON.search(line) if name == "program_pause" else None
        self.events[f"{name}:{reason.group(1)}" if reason else name] += 1

    def _ready(self) -> bool:
        try:
            workers = httpx.get(self.url + "/workers", timeout=2.0).json().get("workers") or []
            models = httpx.get(self.url + "/v1/models", timeout=2.0)
        except (httpx.HTTPError, ValueError, AttributeError):
            return False
        healthy = [w for w in workers if w.get("is_healthy", True)]
        return len(healthy) >= len(self.workers) and models.status_code == 200

    def stop(self) -> None:
        """Terminate the router (kill after 5 s). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        terminate(proc)

    def __enter__(self) -> RouterProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------ router contenders


def split_router(name: str) -> tuple[str, str | None]:
    """(base contender, router mode) of a contender name; mode None: no router.

    Example:
        ```python
        assert split_router("naive-bounded-24-router-ps") == ("naive-bounded-24", "router-ps")
        assert split_router("naive") == ("naive", None)
        ```
    """
    for mode in ROUTER_MODES:
        suffix = "-" + mode
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)], mode
    return name, None


def _lstsq(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Least-squares coefficients of `rows @ x = ys` (normal equations, a few columns)."""
    k = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(k)]
    for i in range(k):
        for j in range(i + 1, k):
            f = a[j][i] / a[i][i]
            for m in range(i, k):
                a[j][m] -= f * a[i][m]
            b[j] -= f * b[i]
    x = [0.0] * k
    for i in reversed(range(k)):
        x[i] = (b[i] - sum(a[i][m] * x[m] for m in range(i + 1, k))) / a[i][i]
    return x


@functools.cache
def calibration(profile: str, time_scale: float = 1.0) -> dict[str, Any]:
    """The router's prefill and decode coefficients, fitted to the emulator's cost model.

    What the router's docs ask an operator to measure on the deployed backend
    (AgentInfer's calibration): a cold prefill of `x` thousand tokens costs
    `a + b x + c x^2` seconds (chunks of 8,192 tokens, 1k-64k tokens: within 1%);
    a decode step of `B` sequences holding `C` tokens in all costs
    `fixed + per_request B + per_token C` (least relative error over B = 1-64 and
    1k-32k tokens each; the engine's KV read slows past B = 16, which this linear
    surface misses by up to ~50%). Divided by `time_scale` (the router's clock is
    the wall clock).
    """
    from langgraph_batch.emulator.costs import get_profile

    p = get_profile(profile)

    def cold_prefill(n: int, chunk: int = 8192) -> float:
        done, t = 0, 0.0
        while done < n:
            c = min(chunk, n - done)
            t += p.prefill_time(c, cached=done)
            done += c
        return t

    xs = [n / 1000 for n in range(1000, 64_001, 1000)]
    pre = _lstsq([[1.0, x, x * x] for x in xs], [cold_prefill(round(x * 1000)) for x in xs])
    rows, ones = [], []
    for batch in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64):
        for ctx in (1000, 2000, 4000, 8000, 16_000, 32_000):
            y = p.decode_step_time(batch, ctx)
            rows.append([1 / y, batch / y, batch * ctx / y])
            ones.append(1.0)
    dec = _lstsq(rows, ones)
    s = 1.0 / time_scale
    return {
        "prefill_cost_model": {
            "intercept_seconds": max(0.0, pre[0]) * s,
            "linear_seconds_per_1k_tokens": max(0.0, pre[1]) * s,
            "quadratic_seconds_per_1k_tokens_squared": max(0.0, pre[2]) * s,
            "decode_throughput_alpha": 0.15,  # the router's default: not fitted
        },
        "decode_throughput_model": {
            "fixed_step_seconds": max(1e-6, dec[0]) * s,
            "batch_step_seconds_per_request": max(0.0, dec[1]) * s,
            "context_step_seconds_per_token": max(0.0, dec[2]) * s,
        },
    }


def kv_capacity(url: str) -> int | None:
    """The server's KV cache in tokens, from `vllm:cache_config_info` (None: not found)."""
    try:
        text = httpx.get(url.rstrip("/") + "/metrics", timeout=10.0).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            try:
                return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
            except (KeyError, ValueError):
                return None
    return None


def program_scheduling_config(
    *, kv_tokens: int | None, profile: str, time_scale: float
) -> dict[str, Any]:
    """`--program-scheduling-config-json` for one vLLM rank, as the router's docs recommend."""
    s = 1.0 / time_scale
    config: dict[str, Any] = {
        "program_scheduling_enable_key": "auto",
        "global_queue": True,
        "resume_order": "mru",
        # The router's defaults, in seconds of the modelled GPU.
        "metrics_interval_seconds": 1.0 * s,
        "max_acting_ttl_seconds": 10.0 * s,
        "queue_timeout_seconds": 600.0 * s,
        "force_resume_timeout_seconds": 300.0 * s,
        "paused_retention_ttl_seconds": 1800.0 * s,
        "shared_prefix_freshness_warmup_seconds": 100.0 * s,
        **calibration(profile, time_scale),
    }
    if kv_tokens:
        config["token_capacity_per_dp_rank"] = int(kv_tokens)
    return config


def start_router(
    mode: str, urls: Sequence[str], *, profile: str, time_scale: float
) -> RouterProcess:
    """vllm-router in front of `urls` for one router contender (`mode`: `ROUTER_MODES`).

    Raises:
        RuntimeError: the router is not installed, cannot run, or did not start.
    """
    reason = router_unavailable(ROUTER_KIND)
    if reason is not None:
        raise RuntimeError(reason)
    extra: list[str] = list(FAST_HEALTH)
    config = None
    if mode == "router-ps":
        config = program_scheduling_config(
            kv_tokens=kv_capacity(urls[0]), profile=profile, time_scale=time_scale
        )
        extra += ["--enable-program-scheduling", "--program-scheduling-config-json"]
        extra.append(json.dumps(config, separators=(",", ":")))
    router = RouterProcess(ROUTER_KIND, ROUTER_POLICY, urls, extra=extra)
    router.ps_config = config
    router.start()
    return router


def stop_router(router: RouterProcess | None, *, time_scale: float) -> dict[str, Any] | None:
    """`router_report` of a contender's router, then stop it (None: no router)."""
    if router is None:
        return None
    try:
        return router_report(router, time_scale=time_scale)
    finally:
        router.stop()


def point_job_at(job: dict[str, Any], router: RouterProcess) -> None:
    """Send a contender job's model calls through `router` (its counters stay the replicas')."""
    job["model_url"] = router.url
    job["lgb_url"] = f"{job.get('flavor') or 'vllm'}://{router.address}"
    job["session_header"] = SESSION_HEADER


def program_metrics(text: str, *, time_scale: float) -> dict[str, Any]:
    """The router's program-scheduling metrics in a `/metrics` body: transitions by
    reason, and its pool's waits (emulated seconds: wall x `time_scale`)."""
    prom = parse_prometheus(text)
    transitions: dict[str, float] = {}
    for labels, value in prom.get("vllm_router_agent_aware_transitions_total"):
        if "reason" in labels:
            transitions[labels["reason"]] = transitions.get(labels["reason"], 0.0) + value
    wait_sum = prom.sum("vllm_router_agent_aware_queue_wait_seconds_sum") or 0.0
    waits = prom.sum("vllm_router_agent_aware_queue_wait_seconds_count") or 0.0
    out: dict[str, Any] = {"transitions": {k: int(v) for k, v in sorted(transitions.items())}}
    out["pool_waits"] = int(waits)
    out["pool_wait_mean_s"] = round(time_scale * wait_sum / waits, 3) if waits else None
    out["pool_wait_total_s"] = round(time_scale * wait_sum, 2)
    return out


def router_report(router: RouterProcess, *, time_scale: float) -> dict[str, Any]:
    """What the router did during one contender (the contender's warm-up included).

    Transitions and the pool's wait come from its Prometheus metrics (waits in
    emulated seconds: wall x `time_scale`), `log_events` from its log, `programs`
    and `rolling` (its fitted TTL, mean cache hit) from `/scheduling/diagnostics`.
    """
    try:
        version: str | None = metadata.version(router.kind)
    except metadata.PackageNotFoundError:
        version = None
    out: dict[str, Any] = {
        "router": router.kind,
        "version": version,
        "policy": router.policy,
        "program_scheduling": router.ps_config,
        "log_events": dict(sorted(router.events.items())),
    }
    try:
        text = httpx.get(f"http://127.0.0.1:{router.prometheus_port}/metrics", timeout=10.0).text
    except httpx.HTTPError:
        text = ""
    out.update(program_metrics(text, time_scale=time_scale))
    try:
        diag = httpx.get(router.url + "/scheduling/diagnostics", timeout=10.0).json()
    except (httpx.HTTPError, ValueError):
        diag = {}
    ranks = diag.get("ranks") or []
    if ranks:
        rank = ranks[0]
        out["programs"] = len(rank.get("programs") or [])
        rolling = rank.get("rolling") or {}
        keep = ("request_samples", "continuity_window_complete", "avg_cached_prompt_ratio")
        out["rolling"] = {k: rolling.get(k) for k in keep}
        ttl = rolling.get("fitted_acting_ttl_seconds")
        out["rolling"]["fitted_acting_ttl_s"] = None if ttl is None else ttl * time_scale
    return out


def router_markdown(contenders: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Lines for the report: what the router did for each router contender."""
    lines: list[str] = []
    for name, entry in contenders.items():
        info = entry.get("router") if not entry.get("error") else None
        if not info:
            continue
        ps = "program scheduling" if info.get("program_scheduling") else "no program scheduling"
        trans = ", ".join(f"{k} {v}" for k, v in (info.get("transitions") or {}).items())
        wait = info.get("pool_wait_mean_s")
        lines.append(
            f"- {name}: {info['router']} {info.get('version') or ''} `{info['policy']}`, {ps}"
            + (f"; programs {info['programs']}" if "programs" in info else "")
            + (f"; transitions: {trans}" if trans else "")
            + (
                f"; {info['pool_waits']} requests admitted from its pool, mean wait {wait:.2f} s"
                if wait is not None
                else ""
            )
        )
    if lines:
        lines = ["Through vllm-router (its metrics; the warm-up sibling included):", "", *lines, ""]
    return lines
