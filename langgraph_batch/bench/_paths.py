"""Where the bench reads and writes, from a source checkout or an installed wheel.

- `checkout_root()`: the repository this package runs from, or None when it
  is installed (a wheel in site-packages): results, the batchagent venv and
  the git commit come from the checkout only when there is one.
- `default_out()`: `benchmarks/results` of the checkout, else `./bench-results`
  (never a directory inside site-packages).
- `cache_dir()`: a user-writable home for what the bench builds once, such as
  the batchagent contender's virtual environment (`$LGB_BENCH_CACHE`, else
  `$XDG_CACHE_HOME/langgraph-batch`, else `~/.cache/langgraph-batch`).
- `child_env()`: the environment of the bench's subprocesses (the tool
  service, the contenders), which must import this same `langgraph_batch`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = (
    "batchagent_venv",
    "cache_dir",
    "checkout_root",
    "child_env",
    "default_out",
    "package_parent",
)


def package_parent() -> Path:
    """The directory that holds this `langgraph_batch` package (this file is in its `bench/`)."""
    return Path(__file__).resolve().parents[2]


def checkout_root() -> Path | None:
    """The source checkout this package runs from (None: an installed package)."""
    root = package_parent()
    if (root / "pyproject.toml").is_file() and (root / "benchmarks").is_dir():
        return root
    return None


def default_out() -> Path:
    """Where results go by default: the checkout's `benchmarks/results`, else `./bench-results`."""
    root = checkout_root()
    if root is not None:
        return root / "benchmarks" / "results"
    return Path.cwd() / "bench-results"


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """A user-writable directory for what the bench builds once (not site-packages)."""
    env = os.environ if environ is None else environ
    if env.get("LGB_BENCH_CACHE"):
        return Path(env["LGB_BENCH_CACHE"])
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "langgraph-batch"


def batchagent_venv() -> Path:
    """The batchagent contender's virtual environment (created on first use)."""
    root = checkout_root()
    if root is not None:
        return root / "benchmarks" / ".venv-batchagent"
    return cache_dir() / "venv-batchagent"


def child_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`environ` with this package's parent directory first on `PYTHONPATH`.

    A subprocess started with `sys.executable -m langgraph_batch.bench...`
    then imports the same package as this process, whether it came from a
    checkout (tests, `PYTHONPATH=...`) or from site-packages.
    """
    env = dict(os.environ if environ is None else environ)
    parts = [str(package_parent())]
    parts += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != parts[0]]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env
