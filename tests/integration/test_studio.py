"""LangGraph Studio: start `langgraph dev` offline on the repo's langgraph.json, drive it.

The server is started in its own process group and the whole group is killed
at teardown; the test asserts it is gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.studio

REPO = Path(__file__).resolve().parents[2]
LANGGRAPH = Path(sys.executable).with_name("langgraph")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def studio_config(workdir: Path) -> Path:
    """The repo's langgraph.json with its paths made absolute, written into `workdir`.

    `langgraph dev` resolves graph paths against its working directory and keeps
    its in-memory state in `./.langgraph_api`; running it in a temporary directory
    keeps each test's server state separate and out of the repository.
    """
    config = json.loads((REPO / "langgraph.json").read_text())
    config["dependencies"] = [str((REPO / d).resolve()) for d in config["dependencies"]]
    config["graphs"] = {
        name: str((REPO / spec.split(":")[0]).resolve()) + ":" + spec.split(":")[1]
        for name, spec in config["graphs"].items()
    }
    path = workdir / "langgraph.json"
    path.write_text(json.dumps(config))
    return path


class DevServer:
    """A `langgraph dev` process group on a free loopback port."""

    def __init__(self, *, env: dict[str, str], workdir: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "langgraph-dev.log"
        self._log_fh = self.log.open("wb")
        self.proc = subprocess.Popen(
            [
                str(LANGGRAPH),
                "dev",
                "--no-browser",
                "--no-reload",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--config",
                str(studio_config(workdir)),
            ],
            cwd=workdir,
            env=env,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pgid = self.proc.pid

    def wait_ready(self, timeout: float = 45.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"langgraph dev exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/ok", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        pytest.fail(f"langgraph dev not ready after {timeout}s:\n{self.tail()}")

    async def atail(self, n: int = 60) -> str:
        """`tail` off the event loop (reading the log file blocks)."""
        return await asyncio.to_thread(self.tail, n)

    def tail(self, n: int = 60) -> str:
        self._log_fh.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if _group_alive(self.pgid):
            os.killpg(self.pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.pgid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        # Children are re-parented when the leader exits; give init a moment to reap them.
        deadline = time.monotonic() + 10
        while _group_alive(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(self.pgid):
            os.killpg(self.pgid, signal.SIGKILL)
        self._log_fh.close()


@pytest.fixture
def studio_emulator() -> Iterator[str]:
    """The test's own emulator (fast clock), so the test controls its cleanup."""
    from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess

    with EmulatorProcess(EmulatorConfig(port=0, time_scale=50.0)) as emulator:
        yield emulator.url


@pytest.fixture
def dev_server(tmp_path: Path, studio_emulator: str) -> Iterator[DevServer]:
    env = dict(os.environ)
    env.update(
        LANGGRAPH_CLI_NO_ANALYTICS="1",
        LANGGRAPH_NO_VERSION_CHECK="true",
        LANGSMITH_TRACING="false",
        LGB_BACKEND_URL=studio_emulator,  # the graphs would otherwise start their own emulator
    )
    env.pop("LGB_MODEL", None)  # exercised: the graphs ask the server's /v1/models
    server = DevServer(env=env, workdir=tmp_path)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
    assert server.proc.poll() is not None, "langgraph dev still running"
    assert not _group_alive(server.pgid), "a process of the langgraph dev group survived"


EXPECTED_SCHEMA_KEYS = {
    "fan_out_demo": {"topics", "n", "results", "summary"},
    "code_review": {"n", "groups", "files", "reviews", "report"},
    "research": {"topic", "n", "questions", "notes", "report"},
}


def test_state_schemas_need_typing_extensions_typeddict_before_312() -> None:
    """Why the examples use `typing_extensions.TypedDict`: LangGraph builds the
    input/output JSON schema with pydantic, which rejects `typing.TypedDict` on
    Python < 3.12; the LangGraph server then reports `input_schema: null`."""
    import typing

    import pydantic
    import typing_extensions
    from langgraph.graph import START, StateGraph

    def schema_of(typed_dict: Any) -> dict[str, Any]:
        state = typed_dict("State", {"topic": str, "answer": str}, total=False)
        builder = StateGraph(state)
        builder.add_node("noop", lambda s: {})
        builder.add_edge(START, "noop")
        return builder.compile().get_input_jsonschema()

    assert set(schema_of(typing_extensions.TypedDict)["properties"]) == {"topic", "answer"}
    if sys.version_info < (3, 12):
        with pytest.raises(pydantic.PydanticUserError, match=r"typing_extensions\.TypedDict"):
            schema_of(typing.TypedDict)


