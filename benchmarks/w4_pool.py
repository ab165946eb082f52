"""W4: 4 emulated replicas, N siblings x 3 turns; cache-affinity routing vs round robin.

Standalone (the main harness runs one emulator per workload). Starts 4
emulator processes, then runs, one after another against the same replicas
(counters and prefix caches reset in between):

- `lgb-affinity`: `fan_out` + `BatchedChatModel` on an `EndpointPool`
  (`backend_from_url("vllm://a,b,c,d", routing="affinity")`);
- `lgb-round-robin`: the same with `routing="round_robin"`;
- `naive-round-robin`: LangGraph `Send` map-reduce with `ChatOpenAI`, each
  call sent to the next of the 4 URLs (a round-robin balancer).

Each sibling has a unique ~1500-token document and asks 3 turns, its
conversation growing each turn. Prints and writes JSON with the makespan and
the prefill tokens computed (summed over the replicas' `/emulator/stats`).

Usage:
    python -m benchmarks.w4_pool --n 400 --time-scale 20 --out bench-results/W4.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import operator
import random
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any, TypedDict

import httpx

MODEL = "emulated-llama-3-8b"
TURNS = 3
CONTENDERS = ("lgb-affinity", "lgb-round-robin", "naive-round-robin")


def log(msg: str) -> None:
    """A progress line on stderr."""
    sys.stderr.write(f"[w4 {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def document(index: int, words: int) -> str:
    """A unique document of about `words` tokens for sibling `index`."""
    rng = random.Random(index)
    body = " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=4)) for _ in range(words))
    return f"Document {index}: {body}"


def first_messages(index: int, words: int) -> list[dict[str, str]]:
    """The opening conversation of sibling `index`."""
    return [
        {"role": "system", "content": "You are a careful analyst. Answer briefly."},
        {"role": "user", "content": document(index, words) + "\nSummarise part 1."},
    ]


class AgentState(TypedDict, total=False):
    """One sibling: its conversation and its final answer."""

    messages: list[Any]
    answer: str


class FanOutParent(TypedDict, total=False):
    """Parent state of the fan_out contenders."""

    tasks: list[int]
    results: list[Any]


class SendParent(TypedDict, total=False):
    """Parent state of the Send map-reduce contender (results appended)."""

    tasks: list[int]
    results: Annotated[list[Any], operator.add]


def build_agent(llm: Any) -> Any:
    """A 3-turn conversation as a LangGraph subgraph (one node loops over the turns)."""
    from langchain_core.messages import HumanMessage
    from langgraph.graph import END, START, StateGraph

    async def talk(state: AgentState) -> AgentState:
        messages = list(state["messages"])
        answer = ""
        for turn in range(TURNS):
            reply = await llm.ainvoke(messages)
            answer = str(reply.content)
            messages.append(reply)
            if turn < TURNS - 1:
                messages.append(HumanMessage(f"Now summarise part {turn + 2}."))
        return {"messages": messages, "answer": answer}

    g = StateGraph(AgentState)
    g.add_node("talk", talk)
    g.add_edge(START, "talk")
    g.add_edge("talk", END)
    return g.compile()


async def run_lgb(
    urls: list[str], routing: str, n: int, words: int, max_tokens: int, max_inflight: int | None
) -> None:
    """fan_out + BatchedChatModel over an EndpointPool with `routing`."""
    from langgraph.graph import END, START, StateGraph

    from langgraph_batch.backends import backend_from_url
    from langgraph_batch.chat_model import BatchedChatModel
    from langgraph_batch.nodes.fan_out import SiblingError, fan_out

    hosts = ",".join(u.split("://", 1)[1] for u in urls)
    pool = backend_from_url(f"vllm://{hosts}", routing=routing, timeout=600.0)
    options: dict[str, Any] = {} if max_inflight is None else {"max_inflight": max_inflight}
    llm = BatchedChatModel(  # type: ignore[call-arg]  # pydantic fields, seen by mypy as aliases
        model=MODEL, backend=pool, temperature=0.0, max_tokens=max_tokens, **options
    )

    g = StateGraph(FanOutParent)
    g.add_node(
        "agents",
        fan_out(
            build_agent(llm),
            items="tasks",
            into="results",
            make_input=lambda item, i: {"messages": first_messages(item, words)},
            result=lambda state: state.get("answer"),
        ),
    )
    g.add_edge(START, "agents")
    g.add_edge("agents", END)
    try:
        out = await g.compile().ainvoke({"tasks": list(range(n))}, {"recursion_limit": 10_000})
    finally:
        await llm.get_scheduler().aclose()
        await pool.aclose()
    failed = [r for r in out.get("results") or [] if isinstance(r, SiblingError)]
    if failed:
        raise RuntimeError(f"{len(failed)} siblings failed, e.g. {failed[0]!r}")


async def run_naive(urls: list[str], n: int, words: int, max_tokens: int) -> None:
    """Send map-reduce with ChatOpenAI; each call goes to the next URL (round robin)."""
    from langchain_core.runnables import RunnableLambda
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send

    llms = [
        ChatOpenAI(
            model=MODEL,
            base_url=f"{u}/v1",
            api_key="x",  # type: ignore[arg-type]
            temperature=0.0,
            max_tokens=max_tokens,  # type: ignore[call-arg]
            timeout=600.0,
            max_retries=2,
        )
        for u in urls
    ]
    counter = itertools.count()

    async def balanced(messages: Any) -> Any:
        return await llms[next(counter) % len(llms)].ainvoke(messages)

    agent = build_agent(RunnableLambda(balanced))

    async def run_one(state: Any) -> dict[str, Any]:
        out = await agent.ainvoke({"messages": first_messages(state["index"], words)})
        return {"results": [out.get("answer")]}

    g = StateGraph(SendParent)
    g.add_node("agent", run_one)
    g.add_conditional_edges(
        START, lambda s: [Send("agent", {"index": i}) for i in s["tasks"]], ["agent"]
    )
    g.add_edge("agent", END)
    await g.compile().ainvoke({"tasks": list(range(n)), "results": []}, {"recursion_limit": 10_000})


async def server_stats(client: httpx.AsyncClient, urls: list[str]) -> dict[str, Any]:
    """Counters summed over the replicas, plus the per-replica request counts."""
    stats = [(await client.get(f"{u}/emulator/stats")).raise_for_status().json() for u in urls]
    keys = ("requests", "prompt_tokens_received", "prefill_tokens_computed", "cached_tokens")
    out: dict[str, Any] = {k: sum(int(s[k]) for s in stats) for k in keys}
    out["evictions"] = sum(int(s.get("evictions") or 0) for s in stats)
    out["preemptions"] = sum(int(s.get("preemptions") or 0) for s in stats)
    out["requests_per_replica"] = [int(s["requests"]) for s in stats]
    out["max_lag_s"] = max(float(s.get("max_lag_s") or 0.0) for s in stats)
    return out


async def bench(urls: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Run every contender once against the replicas; reset them in between."""
    results: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=60.0) as client:
        for name in args.contenders:
            for u in urls:
                (await client.post(f"{u}/emulator/reset")).raise_for_status()
            log(f"{name}: {args.n} siblings x {TURNS} turns on {len(urls)} replicas")
            t0 = time.monotonic()
            if name == "naive-round-robin":
                await run_naive(urls, args.n, args.words, args.max_tokens)
            else:
                routing = "affinity" if name == "lgb-affinity" else "round_robin"
                await run_lgb(urls, routing, args.n, args.words, args.max_tokens, args.max_inflight)
            makespan = time.monotonic() - t0
            results[name] = {"makespan_s": round(makespan, 3), **await server_stats(client, urls)}
            log(f"{name}: {json.dumps(results[name])}")
    return results


