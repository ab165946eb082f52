"""The benchmark workloads (WORKLOADS.md): shapes, prompts and the job each contender runs.

Prompts are sized with the emulator's own tokenizer, so "2048-token system
prompt" means 2048 tokens to the emulated server. Each sibling's task carries
a `key=<k>` marker: the emulator's agent scenario turns it into the tool
call's arguments, so siblings with the same key ask for the same tool call
(what tool coalescing can share).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from langgraph_batch.bench._long_horizon import LONG_HORIZON_BOUNDED, long_horizon_workloads
from langgraph_batch.bench._scaled import scaled_workloads
from langgraph_batch.bench.toolservice import ToolServiceConfig
from langgraph_batch.emulator.config import EmulatorConfig
from langgraph_batch.emulator.costs import get_profile
from langgraph_batch.emulator.scenarios import call_key
from langgraph_batch.emulator.tokenizer import count_tokens

# Words of at most four letters: each is exactly one token with its leading space.
_VOCAB = [
    "data",
    "kv",
    "gpu",
    "page",
    "hit",
    "miss",
    "node",
    "edge",
    "tool",
    "call",
    "turn",
    "plan",
    "task",
    "goal",
    "step",
    "fact",
    "test",
    "case",
    "run",
    "map",
    "sum",
    "list",
    "item",
    "key",
    "size",
    "rate",
    "time",
    "cost",
    "load",
    "risk",
    "core",
    "loop",
    "idea",
    "term",
    "line",
    "text",
    "word",
    "form",
    "rule",
    "unit",
    "role",
    "path",
    "flow",
    "link",
    "cell",
    "grid",
    "bank",
    "file",
    "disk",
    "port",
    "heap",
    "tree",
    "hash",
    "sort",
    "scan",
    "join",
    "view",
    "lock",
]


def filler(n_tokens: int, rng: random.Random) -> str:
    """Text of exactly `n_tokens` emulator tokens (n words from a 1-token vocabulary)."""
    return "".join(" " + rng.choice(_VOCAB) for _ in range(max(0, n_tokens)))


def sized(head: str, n_tokens: int, rng: random.Random) -> str:
    """`head` followed by filler so that the whole text is `n_tokens` tokens."""
    return head + filler(n_tokens - count_tokens(head), rng)


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """One benchmark workload's shape. Latencies are in emulated (unscaled) seconds."""

    id: str
    description: str
    n: int
    turns: int
    """LLM turns per sibling: turns-1 tool calls, then a final answer."""
    system_tokens: int = 2048
    task_tokens: int = 500
    final_tokens: int = 200
    """Output tokens of the final (JSON) answer."""
    tool_latency_s: float = 0.8
    tool_latency_range_s: tuple[float, float] | None = None
    distinct_keys: int | None = 10
    """Distinct tool-argument keys across siblings (None: one per sibling)."""
    tool_concurrency: int = 10
    tool_result_words: int = 60
    tools: bool = True
    structured: bool = True
    profile: str = "h100-llama3-8b"
    flavor: str = "vllm"
    """The emulator's flavour: `vllm` or `sglang` (radix cache, `sglang://` backend)."""
    replicas: int = 1
    """Emulated server replicas (W4: several, one emulator process each)."""
    kv_tokens: int | None = None
    """Server KV capacity in tokens (None: the profile's default)."""
    time_scale: float = 1.0
    """Default emulator time scale: emulated seconds per wall second (2.0: twice as fast)."""
    contenders: tuple[str, ...] = (
        "naive",
        "naive-bounded",
        "batchagent",
        "langgraph-batch",
        "ideal",
    )
    """What `make bench` runs; `langgraph-batch bench` alone runs those it has (not
    `ideal` or `batchagent`: the research harness's, `langgraph_batch.bench.extension`)."""
    system_head: str = (
        "You are a careful research agent. Use the web_search tool to look up the "
        "key named in the task, then answer with a JSON object that matches the schema. "
        "Background notes follow."
    )
    """The start of the shared system prompt (filler words make up the rest)."""
    task_head: str = "Task {index}: investigate the topic key={key} and report. Context:"
    """The start of each sibling's task (`{index}`, `{key}`)."""
    turns_range: tuple[int, int] | None = None
    """Long-horizon agents: each sibling's own number of turns, drawn (seeded) uniformly
    in this range; its task carries `turns=<n>`, which the emulated model follows."""
    think_tokens: tuple[int, int] | None = None
    """Assistant text (tokens, drawn per turn) before each tool call: `think=<lo>-<hi>`."""
    tool_latency_mix: tuple[tuple[float, float, float], ...] | None = None
    """Long-tailed tool latencies: (weight, low s, high s) components (ToolServiceConfig)."""
    tool_result_tokens_range: tuple[int, int] | None = None
    """Tool results sized per call, log-uniform in this range of tokens (else
    `tool_result_words` words)."""
    max_model_len: int | None = None
    """The emulated server's context window (None: the emulator's default, 32,768)."""
    kv_offloading_size: float | None = None
    """GiB of host memory for the server's second KV tier (vLLM's `--kv-offloading-size`,
    native CPU offload); None: no tier."""
    ticks: int = 0
    """Simulation workloads (W9): ticks of the world loop; 0 for agent workloads."""
    world_latency_s: float = 0.0
    """Simulation: the world update between ticks (every agent waits on it)."""
    observation_tokens: tuple[int, int] = (200, 400)
    """Simulation: tokens of each agent's observation per tick (drawn per agent and tick)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def simulation(self) -> bool:
        """A tick-based multi-agent simulation (W9) rather than tool-calling agents."""
        return self.ticks > 0

    def turns_for(self, index: int, seed: int) -> int:
        """Sibling `index`'s number of model calls (`turns`, or its draw in `turns_range`)."""
        if self.turns_range is None:
            return self.turns
        lo, hi = self.turns_range
        return random.Random(f"turns:{seed}:{index}").randint(lo, hi)

    def key(self, index: int) -> str:
        """The tool-argument key of sibling `index`."""
        if self.distinct_keys is None:
            return f"s{index}"
        return f"k{index % self.distinct_keys}"

    def keys(self) -> set[str]:
        """All distinct keys of the run."""
        return {self.key(i) for i in range(self.n)}


