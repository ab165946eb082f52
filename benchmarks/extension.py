"""The research harness on top of `langgraph-batch bench`: what `make bench` adds to the wheel's.

`Research` is the `langgraph_batch.bench.extension.BenchExtension` the
research CLI (`python -m benchmarks.bench`) installs: the `ideal` contender
(the emulator cost model's bound, the KV-valid bound on long-horizon shapes,
`benchmarks/contenders/`), the `batchagent` prior-art contender in its own
virtual environment, router contenders (`<base>-router[-ps]`,
`benchmarks/routers/`), the issues' goals (`benchmarks/goals.py`), each
workload's chart (`benchmarks/report.py`), the checkout's git commit in
`versions`, and results written into `benchmarks/results`.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import _paths
from benchmarks.goals import goals
from benchmarks.routers.process import (
    point_job_at,
    router_markdown,
    split_router,
    start_router,
    stop_router,
)
from langgraph_batch.bench import harness
from langgraph_batch.bench._paths import package_parent
from langgraph_batch.bench.extension import BenchExtension, use
from langgraph_batch.bench.workloads import (
    SINGLE_TURN,
    WORKLOADS,
    Workload,
    bounded_concurrency,
    offload_tokens,
)

__all__ = ("BATCHAGENT_SPEC", "ROUTER_BASES", "Research", "research", "versions")

BATCHAGENT_SPEC = "batch-agent==0.2.0"
BATCHAGENT_MODULE = "benchmarks.contenders.batchagent_runner"
ROUTER_BASES = ("naive", "langgraph-batch")
"""Contenders that also run through vllm-router (`<base>-router`, `<base>-router-ps`;
`naive-bounded-<k>` too): `benchmarks/routers/process.py`."""

# The batchagent venv has no LangGraph, and `langgraph_batch/__init__.py` imports
# it: register the packages down to the contenders (their directories are argv[1]
# and argv[2]: a PYTHONPATH could put the bench's own site-packages ahead of that
# venv's) without running their `__init__`s, then run the stdlib-only runner as `__main__`.
_STDLIB_RUNNER = (
    "import runpy, sys, types\n"
    "lgb = sys.argv.pop(1) + '/langgraph_batch'\n"
    "bench = sys.argv.pop(1) + '/benchmarks'\n"
    "for name, path in (('langgraph_batch', lgb), ('langgraph_batch.bench', lgb + '/bench'),\n"
    "                   ('langgraph_batch.bench.contenders', lgb + '/bench/contenders'),\n"
    "                   ('benchmarks', bench), ('benchmarks.contenders', bench + '/contenders')):\n"
    "    mod = types.ModuleType(name)\n"
    "    mod.__path__ = [path]\n"
    "    sys.modules[name] = mod\n"
    "runpy.run_module(sys.argv[1], run_name='__main__', alter_sys=True)\n"
)


def _agents(workload: str) -> bool:
    """An agent workload (not single-turn, not a simulation, not a replay)."""
    return (
        workload in WORKLOADS and workload not in SINGLE_TURN and not WORKLOADS[workload].simulation
    )


def _bounded(contender: str) -> bool:
    try:
        return bounded_concurrency(contender) is not None
    except ValueError:
        return False


def batchagent_python() -> Path:
    """The batchagent venv's python, creating the venv on first use.

    Raises:
        RuntimeError: if the venv cannot be created or batch-agent not installed.
    """
    venv = _paths.batchagent_venv()
    py = venv / "bin" / "python"
    check = [str(py), "-c", "import batch_agent"]
    if py.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return py
    harness.log(f"creating {venv} with {BATCHAGENT_SPEC} (first run only)")
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(py), "-m", "pip", "install", "-q", BATCHAGENT_SPEC],
    ]
    # The main venv may itself have been created without pip in its base python.
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"could not set up the batchagent venv: `{shlex.join(cmd)}` failed: "
                f"{(proc.stderr or proc.stdout)[-500:]}"
            )
    if subprocess.run(check, capture_output=True).returncode != 0:
        raise RuntimeError(f"{BATCHAGENT_SPEC} installed but `import batch_agent` fails")
    return py


def versions() -> dict[str, Any]:
    """The wheel harness's versions, with batch-agent's and the checkout's commit."""
    out = harness.versions()
    cpus = out.pop("cpu_count")
    out.pop("installed")
    out.pop("git_commit")
    out["batch-agent"] = BATCHAGENT_SPEC.split("==")[1]
    out["cpu_count"] = cpus
    root = _paths.checkout_root()
    out["installed"] = root is None
    out["git_commit"] = None  # an installed package has no checkout to ask
    if root is not None:
        try:
            proc = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=root,
                check=False,
            )
            out["git_commit"] = proc.stdout.strip() or None
        except OSError:  # no git
            pass
    return out


