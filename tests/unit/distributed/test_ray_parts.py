"""RayExecutor's pure parts: placement, option checks, and Ray staying an optional extra."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from langgraph_batch.distributed.ray import RayExecutor, place

NODES = ["node-a", "node-b", "node-c"]


def test_place_is_stable_and_balanced() -> None:
    keys = [str(i) for i in range(60)]
    first = place(keys, NODES)
    assert first == place(keys, list(reversed(NODES)))  # the node order does not matter
    assert Counter(first) == dict.fromkeys(NODES, 20)  # bounded load: each its share


def test_losing_a_node_moves_mostly_its_own_keys() -> None:
    keys = [str(i) for i in range(600)]
    before = place(keys, NODES)
    after = place(keys, ["node-a", "node-b"])
    moved = sum(1 for b, a in zip(before, after, strict=True) if b != "node-c" and a != b)
    assert sum(1 for b in before if b == "node-c") == 200
    # Only the bounded load moves keys of the surviving nodes (never most of them).
    assert moved < 200


def test_place_needs_a_node() -> None:
    with pytest.raises(ValueError, match="no live node"):
        place(["0"], [])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"graph": "no-colon"}, "graph must be"),
        ({"graph": "m:g", "concurrency": 0}, "concurrency"),
        ({"graph": "m:g", "max_deliveries": 0}, "max_deliveries"),
        ({"graph": "m:g", "timeout": 0}, "timeout"),
        ({"graph": "m:g", "ttl_s": -1}, "ttl_s"),
    ],
)
def test_bad_options_fail_at_construction(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RayExecutor(**kwargs)  # type: ignore[arg-type]


def test_repr_names_no_secret() -> None:
    ex = RayExecutor(graph="m:g", secret="s3cr3t-value", address="ray://user:pw@host:10001")
    assert "s3cr3t" not in repr(ex)
    assert "pw" not in repr(ex)


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_core_and_the_distributed_package_never_import_ray() -> None:
    proc = _fresh(
        "import sys, langgraph_batch, langgraph_batch.distributed, langgraph_batch.nodes\n"
        "from langgraph_batch.distributed import RayExecutor\n"
        "RayExecutor(graph='m:g')\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_without_ray_a_run_names_the_extra() -> None:
    proc = _fresh(
        "import sys; sys.modules['ray'] = None\n"
        "from langgraph_batch.distributed.ray import _ray\n"
        "_ray()"
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ")
    assert "pip install 'langgraph-batch[ray]'" in last


def test_pyproject_has_the_ray_extra_and_the_tests_install_it() -> None:
    root = Path(__file__).resolve().parents[3]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(d.startswith("ray") for d in extras["ray"])
    assert "ray" in extras["test"][0].split("[")[1].rstrip("]").split(",")
