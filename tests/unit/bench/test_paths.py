"""Where the bench writes: the wheel's `./bench-results`, the research harness's checkout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks import _paths as research_paths
from langgraph_batch.bench import _paths

REPO = Path(__file__).resolve().parents[3]


def test_the_wheel_writes_to_the_cwd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert _paths.default_out() == tmp_path / "bench-results"


def test_a_checkout_keeps_its_results_and_venv_in_benchmarks() -> None:
    assert research_paths.checkout_root() == REPO
    assert research_paths.default_out() == REPO / "benchmarks" / "results"
    assert research_paths.batchagent_venv() == REPO / "benchmarks" / ".venv-batchagent"


def test_an_installed_research_harness_writes_to_the_cwd_and_the_user_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    site = tmp_path / "site-packages"
    monkeypatch.setattr(research_paths, "package_parent", lambda: site)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert research_paths.checkout_root() is None
    assert research_paths.default_out() == tmp_path / "bench-results"
    venv = research_paths.batchagent_venv()
    assert venv == tmp_path / "cache" / "langgraph-batch" / "venv-batchagent"
    assert not str(research_paths.default_out()).startswith(str(site))


def test_cache_dir_order() -> None:
    cache_dir = research_paths.cache_dir
    assert cache_dir({"LGB_BENCH_CACHE": "/c", "XDG_CACHE_HOME": "/x"}) == Path("/c")
    assert cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/langgraph-batch")
    assert cache_dir({}) == Path.home() / ".cache" / "langgraph-batch"


def test_child_env_puts_this_package_first_once() -> None:
    parent = str(_paths.package_parent())
    env = _paths.child_env({"PYTHONPATH": os.pathsep.join(["/a", parent]), "X": "1"})
    assert env["PYTHONPATH"].split(os.pathsep) == [parent, "/a"]
    assert env["X"] == "1"
    assert _paths.child_env({})["PYTHONPATH"] == parent
