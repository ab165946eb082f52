"""A fan_out run killed with SIGKILL after k siblings finished resumes and re-runs only the rest.

Both ways of running a graph: async (`ainvoke`, `AsyncSqliteSaver`) and sync
(`invoke`, `SqliteSaver`, whose siblings run in threads).

The test starts this file as a script in a subprocess (SQLite checkpointer),
waits until k siblings' results are saved as pending writes, kills the
process, then resumes the thread in a new process and counts how many times
each sibling ran through a side file.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

import pytest

from tests.fakes.fan_out import parent_graph

N_SIBLINGS = 8
FINISH_FIRST = 5  # siblings 0..4 finish in the first run; 5..7 block until killed


class Sub(TypedDict, total=False):
    x: int
    y: int


def build_graph(mode: str, side: Path, checkpointer: Any, *, sync: bool = False) -> Any:
    import threading

    from langgraph.graph import START, StateGraph

    from langgraph_batch._context import current_sibling
    from langgraph_batch.nodes import fan_out

    def record() -> bool:
        sib = current_sibling()
        assert sib is not None
        with side.open("a") as f:
            f.write(json.dumps({"start": sib.index, "group": sib.group}) + "\n")
        return mode == "first" and sib.index >= FINISH_FIRST

    async def work(state: Sub) -> dict[str, Any]:
        if record():
            await asyncio.Event().wait()  # blocks until the process is killed
        return {"y": state["x"] * 100}

    def work_sync(state: Sub) -> dict[str, Any]:
        if record():
            threading.Event().wait()  # blocks until the process is killed
        return {"y": state["x"] * 100}

    sub = StateGraph(Sub)
    sub.add_node("work", work_sync if sync else work)
    sub.add_edge(START, "work")
    node = fan_out(
        sub.compile(),
        items="xs",
        into="out",
        make_input=lambda x, i: {"x": x},
        result=lambda final: final["y"],
    )
    return parent_graph(node, checkpointer=checkpointer)


def script_sync(mode: str, db: str, side: Path) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    with SqliteSaver.from_conn_string(db) as saver:
        graph = build_graph(mode, side, saver, sync=True)
        cfg: Any = {"configurable": {"thread_id": "resume-test"}}
        inputs = {"xs": list(range(N_SIBLINGS))} if mode == "first" else None
        out = graph.invoke(inputs, cfg)
        sys.stdout.write(json.dumps(out["out"]) + "\n")


async def script(mode: str, db: str, side: Path) -> None:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        graph = build_graph(mode, side, saver)
        cfg: Any = {"configurable": {"thread_id": "resume-test"}}
        inputs = {"xs": list(range(N_SIBLINGS))} if mode == "first" else None
        out = await graph.ainvoke(inputs, cfg)
        sys.stdout.write(json.dumps(out["out"]) + "\n")


def saved_results(db: Path) -> int:
    if not db.exists():
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        row = conn.execute("SELECT count(*) FROM writes WHERE channel = 'results'").fetchone()
    except sqlite3.OperationalError:  # table not created yet
        return 0
    finally:
        conn.close()
    return int(row[0])


def run_script(mode: str, db: Path, side: Path, flavour: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, mode, str(db), str(side), flavour],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def starts(side: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in side.read_text().splitlines()]


@pytest.mark.parametrize("flavour", ["async", "sync"])
def test_killed_run_resumes_and_reruns_only_unfinished_siblings(
    tmp_path: Path, flavour: str
) -> None:
    pytest.importorskip("langgraph.checkpoint.sqlite")
    db, side = tmp_path / "ckpt.sqlite", tmp_path / "side.jsonl"
    first = run_script("first", db, side, flavour)
    try:
        deadline = time.monotonic() + 40
        while saved_results(db) < FINISH_FIRST:
            if first.poll() is not None:
                pytest.fail(f"first run exited early: {first.communicate()}")
            if time.monotonic() > deadline:
                pytest.fail("the first run never saved its finished siblings")
            time.sleep(0.05)
        # all siblings started, the blocked ones are still running
        assert sorted(s["start"] for s in starts(side)) == list(range(N_SIBLINGS))
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
        first.communicate()
    assert first.returncode == -signal.SIGKILL
    first_starts = starts(side)

    second = run_script("resume", db, side, flavour)
    stdout, stderr = second.communicate(timeout=40)
    assert second.returncode == 0, stderr
    assert json.loads(stdout.strip().splitlines()[-1]) == [x * 100 for x in range(N_SIBLINGS)]
    resumed = starts(side)[len(first_starts) :]
    # only the siblings that had not finished ran again
    assert sorted(s["start"] for s in resumed) == list(range(FINISH_FIRST, N_SIBLINGS))
    # the group id survives the restart (derived from the checkpoint namespace)
    assert {s["group"] for s in first_starts} == {s["group"] for s in resumed}


if __name__ == "__main__":
    if sys.argv[4] == "sync":
        script_sync(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
    else:
        asyncio.run(script(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
