"""Shared fixtures: asyncio-only anyio backend in debug mode, a hermetic
environment, and blockbuster so that a blocking call inside the event loop
fails the test instead of silently stalling every sibling."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator

import pytest
from blockbuster import BlockBuster, blockbuster_ctx

# Third-party modules imported lazily the first time a client is built (the
# import reads package metadata from disk). Importing them here keeps that
# one-time file read out of the event loop, where blockbuster would flag it.
for _module in ("httpcore2", "httpx2"):
    with contextlib.suppress(ImportError):
        importlib.import_module(_module)

# pytest-recording imports vcr (and compiles it) at the setup of the first
# cassette test, while earlier tests' background-loop threads may be parsing
# source with `ast` (LangChain reads lambdas' source): CPython 3.11 shares the
# AST converter's recursion counter between threads (gh-106905) and raised
# "SystemError: AST constructor recursion depth mismatch" there once in a
# clean-clone run. Import it now, before any thread exists.
with contextlib.suppress(ImportError):
    importlib.import_module("pytest_recording._vcr")


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"debug": True})


@pytest.fixture(autouse=True)
def hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No API keys, tracing or proxies leak in from the developer's shell."""
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "LANGSMITH_", "LANGCHAIN_", "LGB_", "VLLM_", "SGLANG_")) or (
            name.lower() in {"http_proxy", "https_proxy", "all_proxy"}
        ):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANGSMITH_TRACING", "false")


@pytest.fixture(autouse=True)
def blockbuster() -> Iterator[BlockBuster]:
    """Fail any test whose code blocks the running event loop (file or socket I/O, sleep)."""
    with blockbuster_ctx() as bb:
        yield bb


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One real local Ray cluster for the session: a head and a second node on loopback.

    Started on first use (~15-20 s on 2 cores) and shared by the Ray tests of
    `tests/chaos` and `tests/integration/distributed`; a test that kills a node
    adds one back. Its nodes log sibling executions to `cluster.exec_log`.
    """
    import ray

    from tests.integration.distributed.ray_cluster import RayCluster

    tmp = tmp_path_factory.mktemp("ray")
    cluster = RayCluster(tmp, env={"LGB_TEST_EXEC_LOG": str(tmp / "exec.log")})
    try:
        cluster.start(workers=1)
        yield cluster
    finally:
        ray.shutdown()
        cluster.stop()


def _declared_length(item: pytest.Item) -> float:
    """How long a test says it may take: `slow` first, then its own `timeout` mark."""
    mark = item.get_closest_marker("timeout")
    declared = float(mark.args[0]) if mark is not None and mark.args else 0.0
    return declared + (1000.0 if item.get_closest_marker("slow") is not None else 0.0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order and group the run for pytest-xdist (`make test` runs `-n 2 --dist loadgroup`).

    - Under xdist, the long tests (marked `slow`, or with a `timeout` mark of
      their own) start first, so that no worker is left with one at the end
      while the others idle. A run in one process keeps the files' order (the
      engine tier reuses its servers from one test to the next).
    - Every test of the shared Ray cluster goes to one worker (`xdist_group`),
      so the session starts one cluster.
    """
    if hasattr(config, "workerinput"):  # an xdist worker (each collects, in the same order)
        items.sort(key=_declared_length, reverse=True)
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("ray"))
