"""The long-horizon workloads W8-W11 and W8o: agents whose contexts grow over many turns.

- W8: long-horizon agents (64 agents of 6-24 turns), contexts ~2.8x the KV cache.
- W9: agents in a simulation loop (64 agents, 40 ticks).
- W10: a heavy tool tail: 96 agents of 8-20 turns, one tool call in ten taking 10-30 s,
  a 440k-token KV cache.
- W11: long agents with fast tools: 48 agents of 10-30 turns, small results of tools
  that answer within half a second; the KV cache does not bind.
- W8o: W8 on a server with a second KV tier in host memory (vLLM's native CPU
  offload, `--kv-offloading-size 64`).

Each is justified in its comments from the published agent-trace statistics that
WORKLOADS.md lists (Continuum, arXiv 2511.02230; SemiAnalysis AgentX via vLLM issue
#57103; vllm-project/router issue #285; LMCache's agentic traces). `workloads.py`
registers them: it passes its `Workload` class, so this module imports nothing from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ("LONG_HORIZON_BOUNDED", "W8O_OFFLOAD_GIB", "long_horizon_workloads")

LONG_HORIZON_BOUNDED = tuple(f"naive-bounded-{k}" for k in (8, 16, 24, 32, 48))
"""W8/W9's sweep of plain LangGraph's `max_concurrency`: the report keeps the best,
what a careful user tunes by hand."""


W8O_OFFLOAD_GIB = 64.0
"""W8o's second KV tier: `--kv-offloading-size 64` (GiB of host memory). On the H100
profile (128 KiB of KV a token) that is 524,288 tokens, ~1.1x the GPU cache: a modest
share of an 8-GPU H100 server's host memory (1-2 TiB), so the tier holds the paused
contexts of a W8 run only in part (its contexts reach ~2.8x the GPU cache)."""


def long_horizon_workloads(workload: Callable[..., Any]) -> dict[str, Any]:
    """W8-W11 and W8o, built with `workload` (the `Workload` class of `workloads.py`)."""
    shapes = _long_horizon_shapes(workload)
    shapes["W8o"] = dataclasses.replace(
        shapes["W8"],
        id="W8o",
        description=(
            "W8 on a server with a second KV tier: 64 agents of 6-24 turns, contexts ~2.8x "
            "the KV cache, plus 64 GiB of host memory for vLLM's native CPU offload"
        ),
        kv_offloading_size=W8O_OFFLOAD_GIB,
    )
    return shapes


def _long_horizon_shapes(workload: Callable[..., Any]) -> dict[str, Any]:
    """W8, W9, W10 and W11."""
    return {
        "W8": workload(
            id="W8",
            description=(
                "Long-horizon agents: N=64, 6-24 turns each, 3k-token shared prompt, 1k-token "
                "task, 300-3,000-token tool results, long-tailed tools, contexts outgrow the KV "
                "cache"
            ),
            # Tens of agents (a repository's 50 issues, a few dozen files to fix): at their
            # final sizes (~20k own tokens each on average) 64 contexts need ~2.8x the KV
            # cache, while any ~20 of them fit together.
            n=64,
            turns=24,
            # Model calls per agent: SWE-bench ~11, BFCL ~6 (Continuum), coding agents a
            # median of 43 (AgentX): 6-24 brackets the first two and reaches toward the third.
            turns_range=(6, 24),
            # A coding agent's system prompt and tool schemas: a few thousand tokens, shared.
            system_tokens=3000,
            # An issue description.
            task_tokens=1000,
            final_tokens=200,
            # A line of reasoning before each tool call.
            think_tokens=(20, 200),
            # 86% of an agent's next request within 1 s, 95% within 10 s (vllm-project/router
            # #285): most tools under a second, one in ten up to 10 s, one in twenty 10-30 s.
            tool_latency_mix=((0.86, 0.2, 1.0), (0.09, 1.0, 10.0), (0.05, 10.0, 30.0)),
            # File reads, test logs, search results: 300-3,000 tokens, log-uniform (median ~950).
            tool_result_tokens_range=(300, 3000),
            # Every agent works on its own task, and its arguments change every turn.
            distinct_keys=None,
            tool_concurrency=64,
            # The measured H100 + vLLM 0.26 + Llama-3-8B cache (463,312 tokens), serving a
            # Llama-3.1-8B-sized model with its 128k context (the longest agents pass 32k).
            kv_tokens=None,
            max_model_len=131_072,
            structured=False,
            time_scale=4.0,
            system_head=(
                "You are a software engineering agent. Work on the task step by step: read files, "
                "run tests and search with the web_search tool, one call per turn, then report. "
                "Repository notes follow."
            ),
            task_head="Task {index}: fix the issue key={key}. Issue text:",
            contenders=("naive", *LONG_HORIZON_BOUNDED, "langgraph-batch", "ideal"),
        ),
        "W9": workload(
            id="W9",
            description=(
                "Agents in a simulation loop: N=64 agents, 40 ticks, memories growing ~350 "
                "tokens a tick (outgrowing the KV cache by tick ~18), a world update between ticks"
            ),
            # A tick-based multi-agent simulation (generative agents, a market, a game):
            # every agent decides each tick from its own growing memory; all calls of a
            # tick arrive together; the world updates between ticks.
            n=64,
            turns=1,
            ticks=40,
            # The world's rules, shared.
            system_tokens=1500,
            # Each agent's persona and goal.
            task_tokens=500,
            # An action: a short decision.
            final_tokens=60,
            # What the agent sees each tick.
            observation_tokens=(200, 400),
            # The world model's update (physics, other systems) between ticks.
            world_latency_s=0.5,
            tools=False,
            structured=False,
            distinct_keys=None,
            kv_tokens=None,
            time_scale=4.0,
            system_head=(
                "You are one agent in a simulated town. Each tick you read what you observe and "
                "answer with your next action in one short sentence. World rules follow."
            ),
            task_head="Agent {index} (id key={key}): your persona and goals:",
            contenders=("naive", *LONG_HORIZON_BOUNDED, "langgraph-batch", "ideal"),
        ),
        **_public_shapes(workload),
    }


_CODING_SYSTEM_HEAD = (
    "You are a software engineering agent. Work on the task step by step: read files, "
    "run tests and search with the web_search tool, one call per turn, then report. "
    "Repository notes follow."
)
_CODING_TASK_HEAD = "Task {index}: fix the issue key={key}. Issue text:"

W10_KV_TOKENS = 440_000
"""W10's KV cache (tokens): what the user measured the heavy tool tail on, a little below
the measured H100 + vLLM 0.26 + Llama-3-8B cache (463,312 tokens)."""


def _public_shapes(workload: Callable[..., Any]) -> dict[str, Any]:
    """W10 and W11: the two shapes users measured beside W8 (issue 25, item 5)."""
    return {
        "W10": workload(
            id="W10",
            description=(
                "A heavy tool tail: N=96 agents of 8-20 turns, 3k-token shared prompt, 1k-token "
                "task, 300-3,000-token tool results, 1 tool call in 10 taking 10-30 s, KV 440k"
            ),
            # A user's job (issue 25): 96 agents, each on its own task.
            n=96,
            turns=20,
            # 8-20 model calls: around SWE-bench's ~11 (Continuum) and LMCache's agentic
            # traces (~32 calls per session) at its lower half; the user's own range.
            turns_range=(8, 20),
            system_tokens=3000,
            task_tokens=1000,
            final_tokens=200,
            think_tokens=(20, 200),
            # The tail: vllm-project/router #285 has 86% of next requests within 1 s and
            # 95% within 10 s. Here 80% of tools answer within 1 s, 10% in 1-10 s and 10%
            # in 10-30 s (test suites, builds, page fetches): twice W8's share past 10 s,
            # as the user measured.
            tool_latency_mix=((0.80, 0.2, 1.0), (0.10, 1.0, 10.0), (0.10, 10.0, 30.0)),
            tool_result_tokens_range=(300, 3000),
            # Arguments change every turn (a sibling's n-th call is `<key>.<n>`): no two
            # calls share a result, so coalescing does not apply.
            distinct_keys=None,
            tool_concurrency=96,
            kv_tokens=W10_KV_TOKENS,
            max_model_len=131_072,
            structured=False,
            time_scale=4.0,
            system_head=_CODING_SYSTEM_HEAD,
            task_head=_CODING_TASK_HEAD,
            contenders=("naive", *LONG_HORIZON_BOUNDED, "langgraph-batch", "ideal"),
        ),
        "W11": workload(
            id="W11",
            description=(
                "Long agents with fast tools: N=48 agents of 10-30 turns, 3k-token shared "
                "prompt, 1k-token task, 100-600-token tool results, tools of 0.1-0.5 s; "
                "the KV cache does not bind"
            ),
            # A user's job (issue 25): 48 coding agents.
            n=48,
            turns=30,
            # Coding agents run long: a median of 43 turns (SemiAnalysis AgentX, Claude
            # Code; vLLM #57103), ~32 calls per session in LMCache's agentic traces. The
            # user measured 10-30 (median 20), which keeps the run within minutes.
            turns_range=(10, 30),
            system_tokens=3000,
            task_tokens=1000,
            final_tokens=200,
            # A short line before each call: the agent is mostly acting, not reasoning.
            think_tokens=(20, 100),
            # Fast tools (grep, reading a file, listing a directory): 86% of next
            # requests arrive within 1 s (router #285); here every tool answers in
            # 0.1-0.5 s, so the decode schedule and the tail decide the makespan.
            tool_latency_s=0.3,
            tool_latency_range_s=(0.1, 0.5),
            # Small results (a few lines of a file, a grep hit list), log-uniform.
            tool_result_tokens_range=(100, 600),
            distinct_keys=None,
            tool_concurrency=48,
            # The measured H100 cache (463,312 tokens): contexts end at ~13k tokens on
            # average (17k the longest); agents moving in lockstep peak at ~290k live
            # tokens (63% of the cache), so the cache does not bind.
            kv_tokens=None,
            max_model_len=131_072,
            structured=False,
            time_scale=4.0,
            system_head=_CODING_SYSTEM_HEAD,
            task_head=_CODING_TASK_HEAD,
            contenders=("naive", *LONG_HORIZON_BOUNDED, "langgraph-batch", "ideal"),
        ),
    }
