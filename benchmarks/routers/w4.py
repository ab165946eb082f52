"""W4 through a router: session keys behind vllm-router and sglang-router (issue 19).

Many deployments put one router URL in front of the replicas, so the client
sees a single endpoint. This starts 4 emulator replicas, a real router in
front of them (`vllm-router` or `sglang-router`, from pip), and runs W4's
`langgraph-batch` contender (the same process and graph `bench W4` runs) at
the router's URL, once with the library's session key (the default) and once
without (`session_affinity=None`); it reports the prefill tokens the replicas
computed in each run. `measure_batching` runs a fan_out of tool-free two-turn
siblings (turn 1 is batchable) through a router with each batching rule.

```bash
python -m benchmarks.routers --n 64 --out benchmarks/results    # routers.json / routers.md
```

`RouterProcess` (`benchmarks/routers/process.py`, re-exported by the package) is
also what `tests/integration/test_routers.py` starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypedDict

import httpx

from benchmarks.routers.process import (
    ROUTERS,
    RouterProcess,
    router_unavailable,
)
from langgraph_batch.bench import collect
from langgraph_batch.bench.contenders._common import sum_stats
from langgraph_batch.bench.toolservice import tool_service
from langgraph_batch.bench.workloads import WORKLOADS, emulator_settings, make_job, tool_config

MODEL = "emulated-llama-3-8b"

__all__ = ("measure_batching", "measure_router", "run_with_kill")


@contextlib.contextmanager
def replicas(
    n: int, *, flavor: str = "vllm", time_scale: float = 20.0, seed: int = 0, **overrides: Any
) -> Iterator[list[Any]]:
    """`n` emulator processes with W4's scenario (3 turns); yields the `EmulatorProcess`es."""
    from langgraph_batch.emulator.config import EmulatorConfig
    from langgraph_batch.emulator.process import EmulatorProcess

    settings = {**emulator_settings(WORKLOADS["W4"]), **overrides}
    cfg = EmulatorConfig(
        port=0,
        flavor=flavor,  # type: ignore[arg-type]
        scenario="agent",
        time_scale=time_scale,
        model=MODEL,
        seed=seed,
        **settings,
    )
    procs = [EmulatorProcess(cfg) for _ in range(n)]
    with contextlib.ExitStack() as stack:
        for p in procs:
            stack.enter_context(p)
        yield procs


def replica_stats(urls: Sequence[str]) -> dict[str, Any]:
    """The counters of the replicas that answer, summed (a killed one counts as none)."""
    stats = []
    for url in urls:
        try:
            stats.append(collect.emulator_stats(url))
        except httpx.HTTPError:
            continue
    return sum_stats(stats) if stats else {}


def prefill(urls: Sequence[str]) -> int:
    """Prefill tokens the replicas computed since their last reset."""
    return int(replica_stats(urls).get("prefill_tokens_computed", 0))


def w4_job(
    router_url: str,
    replica_urls: Sequence[str],
    tool_url: str,
    *,
    n: int,
    seed: int = 0,
    flavor: str = "vllm",
    session: Any = "default",
) -> dict[str, Any]:
    """W4's `langgraph-batch` job with the model pointed at the router.

    `session`: `"default"` (the library's), None (no key) or a `SessionConfig`
    field dict.
    """
    job = make_job(
        WORKLOADS["W4"],
        n=n,
        seed=seed,
        llm_url=list(replica_urls),
        tool_url=tool_url,
        model=MODEL,
        contender="langgraph-batch",
    )
    job["lgb_url"] = f"{flavor}://{router_url.split('://', 1)[1]}"
    job["flavor"] = flavor
    if session != "default":
        job["lgb_options"] = {"session_affinity": session}
    return job


def run_w4(
    job: dict[str, Any], replica_urls: Sequence[str], *, timeout: float = 600.0
) -> dict[str, Any]:
    """Run the job's contender process; its failures, makespan and prefill on the replicas."""
    from langgraph_batch.bench.harness import run_contender

    for url in replica_urls:
        collect.reset_emulator(url)
    client, error, _ = run_contender("langgraph-batch", job, timeout=timeout)
    if client is None:
        raise RuntimeError(f"the contender failed: {error}")
    base = client.get("baseline_emulator") or {}
    after = replica_stats(replica_urls)
    per_replica = after.get("per_replica_requests")
    return {
        "failures": client["failures"],
        "errors": client.get("errors"),
        "makespan_s": client["makespan_s"],
        "client_cpu_s": client["client_cpu_s"],
        "prefill_tokens": int(after["prefill_tokens_computed"])
        - int(base.get("prefill_tokens_computed", 0)),
        "requests": int(after["requests"]) - int(base.get("requests", 0)),
        "requests_per_replica": per_replica,
    }


