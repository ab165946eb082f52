"""Chaos in the long-horizon regime: contexts outgrow the cache while the server dies.

Rounds of 16 agents of 6 turns (each reads ~800-token tool results: ~5k
tokens of its own at the end, ~80k together, against a 40k-token cache) run
in a `fan_out` against an emulator process that faults ~15% of requests.
Meanwhile:

- the server is SIGKILLed mid-run and restarted on its port (every cached
  context is lost: the siblings' next turns recompute them);
- one sibling's tool never returns (the tools node's LangGraph timeout ends it);
- one sibling's task alone is larger than the whole cache (the server answers
  with a context-length error);
- one whole run is cancelled halfway and started again.

Every sibling ends in its own correct answer or a typed error at that sibling,
and afterwards the server's KV ledger is empty (no run, no booked token), no
task leaked. Figures Jepsen-style, all must be 0: lost, silently wrong, hung,
leaked tasks, ledger left booked, failed untyped.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from langgraph_batch.chat_model import BatchedChatModel
from langgraph_batch.emulator import EmulatorConfig
from langgraph_batch.nodes import SiblingError
from tests.chaos.conftest import KillableEmulator
from tests.integration.test_long_horizon import (
    MODEL,
    answered,
    fan_out_graph,
    stuck_first,
    task,
)

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

N = 16
KV = 40_000
ROUNDS = 3
TYPED = {"NodeTimeoutError", "ContextLengthExceededError", "BackendConnectionError",
         "BackendServerError", "BackendRateLimitError", "BackendStreamError",
         "MalformedToolCallError"}  # fmt: skip


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return ("asyncio", {"debug": False})


async def test_long_horizon_chaos(
    killable_emulator: type[KillableEmulator], tmp_path: Path
) -> None:
    emu = killable_emulator(
        EmulatorConfig(port=0, time_scale=50.0, kv_tokens=KV, fault_rate=0.15, seed=11)
    )
    await asyncio.to_thread(emu.start)
    llm = BatchedChatModel(model=MODEL, base_url=emu.url.replace("http", "vllm", 1), max_retries=6)
    graph = fan_out_graph(stuck_first(llm, tool_timeout=1.0))
    tasks = [task(0, turns=3), task(1, extra=KV), *(task(i, turns=6) for i in range(2, N))]
    figures = {"siblings": 0, "ok": 0, "failed_typed": 0, "lost": 0, "silently_wrong": 0,
               "hung": 0, "failed_untyped": 0, "restarts": 0, "runs_cancelled": 0}  # fmt: skip
    errors: dict[str, int] = {}
    rng = random.Random(5)
    before = {t for t in asyncio.all_tasks() if not t.done()}
    for r in range(ROUNDS):
        if r == 1:  # a whole run cancelled halfway, then started again
            run = asyncio.create_task(graph.ainvoke({"tasks": tasks}))
            await asyncio.sleep(rng.uniform(0.2, 0.6))
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            figures["runs_cancelled"] += 1
        run = asyncio.create_task(graph.ainvoke({"tasks": tasks}))
        if r == 0:  # the server dies mid-run: every cached context is lost
            await asyncio.sleep(rng.uniform(0.3, 0.8))
            await asyncio.to_thread(emu.restart)
            figures["restarts"] += 1
        try:
            out = await asyncio.wait_for(run, 150)
        except TimeoutError:
            figures["hung"] += N
            continue
        results = out["results"]
        figures["siblings"] += len(tasks)
        figures["lost"] += len(tasks) - len(results)
        for i, res in enumerate(results):
            if isinstance(res, SiblingError):
                errors[res.error_type] = errors.get(res.error_type, 0) + 1
                if res.error_type in TYPED:
                    figures["failed_typed"] += 1
                else:
                    figures["failed_untyped"] += 1
            elif answered(res, i):
                figures["ok"] += 1
            else:
                figures["silently_wrong"] += 1
    scheduler = llm.get_scheduler()
    ledger = await scheduler.kv_ledger()
    figures["ledger_booked_tokens"] = ledger.resident_tokens() if ledger else 0
    figures["ledger_runs"] = ledger.members if ledger else 0
    await scheduler.aclose()
    await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks() if not t.done() and t not in before]
    leaked = [t for t in leaked if t is not asyncio.current_task()]
    figures["leaked_tasks"] = len(leaked)
    figures["errors"] = errors  # type: ignore[assignment]
    table = "\n".join(f"  {key:26s} {value}" for key, value in figures.items())
    path = tmp_path / "long_horizon_chaos.json"
    await asyncio.to_thread(path.write_text, json.dumps(figures, indent=1))
    await asyncio.to_thread(print, f"\nlong-horizon chaos figures ({path})\n{table}")
    for key in ("lost", "silently_wrong", "hung", "failed_untyped", "leaked_tasks"):
        assert figures[key] == 0, figures
    assert figures["ledger_booked_tokens"] == 0, figures
    assert figures["ledger_runs"] == 0, figures
    # The two planted faults end at their siblings, typed, every round that completed.
    assert errors.get("NodeTimeoutError", 0) == ROUNDS, errors
    assert errors.get("ContextLengthExceededError", 0) == ROUNDS, errors
    assert figures["ok"] >= (N - 2) * ROUNDS * 0.8, figures
