"""Where the research harness reads and writes: the checkout it runs from, or a user cache.

- `checkout_root()`: the repository this `benchmarks` package runs from, or
  None when it is installed (a wheel in site-packages): results, the
  batchagent venv and the git commit come from the checkout only when there is one.
- `default_out()`: `benchmarks/results` of the checkout, else `./bench-results`.
- `cache_dir()`: a user-writable home for what the bench builds once, such as
  the batchagent contender's virtual environment (`$LGB_BENCH_CACHE`, else
  `$XDG_CACHE_HOME/langgraph-batch`, else `~/.cache/langgraph-batch`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ("batchagent_venv", "cache_dir", "checkout_root", "default_out", "package_parent")


def package_parent() -> Path:
    """The directory that holds this `benchmarks` package."""
    return Path(__file__).resolve().parents[1]


def checkout_root() -> Path | None:
    """The source checkout this package runs from (None: an installed package)."""
    root = package_parent()
    if (root / "pyproject.toml").is_file() and (root / "langgraph_batch").is_dir():
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