TIME_SCALE_W4 = 10.0
"""W4's default time scale: 4 emulator processes share the machine with the client."""

WORKLOADS: dict[str, Workload] = {
    "W1": Workload(
        id="W1",
        description="N=100, 2 turns, 2048-token shared prompt, 800 ms tool, 10 keys, cap 10",
        n=100,
        turns=2,
        tool_latency_s=0.8,
        distinct_keys=10,
        tool_concurrency=10,
        time_scale=1.0,
    ),
    "W2": Workload(
        id="W2",
        description="N=20, 2 turns, 400 ms tool, 9 keys (BatchAgent's research-summary shape)",
        n=20,
        turns=2,
        tool_latency_s=0.4,
        distinct_keys=9,
        tool_concurrency=10,
        time_scale=1.0,
    ),
    "W3": Workload(
        id="W3",
        description=(
            "N=1000, 3 turns, tools 300-1500 ms (seeded), 1500-token unique context, "
            "500-token tool results, KV smaller than all contexts"
        ),
        n=1000,
        turns=3,
        task_tokens=1500,
        tool_latency_s=0.9,
        tool_latency_range_s=(0.3, 1.5),
        distinct_keys=None,
        tool_concurrency=64,
        tool_result_words=500,
        kv_tokens=440_000,
        time_scale=10.0,
        # batchagent is left out by default to keep `make bench` under 15 minutes
        # on 2 cores; run it with --contenders naive,batchagent,...
        contenders=("naive", "naive-bounded", "langgraph-batch", "ideal"),
    ),
    "W4": Workload(
        id="W4",
        description=(
            "4 replicas, N=400, 3 turns (two tool calls, then the answer), 1500-token unique "
            "task: cache-affinity routing vs a round-robin balancer"
        ),
        n=400,
        turns=3,
        task_tokens=1500,
        tool_latency_s=0.8,
        distinct_keys=None,
        tool_concurrency=64,
        replicas=4,
        time_scale=TIME_SCALE_W4,
        contenders=("naive", "langgraph-batch", "langgraph-batch-rr", "ideal"),
    ),
    "W5": Workload(
        id="W5",
        description="N=10,000, 1 turn, no tool, zero-cost server: client CPU per sibling",
        n=10_000,
        turns=1,
        system_tokens=200,
        task_tokens=50,
        final_tokens=16,
        tools=False,
        structured=False,
        distinct_keys=None,
        profile="zero",
        time_scale=1.0,
        contenders=("naive", "langgraph-batch"),
    ),
    "W6": Workload(
        id="W6",
        description="W1 on the SGLang-flavoured emulator (radix cache): prefix warming",
        n=100,
        turns=2,
        tool_latency_s=0.8,
        distinct_keys=10,
        tool_concurrency=10,
        flavor="sglang",
        time_scale=1.0,
    ),
}

