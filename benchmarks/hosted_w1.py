"""W1's shape against the hosted Anthropic flavour of the emulator: prompt caching, cost, makespan.

50 agents share a ~2k-token system prompt and one tool; each makes a tool call
(an 800 ms tool) and then answers: 2 model calls per agent, as in W1. Three
contenders, all `ChatAnthropic` (langchain-anthropic, unmodified) against the
emulator's `POST /v1/messages` (`hosted="anthropic"`, Anthropic's caching
rules and a hosted latency model, EMULATED):

- `naive`: `asyncio.gather` of the agents calling `ChatAnthropic` directly,
  no cache hints (nothing is cached: Anthropic caches only marked prefixes).
- `naive-cached`: the same with the top-level `cache_control` kwarg (automatic
  caching of the last block): every turn-1 call is sent before the first one's
  entry exists, so they all write the shared prefix.
- `langgraph-batch`: the agents call `BatchedChatModel(backend=LangChainBackend(
  ChatAnthropic))`: breakpoints on the shared prefix and the last message, and
  prefix warming (the first call's answer begins before its siblings go).

Cost is computed with Anthropic's published multipliers (prompt caching page:
cache read 0.1x, 5m write 1.25x, 1h write 2x base input) and output at 5x the
input price (Sonnet's $3/$15 per million); the `cost` branch prices it properly.

Usage:
    python -m benchmarks.hosted_w1 [--agents 50] [--time-scale 0.25] [--repeats 3] [--turns 2]

A time scale below 1 stretches the emulated seconds over more wall time, so that
the client's own CPU (50 agents through LangChain on a shared machine) weighs
less in the makespan; makespans are reported in emulated seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from langgraph_batch import BatchedChatModel
from langgraph_batch.backends import LangChainBackend
from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess
from langgraph_batch.emulator._anthropic_cache import READ_MULTIPLIER, WRITE_MULTIPLIER
from langgraph_batch.emulator.tokenizer import count_tokens

MODEL = "claude-sonnet-5"
CONTENDERS = ("naive", "naive-cached", "langgraph-batch")
OUTPUT_PRICE = 5.0
"""Output tokens in base-input-token units (Sonnet: $15 / $3 per million)."""
TOOL_S = 0.8
RESULTS = Path(__file__).parent / "results" / "hosted"
_WORDS = ("agent", "review", "policy", "data", "answer", "source", "check", "plan", "step")


def system_prompt(tokens: int = 2048, seed: int = 1) -> str:
    """Instructions of `tokens` emulator tokens (words of at most four letters are one)."""
    rng = random.Random(seed)
    text = "You are a research agent."
    while count_tokens(text) < tokens:
        text += " " + rng.choice(_WORDS)
    return text


def _tool(time_scale: float) -> Any:
    @tool
    async def lookup(q: str) -> str:
        """Look a key up in the knowledge base."""
        await asyncio.sleep(TOOL_S / time_scale)
        return f"value of {q}: 42"

    return lookup


async def _agent(model: BaseChatModel, i: int, system: str, lookup: Any, kwargs: Any) -> dict:
    bound = model.bind_tools([lookup])
    messages: list[BaseMessage] = [
        SystemMessage(system),
        HumanMessage(f"Find key=k{i} and report."),
    ]
    usage: list[dict] = []
    for _ in range(16):
        reply = await bound.ainvoke(messages, **kwargs)
        assert isinstance(reply, AIMessage)
        usage.append(dict(reply.usage_metadata or {}))
        messages.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            out = await lookup.ainvoke(call["args"])
            messages.append(ToolMessage(out, tool_call_id=call["id"]))
    return {"calls": len(usage), "usage": usage}


def _anthropic(url: str) -> ChatAnthropic:
    return ChatAnthropic(model=MODEL, base_url=url, api_key="emulated", max_retries=0)


async def run(contender: str, url: str, agents: int, time_scale: float) -> dict[str, Any]:
    """One contender's run: makespan (emulated seconds) and the server's token totals."""
    async with httpx.AsyncClient(base_url=url) as client:
        (await client.post("/emulator/reset")).raise_for_status()
    system = system_prompt()
    lookup = _tool(time_scale)
    kwargs: dict[str, Any] = {}
    model: BaseChatModel = _anthropic(url)
    if contender == "naive-cached":
        kwargs["cache_control"] = {"type": "ephemeral"}
    elif contender == "langgraph-batch":
        model = BatchedChatModel(
            model=MODEL,
            backend=LangChainBackend(
                _anthropic(url), key=f"hosted-w1-{time.monotonic_ns()}", isolate_loop=False
            ),
            max_inflight=max(64, agents),
        )
    t0 = time.perf_counter()
    results = await asyncio.gather(
        *(_agent(model, i, system, lookup, kwargs) for i in range(agents))
    )
    makespan = (time.perf_counter() - t0) * time_scale
    async with httpx.AsyncClient(base_url=url) as client:
        totals = (await client.get("/emulator/hosted")).json()
    details = [u.get("input_token_details") or {} for r in results for u in r["usage"]]
    prompt = totals["input_tokens"] + totals["cache_read_input_tokens"]
    prompt += totals["cache_creation_input_tokens"]
    input_cost = (
        totals["input_tokens"]
        + READ_MULTIPLIER * totals["cache_read_input_tokens"]
        + WRITE_MULTIPLIER["5m"] * totals["ephemeral_5m_input_tokens"]
        + WRITE_MULTIPLIER["1h"] * totals["ephemeral_1h_input_tokens"]
    )
    return {
        "contender": contender,
        "agents": agents,
        "calls": sum(r["calls"] for r in results),
        "makespan_s": round(makespan, 3),
        "prompt_tokens": prompt,
        "cache_read_share": round(totals["cache_read_input_tokens"] / prompt, 4),
        "server_totals": totals,
        "client_cache_read": sum(int(d.get("cache_read") or 0) for d in details),
        "client_cache_creation": sum(_created(d) for d in details),
        "input_cost_units": round(input_cost, 1),
        "total_cost_units": round(input_cost + OUTPUT_PRICE * totals["output_tokens"], 1),
    }


def _created(details: dict[str, Any]) -> int:
    """Cache writes of one call (langchain-anthropic zeroes `cache_creation` beside its split)."""
    split = sum(
        int(details.get(k) or 0) for k in ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")
    )
    return max(int(details.get("cache_creation") or 0), split)


async def _main(agents: int, time_scale: float, repeats: int, turns: int) -> list[dict[str, Any]]:
    cfg = EmulatorConfig(port=0, hosted="anthropic", time_scale=time_scale, turns=turns)
    rows: list[dict[str, Any]] = []
    with EmulatorProcess(cfg) as emu:
        for _ in range(repeats):
            for contender in CONTENDERS:
                row = await run(contender, emu.url, agents, time_scale)
                rows.append(row)
    return rows


def _summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by.setdefault(row["contender"], []).append(row)

    def mean(name: str, field: str) -> float:
        vals = [r[field] for r in by[name]]
        return sum(vals) / len(vals)

    base_ms, base_in, base_tot = (
        mean("naive", k) for k in ("makespan_s", "input_cost_units", "total_cost_units")
    )
    return {
        name: {
            "makespan_s": round(mean(name, "makespan_s"), 3),
            "makespan_vs_naive": round(mean(name, "makespan_s") / base_ms, 3),
            "cache_read_share": round(mean(name, "cache_read_share"), 4),
            "input_cost_vs_naive": round(mean(name, "input_cost_units") / base_in, 3),
            "total_cost_vs_naive": round(mean(name, "total_cost_units") / base_tot, 3),
        }
        for name in by
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the contenders, print a summary, write `benchmarks/results/hosted/`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--turns", type=int, default=2, help="model calls per agent (W1: 2)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = asyncio.run(_main(args.agents, args.time_scale, args.repeats, args.turns))
    summary = _summary(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {
        "workload": "W1 shape, hosted Anthropic flavour (EMULATED)",
        "agents": args.agents,
        "time_scale": args.time_scale,
        "turns": args.turns,
        "summary": summary,
        "runs": rows,
    }
    name = "hosted_w1.json" if args.turns == 2 else f"hosted_w1_turns{args.turns}.json"
    (args.out / name).write_text(json.dumps(payload, indent=2) + "\n")
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