class Research(BenchExtension):
    """The bounds, batchagent, router contenders, goals, charts and the checkout's results."""

    contenders = ("batchagent", "ideal")

    def knows(self, workload: str, contender: str) -> bool:
        if contender == harness.BOUND:
            return True
        if contender == "batchagent":
            return _agents(workload)
        base, mode = split_router(contender)
        return mode is not None and _agents(workload) and (base in ROUTER_BASES or _bounded(base))

    def base(self, contender: str) -> str:
        return split_router(contender)[0]

    def module(self, contender: str) -> str | None:
        return BATCHAGENT_MODULE if contender == "batchagent" else None

    def command(
        self, contender: str, cmd: list[str], env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        if contender != "batchagent":
            return cmd, env
        python = batchagent_python()
        env.pop("PYTHONPATH", None)
        here = str(_paths.package_parent())
        return [str(python), "-c", _STDLIB_RUNNER, str(package_parent()), here, cmd[-1]], env

    def bound(self, wl: Workload, *, n: int, seed: int) -> dict[str, Any]:
        """The `ideal` contender: the KV-valid bound for long-horizon shapes, else `ideal.ideal`."""
        from benchmarks.contenders import ideal, kv_bound

        if wl.simulation:
            return kv_bound.simulation_bound(wl, n=n, seed=seed)
        if wl.turns_range is not None or wl.extra.get("bound") == "kv":
            # Long-horizon shapes whose contexts outgrow the KV cache: the KV-valid bound,
            # with the server's second tier where it has one (W8o).
            return kv_bound.agents_bound(wl, n=n, seed=seed, offload_tokens=offload_tokens(wl))
        return ideal.ideal(wl, n=n, seed=seed)

    def replay_bound(self, rp: Any, syn: Any, *, profile_name: str, start: str) -> dict[str, Any]:
        from benchmarks.contenders.ideal import resident_bound

        return resident_bound(rp, syn, profile_name=profile_name, start=start)

    def live_refusal(self, contender: str) -> str | None:
        if contender == "batchagent":
            return "batchagent cannot force the workload's shapes"
        if split_router(contender)[1] is not None:
            return "router contenders run on the emulator only"
        return None

    @contextmanager
    def around(
        self,
        contender: str,
        job: dict[str, Any],
        *,
        urls: Sequence[str],
        profile: str,
        time_scale: float,
    ) -> Iterator[dict[str, Any]]:
        mode = split_router(contender)[1]
        if mode is None:
            yield {}
            return
        # Through vllm-router, started for this contender only.
        router = start_router(mode, urls, profile=profile, time_scale=time_scale)
        point_job_at(job, router)
        added: dict[str, Any] = {}
        try:
            yield added
        finally:
            info = stop_router(router, time_scale=time_scale)
            if info is not None:
                added["router"] = info

    def finish(self, result: dict[str, Any]) -> None:
        result["versions"] = versions()
        result["goals"] = goals(result["workload"], result["contenders"], result["params"]["n"])

    def sections(self, contenders: Mapping[str, Mapping[str, Any]]) -> list[str]:
        return router_markdown(contenders)

    def written(self, result: Mapping[str, Any], paths: dict[str, Path]) -> None:
        from benchmarks.report import chart

        paths["png"] = paths["json"].with_suffix(".png")
        chart(result, paths["png"])

    def default_out(self) -> Path | None:
        return _paths.default_out()


@contextmanager
def research() -> Iterator[Research]:
    """Install `Research` for the duration (the wheel's own extension afterwards)."""
    ext = Research()
    previous = use(ext)
    try:
        yield ext
    finally:
        use(previous)