WORKLOADS["W7"] = Workload(
    id="W7",
    description=(
        "Extract from 1,000 documents: N=1000 tool-free single-turn prompts, 1k-token shared "
        "instruction, 1,500-token unique document, 150-token JSON answer"
    ),
    n=1000,
    turns=1,
    system_tokens=1000,
    task_tokens=1500,
    final_tokens=150,
    tools=False,
    structured=False,
    distinct_keys=None,
    time_scale=2.0,
    system_head=(
        "You extract facts from documents. Read the document and answer with one JSON object "
        'with the fields "title", "date", "parties", "amounts" and "summary", nothing else. '
        "Guidelines follow."
    ),
    task_head="Document {index} (id key={key}):",
    contenders=(
        "abatch-bounded",
        "abatch",
        "langgraph-batch",
        "langgraph-batch-fan-out",
        "langgraph-batch-nobatch",
        "ideal",
    ),
)

SINGLE_TURN = frozenset({"W7"})
"""Workloads of one tool-free model call per item: answers are forced to
`final_tokens` (`max_tokens` + `ignore_eos`) on every server."""

TOOL_SPECS: tuple[dict[str, str], ...] = (
    {
        "name": "web_search",
        "arg": "query",
        "description": "Search the web and return the most relevant passages for the query.",
        "arg_description": "what to search for",
    },
)


