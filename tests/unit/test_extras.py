"""A missing optional dependency names the extra to install, not a raw ModuleNotFoundError.

Each case runs in a fresh interpreter with the module blocked
(`sys.modules[name] = None`, which makes importing it fail as if it were not
installed). Nothing here opens a socket: every command fails before it would.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from langgraph_batch._extras import missing_extra


def _run(blocked: str, code: str) -> subprocess.CompletedProcess[str]:
    prelude = f"import sys; sys.modules[{blocked!r}] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


EMULATE = "from langgraph_batch.cli import main; raise SystemExit(main(['emulate', '--port', '0']))"
SERVE = """
import asyncio
from langgraph_batch.emulator import EmulatorConfig, serve

async def go():
    async with serve(EmulatorConfig(port=0)):
        pass

asyncio.run(go())
"""
DEMO = "from langgraph_batch.cli import main; raise SystemExit(main(['demo', '--n', '1']))"
BENCH = "from langgraph_batch.cli import main; raise SystemExit(main(['bench', 'W1', '--n', '1']))"


@pytest.mark.parametrize(
    ("blocked", "code", "extra", "names"),
    [
        pytest.param("starlette", EMULATE, "emulator", "starlette", id="emulate-no-starlette"),
        pytest.param("uvicorn", EMULATE, "emulator", "uvicorn", id="emulate-no-uvicorn"),
        pytest.param("uvicorn", SERVE, "emulator", "uvicorn", id="serve-no-uvicorn"),
        pytest.param("starlette", DEMO, "demo", "starlette", id="demo-no-emulator"),
        pytest.param(
            "langchain_openai", BENCH, "bench", "langchain_openai", id="bench-no-chatopenai"
        ),
        pytest.param("uvicorn", BENCH, "bench", "uvicorn", id="bench-no-emulator"),
        pytest.param(
            "prometheus_client",
            "import langgraph_batch.metrics",
            "metrics",
            "prometheus_client",
            id="metrics-no-prometheus-client",
        ),
    ],
)
def test_missing_extra_is_named(blocked: str, code: str, extra: str, names: str) -> None:
    proc = _run(blocked, code)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    # The emulator raises; the demo reports its failure on one line, naming the error.
    assert last.startswith(
        (
            "ImportError: ",
            "langgraph-batch demo failed: ImportError: ",
            "langgraph-batch bench failed: ImportError: ",
        )
    ), proc.stderr
    assert f"pip install 'langgraph-batch[{extra}]'" in last
    assert names in last
    assert "ModuleNotFoundError" not in proc.stderr  # raised `from None`: no raw chain


def test_missing_extra_message() -> None:
    err = missing_extra("redis", "fan_out(executor=RedisExecutor(...)) needs redis")
    assert isinstance(err, ImportError)
    assert str(err) == (
        "fan_out(executor=RedisExecutor(...)) needs redis: pip install 'langgraph-batch[redis]'"
    )


def test_pyproject_defines_the_extras_the_messages_name() -> None:
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    assert {"starlette", "uvicorn"} <= {d.split(">")[0] for d in extras["emulator"]}
    assert "langgraph-batch[emulator]" in extras["demo"]
    assert any(d.startswith("langchain-openai") for d in extras["demo"])
    # The harness, from a wheel: its servers, the naive contenders' ChatOpenAI (the
    # charts are the research harness's, benchmarks/pyproject.toml).
    assert "langgraph-batch[emulator]" in extras["bench"]
    assert any(d.startswith("langchain-openai") for d in extras["bench"])
    assert not any(d.startswith("matplotlib") for d in extras["bench"])
