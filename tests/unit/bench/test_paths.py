"""Where the bench writes from a checkout and from an installed wheel (`bench/_paths.py`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from langgraph_batch.bench import _paths

REPO = Path(__file__).resolve().parents[3]


def test_a_checkout_keeps_its_results_and_venv_in_benchmarks() -> None:
    assert _paths.checkout_root() == REPO
    assert _paths.default_out() == REPO / "benchmarks" / "results"
    assert _paths.batchagent_venv() == REPO / "benchmarks" / ".venv-batchagent"


def test_an_installed_package_writes_to_the_cwd_and_the_user_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    site = tmp_path / "site-packages"
    monkeypatch.setattr(_paths, "package_parent", lambda: site)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert _paths.checkout_root() is None
    assert _paths.default_out() == tmp_path / "bench-results"
    assert _paths.batchagent_venv() == tmp_path / "cache" / "langgraph-batch" / "venv-batchagent"
    assert not str(_paths.default_out()).startswith(str(site))


def test_cache_dir_order() -> None:
    assert _paths.cache_dir({"LGB_BENCH_CACHE": "/c", "XDG_CACHE_HOME": "/x"}) == Path("/c")
    assert _paths.cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/langgraph-batch")
    assert _paths.cache_dir({}) == Path.home() / ".cache" / "langgraph-batch"


def test_child_env_puts_this_package_first_once() -> None:
    parent = str(_paths.package_parent())
    env = _paths.child_env({"PYTHONPATH": os.pathsep.join(["/a", parent]), "X": "1"})
    assert env["PYTHONPATH"].split(os.pathsep) == [parent, "/a"]
    assert env["X"] == "1"
    assert _paths.child_env({})["PYTHONPATH"] == parent