def response_schema(wl: Workload) -> dict[str, Any] | None:
    """The final answer's JSON schema, sized so the emulated answer is ~`final_tokens` long.

    The emulator fills string fields with the tool key padded to `minLength`
    with "x" (four characters per token), so `minLength` sets the length.
    """
    if not wl.structured:
        return None
    return {
        "title": "Finding",
        "type": "object",
        "properties": {
            "summary": {
                "type": "string",
                "description": "what was found",
                "minLength": 4 * max(1, wl.final_tokens - 12),
            },
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["summary", "confidence"],
        "additionalProperties": False,
    }


def system_rng(seed: int) -> random.Random:
    """The filler words of the shared system prompt."""
    return random.Random(f"system:{seed}")


def task_rng(seed: int, index: int) -> random.Random:
    """The filler words of sibling `index`'s task."""
    return random.Random(f"task:{seed}:{index}")


def task_head(wl: Workload, index: int, seed: int = 0) -> str:
    """The start of sibling `index`'s task, with its `key=` marker.

    Long-horizon agents add `turns=<n>` and `think=<lo>-<hi>`: the emulated
    model makes that many calls and reasons before each tool call (a real
    model decides both itself; a live server is told by the forced shapes).
    """
    markers = ""
    if wl.turns_range is not None:
        markers += f" turns={wl.turns_for(index, seed)}"
    if wl.think_tokens is not None:
        markers += f" think={wl.think_tokens[0]}-{wl.think_tokens[1]}"
    return wl.task_head.format(index=index, key=wl.key(index) + markers)


def system_prompt(wl: Workload, seed: int) -> str:
    """The shared system prompt, `wl.system_tokens` emulator tokens long."""
    return sized(wl.system_head, wl.system_tokens, system_rng(seed))


def task_text(wl: Workload, index: int, seed: int) -> str:
    """Sibling `index`'s unique task (carries its `key=` marker), `wl.task_tokens` long."""
    return sized(task_head(wl, index, seed), wl.task_tokens, task_rng(seed, index))


def observation(wl: Workload, seed: int, index: int, tick: int) -> str:
    """What agent `index` observes at `tick` of a simulation (W9), sized in tokens."""
    rng = random.Random(f"obs:{seed}:{index}:{tick}")
    lo, hi = wl.observation_tokens
    return sized(f"Tick {tick}. You observe:", rng.randint(lo, hi), rng)


def emulator_settings(wl: Workload) -> dict[str, Any]:
    """Server-side scenario defaults for this workload (the same server for every contender).

    The emulated model makes `turns - 1` tool calls, then answers with
    `final_tokens` tokens (or JSON for the response schema). Set on the server,
    so no contender sends anything emulator-specific.
    """
    # Long-horizon siblings carry their own `turns=` marker; a conversation
    # without one (the contenders' warm-up) makes one tool call, then answers.
    turns = 1 if wl.simulation else 2 if wl.turns_range is not None else wl.turns
    out: dict[str, Any] = {"turns": turns, "output_tokens": wl.final_tokens}
    # The profile's engine limits where they are not the emulator's defaults (cpu-tiny).
    profile, defaults = get_profile(wl.profile), {f.name: f.default for f in fields(EmulatorConfig)}
    out |= {n: getattr(profile, n) for n in ("max_batched_tokens", "max_num_seqs")
            if getattr(profile, n) != defaults[n]}  # fmt: skip
    if wl.max_model_len is not None:
        out["max_model_len"] = wl.max_model_len
    if wl.kv_offloading_size is not None:
        out["kv_offloading_size"] = wl.kv_offloading_size
    return out


def offload_tokens(wl: Workload) -> int | None:
    """The workload server's second KV tier in tokens, as the emulator sizes it (None: none)."""
    if wl.kv_offloading_size is None:
        return None
    return EmulatorConfig(
        profile=wl.profile, kv_offloading_size=wl.kv_offloading_size
    ).offload_tokens


def make_job(
    wl: Workload,
    *,
    n: int,
    seed: int,
    llm_url: str | list[str],
    tool_url: str,
    model: str,
    contender: str,
    prompts: tuple[str, list[str]] | None = None,
    live: dict[str, Any] | None = None,
    time_scale: float = 1.0,
    base: str | None = None,
) -> dict[str, Any]:
    """The JSON job a contender process runs.

    `base`: the contender whose job a variant runs (a router contender of the
    research harness runs its base's; default: `contender` itself).

    `llm_url` is one server or a list of replicas (W4): `llm_urls` holds them
    all, `llm_url` the first (where single-server code looks). `prompts`:
    (system prompt, tasks) sized for a live server (default: the emulator's
    tokens). `live` (a live server, `--server`): forces the shapes (a named
    tool choice over an enum of the keys, answers of exactly `final_tokens`)
    and names the server's flavour and URL for the library.
    """
    urls = [llm_url] if isinstance(llm_url, str) else list(llm_url)
    system, tasks = prompts or (system_prompt(wl, seed), [task_text(wl, i, seed) for i in range(n)])
    forced = live is not None or wl.id in SINGLE_TURN
    base = base or contender
    return {
        "workload": wl.id,
        "contender": contender,
        "llm_url": urls[0],
        "llm_urls": urls,
        "flavor": (live or {}).get("flavor") or wl.flavor,
        "lgb_url": (live or {}).get("lgb_url"),
        "server": {"live": live is not None},
        "routing": "round_robin" if base.endswith("-rr") else None,
        "tool_url": tool_url,
        "model": model,
        "system_prompt": system,
        "tasks": tasks,
        "turns": wl.turns if wl.turns_range is None else wl.turns_range[1],
        "max_tokens": max(256, wl.final_tokens + 56),
        "emulator_options": {},
        "tools": list(TOOL_SPECS) if wl.tools else [],
        "response_schema": None if live is not None else response_schema(wl),
        "forced_shapes": forced,
        # Every value a forced call may take (a sibling's n-th call: `<key>.<n>`).
        "tool_keys": sorted(
            {call_key(wl.key(i), c) for i in range(n) for c in range(wl.turns_for(i, seed) - 1)}
        )
        if wl.tools
        else [],
        "task_keys": [wl.key(i) for i in range(n)] if wl.tools else None,
        "turns_per_task": [wl.turns_for(i, seed) for i in range(n)],
        "answer_tokens": wl.final_tokens,
        "max_concurrency": bounded_concurrency(base),
        "max_inflight": 32,
        "seed": seed,
        # Simulations (W9): the world loop, its update latency shrunk with the clock.
        "simulation": {"ticks": wl.ticks, "world_latency_s": wl.world_latency_s / time_scale}
        if wl.simulation
        else None,
    }


BOUNDED = "naive-bounded"
BOUNDED_DEFAULT = 32
"""`naive-bounded`'s `max_concurrency` (WORKLOADS.md); `naive-bounded-<k>` sets k (a sweep)."""


def bounded_concurrency(contender: str) -> int | None:
    """The run config's `max_concurrency` of a contender (None: unbounded).

    Raises:
        ValueError: a `naive-bounded-<k>` whose k is not a positive integer.
    """
    if contender == BOUNDED:
        return BOUNDED_DEFAULT
    if contender.startswith(BOUNDED + "-"):
        raw = contender[len(BOUNDED) + 1 :]
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{contender!r}: naive-bounded-<k> needs a positive integer k")
        return int(raw)
    return None


def tool_config(wl: Workload, time_scale: float, seed: int) -> ToolServiceConfig:
    """The tool service of `wl`, its latencies shrunk with the emulator's clock (ratios hold)."""
    rng = wl.tool_latency_range_s
    return ToolServiceConfig(
        latency_s=wl.tool_latency_s / time_scale,
        latency_range_s=None if rng is None else (rng[0] / time_scale, rng[1] / time_scale),
        latency_mix=None
        if wl.tool_latency_mix is None
        else tuple((w, lo / time_scale, hi / time_scale) for w, lo, hi in wl.tool_latency_mix),
        concurrency=wl.tool_concurrency,
        result_words=wl.tool_result_words,
        result_tokens_range=wl.tool_result_tokens_range,
        seed=seed,
    )


def params(wl: Workload, *, n: int, seed: int, time_scale: float) -> dict[str, Any]:
    """The workload parameters recorded in the results JSON."""
    p = asdict(wl)
    p.pop("extra", None)
    p.update(n=n, seed=seed, time_scale=time_scale)
    return p


WORKLOADS.update(long_horizon_workloads(Workload))
SCALED_WORKLOADS = scaled_workloads(Workload, LONG_HORIZON_BOUNDED)
WORKLOADS.update(SCALED_WORKLOADS)
FULL_SIZE: tuple[str, ...] = tuple(w for w in WORKLOADS if w not in SCALED_WORKLOADS)
"""What `bench all` runs: not W1s, W3s, W8s (`_scaled.py`, the cpu-tiny engine's sizes)."""