def test_langgraph_json_is_valid() -> None:
    from langgraph_cli.config import validate_config_file

    config = validate_config_file(REPO / "langgraph.json")
    assert set(config["graphs"]) == {"fan_out_demo", "code_review", "research"}
    for spec in config["graphs"].values():
        assert (REPO / spec.split(":")[0]).is_file(), spec


async def test_studio_fan_out_graph_and_run(dev_server: DevServer) -> None:
    from langgraph_sdk import get_client

    async with get_client(url=dev_server.url) as client:
        await _drive(client, dev_server)


async def _drive(client: Any, dev_server: DevServer) -> None:
    registered = {a["graph_id"]: a["assistant_id"] for a in await client.assistants.search()}
    if not {"fan_out_demo", "code_review", "research"} <= set(registered):
        pytest.fail(f"graphs missing: {sorted(registered)}\n{await dev_server.atail()}")
    aid = registered["fan_out_demo"]

    # Studio's input and output forms: every example graph has its schemas
    # (null when its state is a typing.TypedDict on Python < 3.12).
    for graph_id, keys in EXPECTED_SCHEMA_KEYS.items():
        schemas = await client.assistants.get_schemas(registered[graph_id])
        for kind in ("input_schema", "output_schema"):
            schema = schemas[kind]
            assert schema is not None, f"{graph_id} has no {kind}\n{await dev_server.atail()}"
            assert keys <= set(schema["properties"]), (graph_id, kind, schema["properties"])

    # The drawn graph: the fan_out node, and with xray the sibling subgraph inside it.
    plain = {n["id"] for n in (await client.assistants.get_graph(aid))["nodes"]}
    assert {"prepare", "fan_out", "summarize"} <= plain
    xray = {n["id"] for n in (await client.assistants.get_graph(aid, xray=True))["nodes"]}
    assert "fan_out:sibling:answer" in xray, xray
    review = await client.assistants.get_graph(registered["code_review"], xray=True)
    review_nodes = {n["id"] for n in review["nodes"]}
    assert {"review:sibling:model", "review:sibling:tools"} <= review_nodes, review_nodes

    topics = [f"topic-{i}" for i in range(20)]
    events: list[dict[str, object]] = []
    final: dict[str, object] = {}
    thread = await client.threads.create()  # as Studio runs it: on a thread, checkpointed
    async for part in client.runs.stream(
        thread["thread_id"],
        aid,
        input={"topics": topics},
        stream_mode=["custom", "values"],
        stream_subgraphs=True,
    ):
        if part.event == "error":
            pytest.fail(f"run failed: {part.data}\n{await dev_server.atail()}")
        if part.event.startswith("custom") and part.data.get("type") == "lgb.fan_out":
            events.append(part.data)
        elif part.event == "values":  # the parent graph's state (no namespace suffix)
            final = part.data

    kinds = [e["event"] for e in events]
    assert kinds[0] == "started"
    assert kinds.count("sibling_started") == 20
    assert kinds.count("sibling_finished") == 20
    assert kinds[-1] == "done"
    assert events[-1]["done"] == events[-1]["total"] == 20
    assert events[-1]["failed"] == 0
    progress = [e["done"] for e in events if e["event"] == "sibling_finished"]
    assert progress == sorted(progress)
    assert progress[-1] == 20

    results = final["results"]
    assert isinstance(results, list)
    assert [r["topic"] for r in results] == topics  # collected in input order
    assert all(isinstance(r["answer"], str) and r["answer"] for r in results)
    assert final["summary"] == {"total": 20, "failed": 0}
    state = await client.threads.get_state(thread["thread_id"])
    assert [r["topic"] for r in state["values"]["results"]] == topics  # checkpointed

    # An example graph end to end under the server (create_agent siblings, structured
    # output, coalesced tools, the server's checkpointer).
    review_thread = await client.threads.create()
    out = await client.runs.wait(
        review_thread["thread_id"], registered["code_review"], input={"n": 4, "groups": 2}
    )
    assert out["report"]["reviewed"] == 4, out
    assert out["report"]["failed"] == []

    log = await dev_server.atail(10_000)
    assert "BlockingError" not in log, log  # nothing of ours blocks the server's event loop
