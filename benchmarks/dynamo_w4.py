"""W4's shape through a real NVIDIA Dynamo stack: session headers on and off (issue 26).

A fan_out of `n` two-turn agents (W4's prompts: a 2,048-token shared system
prompt and a 1,500-token task per sibling, in emulator tokens) runs through
`dynamo://` at a Dynamo frontend (KV router, session affinity on) over 2
mocker workers (`benchmarks/dynamo_stack.py`). Each agent: turn 1 with a
tool bound; the mocker writes random text, so the graph itself makes the
tool call from it (a `BatchToolNode` runs the tool: the sibling is in a tool,
its learned wait feeds the hints); turn 2 the sibling's answer, the tool still
bound (so its prompt extends turn 1's; it is not a *known* last call, so no
`X-Dynamo-Session-Final` goes out: a `tool_choice="none"` answer would be
one, but Dynamo 1.6.1 then drops the tools from the prompt and turn 2 shares
only the system prompt with turn 1). The same job runs once with the
library's session headers (`DynamoBackend`'s default) and once without
(`session_affinity=None`: no `X-Dynamo-*` header; the agent hints stay), each
on a fresh stack so neither sees the other's cache.

Prefill computed is the frontend's prompt tokens less the cached tokens the
workers reported (`dynamo_frontend_input_sequence_tokens_sum` -
`dynamo_frontend_cached_tokens_sum`); each worker's share is its own
`dynamo_component_requests_total` for `generate`.

```bash
python -m benchmarks.dynamo_w4 --n 64 --out benchmarks/results/dynamo   # dynamo_w4.{json,md}
```
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from benchmarks.dynamo_stack import DYNAMO_VERSION, DynamoStack
from langgraph_batch import BatchedChatModel, fan_out
from langgraph_batch.backends import DynamoBackend
from langgraph_batch.bench.workloads import WORKLOADS, system_prompt, task_text
from langgraph_batch.nodes import SiblingError
from langgraph_batch.tools import BatchToolNode

__all__ = ("measure", "run_job")

TOOL_WAIT_S = 0.05


class AgentState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class ParentState(TypedDict):
    tasks: list[str]
    results: list[Any]


@tool
async def lookup(query: str) -> str:
    """Look the query up (waits like a real tool, W4's latency scaled down)."""
    await asyncio.sleep(TOOL_WAIT_S)
    return f"Found 3 sources about {query[:40]}: all agree the topic is well documented."


def build_graph(llm: BatchedChatModel, *, first_tokens: int, answer_tokens: int) -> Any:
    """The parent graph: one fan_out of two-turn agents over `tasks` into `results`."""
    think = llm.bind_tools([lookup]).bind(max_tokens=first_tokens)
    # The answer turn binds the tools too, as an agent loop does: its prompt extends turn 1's.
    # (With tool_choice="none", Dynamo 1.6.1 drops the tools from the prompt, even with
    # --no-exclude-tools-when-tool-choice-none: turn 2 then shares only the system prompt.)
    answer_llm = llm.bind_tools([lookup]).bind(max_tokens=answer_tokens)

    async def plan(state: AgentState) -> dict[str, Any]:
        reply = await think.ainvoke(state["messages"])
        # The mocker writes random tokens, never a tool call: make the agent's one call here.
        call = {"name": "lookup", "args": {"query": str(reply.content)}, "id": "call_lookup"}
        return {"messages": [AIMessage(content=reply.content, tool_calls=[call])]}

    async def answer(state: AgentState) -> dict[str, Any]:
        return {"messages": [await answer_llm.ainvoke(state["messages"])]}

    agent = StateGraph(AgentState)
    agent.add_node("plan", plan)
    agent.add_node("tools", BatchToolNode([lookup]))
    agent.add_node("answer", answer)
    agent.add_edge(START, "plan")
    agent.add_edge("plan", "tools")
    agent.add_edge("tools", "answer")
    agent.add_edge("answer", END)
    subgraph = agent.compile()

    parent = StateGraph(ParentState)
    parent.add_node(
        "agents",
        fan_out(
            subgraph,
            items="tasks",
            into="results",
            make_input=lambda task, _i: {"messages": task},
            result=lambda s: str(s["messages"][-1].content),
        ),
    )
    parent.add_edge(START, "agents")
    parent.add_edge("agents", END)
    return parent.compile()


def tasks_for(n: int, seed: int) -> list[list[AnyMessage]]:
    """W4's opening messages: the shared system prompt and each sibling's task."""
    wl = WORKLOADS["W4"]
    system = system_prompt(wl, seed)
    return [[SystemMessage(system), HumanMessage(task_text(wl, i, seed))] for i in range(n)]


async def _run(
    url: str, model: str, n: int, seed: int, session: bool, parent_session: bool
) -> dict[str, Any]:
    options: dict[str, Any] = {} if session else {"session_affinity": None}
    backend = DynamoBackend(url, timeout=60.0, parent_session=parent_session, **options)
    async with backend:
        llm = BatchedChatModel(model=model, backend=backend)
        graph = build_graph(llm, first_tokens=32, answer_tokens=48)
        t0 = time.perf_counter()
        out = await graph.ainvoke({"tasks": tasks_for(n, seed), "results": []})
        makespan = time.perf_counter() - t0
    results = out["results"]
    failures = [r for r in results if isinstance(r, SiblingError)]
    return {
        "siblings": len(results),
        "failures": len(failures),
        "errors": [f"{f.error_type}: {f.message[:200]}" for f in failures[:3]],
        "makespan_s": round(makespan, 2),
    }


def run_job(
    *,
    n: int,
    session: bool,
    seed: int = 0,
    parent_session: bool = False,
    workers: int = 2,
    **stack: Any,
) -> dict[str, Any]:
    """One run on a fresh stack: results, prefill computed, each worker's share.

    Args:
        n: siblings.
        session: send the session headers (`DynamoBackend`'s default) or not
            (`session_affinity=None`).
        seed: W4's prompt seed.
        parent_session: also send `X-Dynamo-Parent-Session-ID` (the fan_out run).
        workers: mocker workers.
        **stack: `DynamoStack` options.
    """
    with DynamoStack(workers=workers, **stack) as dyn:
        run = asyncio.run(_run(dyn.url, dyn.model, n, seed, session, parent_session))
        tokens = dyn.frontend_tokens()
        per_worker = dyn.worker_requests()
    total = sum(per_worker) or 1
    return {
        **run,
        **tokens,
        "requests": sum(per_worker),
        "requests_per_worker": per_worker,
        "worker_share": [round(r / total, 3) for r in per_worker],
        "startup_s": round(dyn.ready_s, 1),
    }


def measure(*, n: int = 64, seed: int = 0, **stack: Any) -> dict[str, Any]:
    """With and without the session headers, each on a fresh stack; the ratio of prefills."""
    with_headers = run_job(n=n, session=True, seed=seed, **stack)
    without = run_job(n=n, session=False, seed=seed, **stack)
    ratio = with_headers["prefill"] / max(1, without["prefill"])
    return {
        "dynamo": DYNAMO_VERSION,
        "n": n,
        "seed": seed,
        "stack": {"workers": 2, "router": "kv", "session_affinity_ttl_s": 600, **stack},
        "with_headers": with_headers,
        "without_headers": without,
        "prefill_ratio_with_over_without": round(ratio, 3),
        "min_worker_share_with_headers": min(with_headers["worker_share"]),
    }


def _markdown(results: list[dict[str, Any]], command: str) -> str:
    first = results[0]
    rows = []
    for result in results:
        for name in ("with_headers", "without_headers"):
            r = result[name]
            share = ", ".join(f"{s:.0%}" for s in r["worker_share"])
            rows.append(
                f"| {result['seed']} | {name.replace('_', ' ')} | "
                f"{r['siblings'] - r['failures']}/{r['siblings']} | {r['prompt_tokens']:,} | "
                f"{r['cached_tokens']:,} | {r['prefill']:,} | {r['requests_per_worker']} "
                f"({share}) | {r['makespan_s']} |"
            )
    ratios = sorted(r["prefill_ratio_with_over_without"] for r in results)
    shares = min(r["min_worker_share_with_headers"] for r in results)
    return "\n".join(
        [
            f"# W4's shape through NVIDIA Dynamo {first['dynamo']} (2 mocker workers, KV router)",
            "",
            f"`{command}`",
            "",
            f"{first['n']} two-turn agents (fan_out) per run, W4's prompts; the frontend runs "
            "`--router-mode kv --router-session-affinity-ttl-secs 600`, a fresh stack per run. "
            "Prefill = prompt tokens - cached tokens (the frontend's counters of what the "
            "workers reported). With headers: `DynamoBackend`'s defaults (`X-Dynamo-Session-ID` "
            "per sibling, agent hints); without: `session_affinity=None` (agent hints only).",
            "",
            "| seed | run | results | prompt tokens | cached | prefill computed "
            "| requests per worker | makespan s |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Prefill with/without headers: **{', '.join(str(r) for r in ratios)}** "
            f"(median {ratios[len(ratios) // 2]}; goal <= 0.6); smallest worker share with "
            f"headers: **{shares:.0%}** (goal >= 25%).",
            "",
            "Why not 0.6x: with the headers every turn 2 is a full cache hit on the worker of "
            "its turn 1 (cached = the shared system prompt on all but the first sibling of each "
            "worker, plus each turn 2's whole turn-1 prompt), so that run is at the floor. "
            "Without them Dynamo's KV router is itself prefix-aware (it routes on KV events from "
            "the workers) and already sends most turn 2s to their cached prefix; only the ones "
            "its load balancing moves elsewhere recompute, about 7-8 of 64 here. The 0.6x goal "
            "comes from session-blind routers (vllm-router hashing a per-call id, sglang-router "
            "at random), where half the turn 2s miss. `X-Dynamo-Parent-Session-ID` (the fan_out "
            "run) is not sent by default: Dynamo binds child sessions to the parent's worker, "
            "which put all 128 requests on one worker (`DynamoBackend(parent_session=True)`).",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    """Run `measure` per seed and write `dynamo_w4.json` and `dynamo_w4.md` under `--out`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    results = [measure(n=args.n, seed=seed) for seed in args.seeds]
    seeds = " ".join(str(s) for s in args.seeds)
    command = f"python -m benchmarks.dynamo_w4 --n {args.n} --seeds {seeds}"
    text = json.dumps({"command": command, "runs": results}, indent=2)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "dynamo_w4.json").write_text(text + "\n")
        (args.out / "dynamo_w4.md").write_text(_markdown(results, command))


if __name__ == "__main__":
    main()