def measure_router(
    kind: str,
    policy: str,
    *,
    n: int,
    seed: int = 0,
    time_scale: float = 20.0,
    with_pool: bool = True,
) -> dict[str, Any]:
    """W4 through `kind`/`policy` over 4 replicas, with and without the session key.

    `with_pool`: also run it straight at the replicas (the library's affinity pool).
    """
    flavor = "sglang" if kind == "sglang-router" else "vllm"
    wl = WORKLOADS["W4"]
    out: dict[str, Any] = {"router": kind, "policy": policy, "n": n, "flavor": flavor}
    with (
        replicas(4, flavor=flavor, time_scale=time_scale, seed=seed) as procs,
        tool_service(tool_config(wl, time_scale, seed)) as tool_url,
    ):
        urls = [p.url for p in procs]
        with RouterProcess(kind, policy, urls) as router:
            for label, session in (("with_key", "default"), ("without_key", None)):
                collect.reset_tools(tool_url)
                job = w4_job(router.url, urls, tool_url, n=n, seed=seed, flavor=flavor,
                             session=session)  # fmt: skip
                out[label] = run_w4(job, urls)
        if with_pool:  # the same run straight at the replicas (the library's own pool)
            collect.reset_tools(tool_url)
            direct = w4_job(urls[0], urls, tool_url, n=n, seed=seed, flavor=flavor)
            direct["lgb_url"] = f"{flavor}://" + ",".join(u.split("://", 1)[1] for u in urls)
            out["pool_affinity"] = run_w4(direct, urls)
    with_key = out["with_key"]["prefill_tokens"]
    without = out["without_key"]["prefill_tokens"]
    out["ratio_with_over_without"] = round(with_key / max(1, without), 3)
    if with_pool:
        pool = out["pool_affinity"]["prefill_tokens"]
        out["ratio_with_over_pool"] = round(with_key / max(1, pool), 3)
    return out


def run_with_kill(
    kind: str, policy: str, *, n: int, seed: int = 0, time_scale: float = 4.0
) -> dict[str, Any]:
    """W4 through `kind`/`policy`; one of the 4 replicas is killed (SIGKILL) mid-run.

    Returns the run's figures plus `killed_after_requests`: how many requests the
    replicas had served when the kill came.
    """
    flavor = "sglang" if kind == "sglang-router" else "vllm"
    wl = WORKLOADS["W4"]
    with (
        replicas(4, flavor=flavor, time_scale=time_scale, seed=seed) as procs,
        tool_service(tool_config(wl, time_scale, seed)) as tool_url,
        RouterProcess(kind, policy, [p.url for p in procs]) as router,
    ):
        urls = [p.url for p in procs]
        job = w4_job(router.url, urls, tool_url, n=n, seed=seed, flavor=flavor)
        result: dict[str, Any] = {"killed_mid_run": False}
        runner = threading.Thread(target=lambda: result.update(run_w4(job, urls)), daemon=True)
        runner.start()
        victim = procs[1]
        served = 0
        deadline = time.monotonic() + 120
        while runner.is_alive() and time.monotonic() < deadline:
            served = int(replica_stats(urls).get("finished", 0))
            if served >= n + 1:  # the warm-up sibling, then about one turn of the run
                victim.kill()
                result["killed_mid_run"] = runner.is_alive()
                break
            time.sleep(0.05)
        runner.join(600)
        if "failures" not in result:
            raise RuntimeError(f"the run did not finish; router output:\n{router.output[-3000:]}")
        result["killed_after_requests"] = served
        return result


# ---------------------------------------------------------------------------- batching rules


class _Sibling(TypedDict, total=False):
    i: int
    answer: str


class _Parent(TypedDict, total=False):
    items: list[int]
    out: list[Any]


async def _refine_run(base_url: str, n: int, session: Any, *, max_batch_size: int) -> float:
    """A fan_out of `n` tool-free two-turn siblings (answer, then refine); client CPU s."""
    from langchain_core.messages import HumanMessage, SystemMessage
    from langgraph.graph import END, START, StateGraph

    from langgraph_batch import BatchedChatModel, BatchPolicy, fan_out
    from langgraph_batch.backends import SessionConfig
    from langgraph_batch.bench.workloads import sized

    options: dict[str, Any] = {}
    if session != "default":
        options["session_affinity"] = None if session is None else SessionConfig(**session)
    llm = BatchedChatModel(
        model=MODEL,
        base_url=base_url,
        max_tokens=64,
        temperature=0.0,
        policy=BatchPolicy(max_batch_size=max_batch_size, inflight_limit=256),
        **options,
    )
    system = sized("You summarise documents. Notes follow.", 1000, random.Random("sys"))

    async def refine(state: _Sibling) -> dict[str, Any]:
        task = sized(f"Document {state['i']}:", 1500, random.Random(f"doc{state['i']}"))
        first = [SystemMessage(system), HumanMessage(task)]
        answer = await llm.ainvoke(first)
        final = await llm.ainvoke([*first, answer, HumanMessage("Refine your summary.")])
        return {"answer": str(final.content)}

    sub = StateGraph(_Sibling)
    sub.add_node("refine", refine)
    sub.add_edge(START, "refine")
    sub.add_edge("refine", END)
    agent = sub.compile()
    parent = StateGraph(_Parent)
    parent.add_node(
        "all",
        fan_out(agent, items="items", into="out", make_input=lambda item, i: {"i": item}),
    )
    parent.add_edge(START, "all")
    parent.add_edge("all", END)
    graph = parent.compile()
    cpu0 = time.process_time()
    await graph.ainvoke({"items": list(range(n))})
    cpu = time.process_time() - cpu0
    await llm.get_scheduler().aclose()
    return cpu


