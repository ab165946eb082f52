"""Where the bench writes, and what its subprocesses import.

- `default_out()`: `./bench-results` (never a directory inside site-packages;
  the repository's research harness writes `benchmarks/results` instead).
- `child_env()`: the environment of the bench's subprocesses (the tool
  service, the contenders), which must import this same `langgraph_batch`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ("child_env", "default_out", "package_parent")


def package_parent() -> Path:
    """The directory that holds this `langgraph_batch` package (this file is in its `bench/`)."""
    return Path(__file__).resolve().parents[2]


def default_out() -> Path:
    """Where results go by default: `./bench-results`."""
    return Path.cwd() / "bench-results"


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
