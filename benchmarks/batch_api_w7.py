"""W7 through the providers' batch APIs vs the synchronous path, on the emulator: cost and order.

W7 (`langgraph_batch.bench.workloads`): tool-free single-turn extractions, a
shared 1,000-token instruction, a unique 1,500-token document, a 150-token
answer. One emulator (W7's profile and settings, `batch_delay_s` small) serves
every path, one after another, with the prefix cache emptied before each:

- `sync`: `fan_out(BatchedChatModel)`, the siblings' calls through the scheduler;
- `openai_batch`: `fan_out(..., executor=ProviderBatch(provider="openai"))`
  (files + `/v1/batches` through the `openai` SDK);
- `anthropic_batch`: the same through Anthropic Message Batches (`anthropic` SDK);
- `expiry`: the OpenAI path again with every 10th item expired by the
  emulator (`X-Emulator-Batch`), to count the typed errors.

Each path's cost comes from its own usage (`fan_out(cost_into=...)`), priced
by two tables of EXAMPLE prices (USD per million tokens, labelled with where
and when they were read; check the providers' pages before you rely on them):

- `list`: input 3.00, output 15.00, no cache discount, batch 50% off (the
  Claude Sonnet 4.5 list prices, https://docs.claude.com/en/docs/about-claude/pricing,
  read 2025-10): the same price per token on both paths, so the batch path
  costs exactly 0.5x whenever the token counts match;
- `openai_cached`: input 0.40, cached input 0.10, output 1.60, batch 50% off
  (gpt-4.1-mini, https://platform.openai.com/docs/pricing, read 2025-10): cache
  hits priced as measured on each path.

Makespans are emulated seconds of a batch that the emulator starts after
`batch_delay_s` (a real batch takes minutes to 24 hours): they show the
mechanics, not a provider's latency.

    python -m benchmarks.batch_api_w7 --n 1000 --out benchmarks/results/batch_api
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from benchmarks.extension import versions
from langgraph_batch import BatchedChatModel, fan_out
from langgraph_batch.batch_api import ProviderBatch
from langgraph_batch.bench.workloads import WORKLOADS, emulator_settings, system_prompt, task_text
from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess
from langgraph_batch.nodes.fan_out import SiblingError
from langgraph_batch.pricing import Pricing, TokenUsage

W7 = WORKLOADS["W7"]
SEED = 0
MODEL = "emulated-llama-3-8b"
TABLES = {
    "list": Pricing(input=3.0, output=15.0, batch_discount=0.5),
    "openai_cached": Pricing.openai(input=0.40, output=1.60, cached_input=0.10),
}


class State(TypedDict, total=False):
    items: list[int]
    out: list[Any]
    cost: dict[str, Any]


def graph(llm: BatchedChatModel, executor: Any, system: str) -> Any:
    b = StateGraph(State)
    b.add_node(
        "extract",
        fan_out(
            llm,
            items="items",
            into="out",
            make_input=lambda i, _: [("system", system), ("user", task_text(W7, i, SEED))],
            executor=executor,
            cost_into="cost",
        ),
    )
    b.add_edge(START, "extract")
    b.add_edge("extract", END)
    return b.compile()


def priced(usage: dict[str, Any], *, batch: bool) -> dict[str, float]:
    tokens = TokenUsage(**usage)
    return {name: p.cost(tokens, batch=batch).total for name, p in TABLES.items()}


async def run_path(name: str, url: str, n: int, system: str, **steer: Any) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        (await http.post(url + "/reset_prefix_cache")).raise_for_status()
    llm = BatchedChatModel(model=MODEL, base_url=url, max_tokens=W7.final_tokens)
    headers = {"X-Emulator-Batch": json.dumps(steer)} if steer else None
    executor: Any = None
    client: Any = None
    if name in ("openai_batch", "expiry"):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", default_headers=headers)
        executor = ProviderBatch(provider="openai", model=MODEL, client=client, poll_interval=0.25,
                                 params={"max_tokens": W7.final_tokens})  # fmt: skip
    elif name == "anthropic_batch":
        import anthropic

        client = anthropic.AsyncAnthropic(base_url=url, api_key="x", default_headers=headers)
        executor = ProviderBatch(
            provider="anthropic",
            model=MODEL,
            client=client,
            poll_interval=0.25,
            params={"max_tokens": W7.final_tokens},
        )
    t0 = time.monotonic()
    final = await graph(llm, executor, system).ainvoke({"items": list(range(n))})
    wall = time.monotonic() - t0
    if client is not None:
        await client.close()
    out = final["out"]
    errors: dict[str, int] = {}
    in_order = True
    for i, answer in enumerate(out):
        if isinstance(answer, SiblingError):
            errors[answer.error_type] = errors.get(answer.error_type, 0) + 1
        elif executor is not None and answer.response_metadata.get("custom_id") != f"s{i}":
            in_order = False
    usage = final["cost"]["usage"]
    return {
        "path": name,
        "n": n,
        "wall_s": wall,
        "results": len(out),
        "in_order": in_order,
        "errors": errors,
        "usage": usage,
        "cost_usd": priced(usage, batch=executor is not None),
    }


def markdown(result: dict[str, Any]) -> str:
    rows = result["paths"]
    sync = rows["sync"]
    lines = [
        f"### W7 through the provider batch APIs (N={result['n']}, EMULATED)",
        "",
        f"Command: `{result['command']}`",
        "",
        "| path | results | in order | errors | prompt tokens | cache reads | output tokens "
        "| list USD | vs sync | openai_cached USD | vs sync | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in rows.items():
        u, c = r["usage"], r["cost_usd"]
        errs = ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "0"
        lines.append(
            f"| {name} | {r['results']} | {r['in_order']} | {errs} | {u['input_tokens']} | "
            f"{u['cache_read']} | {u['output_tokens']} | {c['list']:.4f} | "
            f"{c['list'] / sync['cost_usd']['list']:.4f}x | {c['openai_cached']:.4f} | "
            f"{c['openai_cached'] / sync['cost_usd']['openai_cached']:.4f}x | {r['wall_s']:.1f} |"
        )
    lines += [
        "",
        "Prices are EXAMPLES (see the script's docstring for their sources and dates). With the "
        "`list` table (no cache discount) the batch path costs exactly 0.5x the synchronous one "
        "whenever the token counts match; with cached-input prices the ratio also moves by the "
        "difference in cache hits between the paths (the Anthropic path marks no "
        "`cache_control`, and Anthropic caches only at breakpoints: it reports no cache reads; "
        "the `expiry` row pays only for the items that ran). Wall seconds: a batch the "
        "emulator starts after `batch_delay_s`; a real provider takes minutes to 24 h.",
    ]
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    settings = emulator_settings(W7)
    cfg = EmulatorConfig(port=0, profile=W7.profile, time_scale=W7.time_scale * args.speed,
                         model=MODEL, batch_delay_s=0.5, **settings)  # fmt: skip
    system = system_prompt(W7, SEED)
    paths: dict[str, Any] = {}
    with EmulatorProcess(cfg) as emu:
        for name in ("sync", "openai_batch", "anthropic_batch"):
            paths[name] = await run_path(name, emu.url, args.n, system)
            print(name, json.dumps(paths[name]["cost_usd"]), f"{paths[name]['wall_s']:.1f} s")
        expire = [f"s{i}" for i in range(0, args.n, 10)]
        paths["expiry"] = await run_path("expiry", emu.url, args.n, system, expire=expire)
        print("expiry", paths["expiry"]["errors"])
    return {"n": args.n, "seed": SEED, "emulator": {"profile": W7.profile, **settings},
            "prices": {k: {f: getattr(p, f) for f in p.__slots__} for k, p in TABLES.items()},
            "paths": paths, "versions": versions()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=W7.n)
    parser.add_argument("--speed", type=float, default=10.0,
                        help="multiplies W7's time scale (the emulator runs faster)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/batch_api"))
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    result["command"] = f"python -m benchmarks.batch_api_w7 --n {args.n} --speed {args.speed:g}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "batch_api_w7.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "batch_api_w7.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