def measure_batching(*, n: int = 64, time_scale: float = 20.0) -> dict[str, Any]:
    """Tool-free two-turn siblings through vllm-router (consistent_hash) per batching rule."""
    out: dict[str, Any] = {"router": "vllm-router", "policy": "consistent_hash", "n": n}
    rules: dict[str, tuple[Any, int]] = {
        "mixed": ({"batching": "mixed"}, 64),
        "per_session": ({"batching": "per_session"}, 64),
        "auto (default)": ("default", 64),
        "no batching": ("default", 1),
        "no key": (None, 64),
    }
    with replicas(4, time_scale=time_scale, turns=1, output_tokens=64) as procs:
        urls = [p.url for p in procs]
        with RouterProcess("vllm-router", "consistent_hash", urls) as router:
            for label, (session, size) in rules.items():
                for u in urls:
                    collect.reset_emulator(u)
                url = f"vllm://{router.address}"
                cpu = asyncio.run(_refine_run(url, n, session, max_batch_size=size))
                stats = sum_stats([collect.emulator_stats(u) for u in urls])
                out[label] = {
                    "prefill_tokens": int(stats["prefill_tokens_computed"]),
                    "requests": int(stats["requests"]),
                    "client_cpu_s": round(cpu, 3),
                }
    return out


def _markdown(results: dict[str, Any]) -> str:
    lines = [
        "### W4 through a router: prefill with and without the session key",
        "",
        f"4 emulated replicas (EMULATED, not a GPU), N={results['n']}, 3 turns; "
        "prefill tokens the replicas computed.",
        "",
        "| router | policy | with key | without key | with / without | pool (no router) | "
        "with / pool | failures |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["routers"]:
        fails = r["with_key"]["failures"] + r["without_key"]["failures"]
        lines.append(
            f"| {r['router']} | {r['policy']} | {r['with_key']['prefill_tokens']:,} | "
            f"{r['without_key']['prefill_tokens']:,} | {r['ratio_with_over_without']:.2f} | "
            f"{r['pool_affinity']['prefill_tokens']:,} | {r['ratio_with_over_pool']:.2f} | "
            f"{fails} |"
        )
    b = results.get("batching")
    if b:
        lines += [
            "",
            f"### Batching rules through {b['router']} ({b['policy']}): N={b['n']} tool-free "
            "two-turn siblings (turn 1 batchable)",
            "",
            "| rule | prefill tokens | requests | client CPU s |",
            "| --- | --- | --- | --- |",
        ]
        for label, v in b.items():
            if isinstance(v, dict):
                lines.append(
                    f"| {label} | {v['prefill_tokens']:,} | {v['requests']} | {v['client_cpu_s']} |"
                )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.routers", description=__doc__)
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--time-scale", type=float, default=20.0)
    p.add_argument(
        "--routers", default=",".join(f"{k}:{v}" for k, vs in ROUTERS.items() for v in vs)
    )
    p.add_argument("--no-batching", action="store_true", help="skip measure_batching")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    results: dict[str, Any] = {"n": args.n, "time_scale": args.time_scale, "routers": []}
    for spec in args.routers.split(","):
        kind, policy = spec.split(":")
        reason = router_unavailable(kind)
        if reason:
            print(f"skipping {kind}: {reason}", file=sys.stderr)
            continue
        r = measure_router(kind, policy, n=args.n, time_scale=args.time_scale)
        print(json.dumps({k: v for k, v in r.items() if not isinstance(v, dict)}), file=sys.stderr)
        results["routers"].append(r)
    if not args.no_batching and router_unavailable("vllm-router") is None:
        results["batching"] = measure_batching(n=args.n, time_scale=args.time_scale)
    from importlib import metadata

    from benchmarks.extension import versions

    results["versions"] = versions()
    for package in ("vllm-router", "sglang-router"):
        try:
            results["versions"][package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            results["versions"][package] = None
    text = _markdown(results)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "routers.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "routers.md").write_text(text)


if __name__ == "__main__":  # `python -m benchmarks.routers` runs `__main__.py`
    main()