def main(argv: list[str] | None = None) -> int:
    """Start the replicas, run the contenders, print and write the JSON."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.w4_pool", description=__doc__)
    p.add_argument("--n", type=int, default=400, help="siblings (default 400)")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--words", type=int, default=1500, help="document tokens per sibling")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--time-scale", type=float, default=20.0, help="emulator speed-up")
    p.add_argument("--profile", default="h100-llama3-8b")
    p.add_argument("--kv-tokens", type=int, default=None, help="KV capacity per replica")
    p.add_argument(
        "--max-inflight", type=int, default=None, help="BatchedChatModel max_inflight (default)"
    )
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--out", type=Path, default=Path("bench-results/W4.json"))
    args = p.parse_args(argv)
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = set(args.contenders) - set(CONTENDERS)
    if unknown:
        p.error(f"unknown contenders {sorted(unknown)}; choose from {', '.join(CONTENDERS)}")

    from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess

    config = {
        "port": 0,
        "profile": args.profile,
        "time_scale": args.time_scale,
        "kv_tokens": args.kv_tokens,
        "output_tokens": args.max_tokens,
    }
    with ExitStack() as stack:
        urls = [
            stack.enter_context(EmulatorProcess(EmulatorConfig(**config))).url
            for _ in range(args.replicas)
        ]
        log(f"replicas up: {', '.join(urls)}")
        results = asyncio.run(bench(urls, args))
    report: dict[str, Any] = {
        "workload": "W4",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "results": results,
    }
    base = results.get("lgb-round-robin") or results.get("naive-round-robin")
    aff = results.get("lgb-affinity")
    if aff and base and base["prefill_tokens_computed"]:
        report["prefill_ratio_affinity_vs_round_robin"] = round(
            aff["prefill_tokens_computed"] / base["prefill_tokens_computed"], 3
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
