"""`bench --server` and `bench --replay` from the built wheel, in an empty venv, no checkout.

Builds the wheel (`pip wheel`, hatchling), checks that it holds the harness
users run and none of the research harness (`benchmarks/`: bounds, goals,
routers, the prior-art contender, charts), installs it with the `bench` extra
into a fresh virtual environment, starts that environment's own emulator as
an ordinary server, and from a temporary directory (no checkout on any path)
runs `langgraph-batch bench --help`, `bench W1 --server ...`, records a small
fan_out job with `langgraph_batch.record.Recorder` and replays it with
`bench --replay`. Slow (~1 minute, most of it `pip install`); needs the
package registry.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = "emulated-llama-3-8b"
# What users run (`bench --server`, `--replay`, `demo`) is in the wheel ...
SHIPPED = (
    "langgraph_batch/bench/cli.py",
    "langgraph_batch/bench/extension.py",
    "langgraph_batch/bench/harness.py",
    "langgraph_batch/bench/replay_run.py",
    "langgraph_batch/bench/demo.py",
    "langgraph_batch/bench/contenders/lgb.py",
    "langgraph_batch/bench/contenders/naive.py",
)
# ... and the research harness is not (it is `benchmarks/`, a distribution of its own).
RESEARCH_ONLY = ("goals", "routers", "ideal", "kv_bound", "batchagent", "bound", "chart")

RECORD = '''
import asyncio, sys
from typing import Annotated, Any, TypedDict
from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import tools_condition
from langgraph_batch import BatchedChatModel, BatchToolNode, coalesce, fan_out
from langgraph_batch.record import Recorder

@tool
async def lookup(query: str) -> str:
    """Look the query up."""
    await asyncio.sleep(0.2)
    return "found " + query * 50

class A(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]

class P(TypedDict, total=False):
    items: list[str]
    results: list[Any]

async def main() -> None:
    llm = BatchedChatModel(model=sys.argv[2], base_url=sys.argv[1], max_tokens=200)
    tools = [coalesce(lookup)]
    bound = llm.bind_tools(tools)
    async def model(state: A) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}
    g = StateGraph(A)
    g.add_node("model", model)
    g.add_node("tools", BatchToolNode(tools))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition, ["tools", END])
    g.add_edge("tools", "model")
    system = SystemMessage("You are an agent." + " notes on the job" * 120)
    p = StateGraph(P)
    p.add_node("agents", fan_out(g.compile(), items="items", into="results",
        make_input=lambda item, i: {"messages": [system, HumanMessage(item)]}))
    p.add_edge(START, "agents")
    p.add_edge("agents", END)
    items = [f"Task {i}: key=k{i % 2} turns=2. " + "context " * (50 + 10 * i) for i in range(4)]
    async with Recorder("job.jsonl") as rec:
        await p.compile().ainvoke({"items": items}, config={"callbacks": [rec]})
    await llm.get_scheduler().aclose()

asyncio.run(main())
'''


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (cmd, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc.stdout + proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_bench_server_and_replay_from_the_wheel_in_an_empty_venv(tmp_path: Path) -> None:
    t0 = time.monotonic()
    # The environment of a user's shell: nothing of this checkout or of the test's venv.
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["LANGSMITH_TRACING"] = "false"
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
         tmp_path, env, 180)  # fmt: skip
    (wheel,) = dist.glob("langgraph_batch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert all(name in names for name in SHIPPED), [n for n in SHIPPED if n not in names]
    assert not [n for n in names if n.startswith("benchmarks/")]
    research = [n for n in names if any(w in n.rsplit("/", 1)[-1] for w in RESEARCH_ONLY)]
    assert research == [], research
    venv = tmp_path / "venv"
    # No pip inside it (ensurepip costs ~10 s): the test's own pip installs into it
    # (`--python`), without compiling bytecode (which the run's imports write anyway).
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env, 120)
    py, cli = venv / "bin" / "python", venv / "bin" / "langgraph-batch"
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-compile",
          f"{wheel}[bench]"], tmp_path, env, 400)  # fmt: skip
    work = tmp_path / "work"  # no checkout here, none on the path
    work.mkdir()
    where = _run([str(py), "-c", "import langgraph_batch; print(langgraph_batch.__file__)"],
                 work, env, 60)  # fmt: skip
    assert "site-packages" in where
    assert str(ROOT) not in where
    installed_s = time.monotonic() - t0

    port = _free_port()
    emu = subprocess.Popen(
        [str(cli), "emulate", "--port", str(port), "--time-scale", "10"],
        cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert emu.poll() is None, "the wheel's emulator exited"
            assert time.monotonic() < deadline, "the wheel's emulator did not start"
            time.sleep(0.2)
        server = f"vllm://127.0.0.1:{port}"
        usage = _run([str(cli), "bench", "--help"], work, env, 60)
        assert all(option in usage for option in ("--server", "--replay", "--price"))
        # The bounds are the research harness's: the wheel says where they are.
        refused = subprocess.run(
            [str(cli), "bench", "W1", "--n", "2", "--server", server, "--model", MODEL,
             "--contenders", "naive,ideal"],
            cwd=work, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        assert "research harness (benchmarks/, make bench)" in refused.stderr
        _run([str(cli), "bench", "W1", "--n", "2", "--server", server, "--model", MODEL],
             work, env, 240)  # fmt: skip
        w1 = json.loads((work / "bench-results" / "W1.json").read_text())
        assert w1["versions"]["installed"] is True
        assert w1["versions"]["git_commit"] is None
        assert set(w1["contenders"]) == {"naive", "naive-bounded", "langgraph-batch"}
        assert w1["goals"] == []
        assert sorted(p.name for p in (work / "bench-results").iterdir()) == ["W1.json", "W1.md"]
        for name in ("naive", "langgraph-batch"):
            entry = w1["contenders"][name]
            assert "error" not in entry, entry
            assert entry["failures"] == 0, entry["errors"]
            assert entry["llm_requests"] == 4
        (work / "record.py").write_text(RECORD)
        _run([str(py), "record.py", server, MODEL], work, env, 120)
    finally:
        emu.terminate()
        emu.wait(timeout=30)
    _run([str(cli), "bench", "--replay", "job.jsonl", "--contenders",
          "naive,langgraph-batch", "--time-scale", "4"], work, env, 240)  # fmt: skip
    result = json.loads((work / "bench-results" / "replay.json").read_text())
    assert result["recorded"]["llm_requests"] == 8
    assert set(result["contenders"]) == {"naive", "langgraph-batch"}
    for name in ("naive", "langgraph-batch"):
        entry = result["contenders"][name]
        assert entry["failures"] == 0, entry["errors"]
        assert entry["fidelity"]["prompt_tokens"] == pytest.approx(1.0, abs=0.01)
        assert entry["fidelity"]["generation_tokens"] == pytest.approx(1.0, abs=0.01)
    assert not list(ROOT.glob("bench-results"))  # nothing written into the checkout
    sys.stderr.write(
        f"wheel test: {installed_s:.0f} s to build and install, "
        f"{time.monotonic() - t0:.0f} s in all\n"
    )
