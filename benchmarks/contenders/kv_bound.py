"""A lower bound on makespan that respects the server's KV capacity (W3, W8, W9).

`ideal` (`ideal.py`) assumes every sibling's context stays
resident between its turns. When the live contexts do not fit the KV cache
together that schedule does not exist, so it is no bound there. This one lets
a schedule do what a real one may: keep a context resident while its sibling
waits on a tool (it then occupies KV for the whole wait), or drop it and
prefill it again on the next turn (engine time); never exceed the capacity.

Token counts are exact: each sibling's conversation is replayed through the
emulated model (`plan_chat`, the same scenario the server runs), rendered with
its chat template and tokenizer, and the tool service's own result texts.
Times come from the emulator's cost model (`Profile.step_time`).

Tool agents (W3, W8). The makespan T is at least each of:

1. the critical path: the longest sibling's turns at batch-1 speed (prefill of
   its new tokens, one decode step per output token) plus its tool latencies;
2. the work: every prefill and decode token, spread over the cheapest number
   of steps the step model allows (`ideal.work_bound`), with the KV-read limit
   that a step's decoding sequences are resident together (their own KV read
   per step at most the capacity less the shared prefix), plus every context
   the schedule chose to drop, prefilled again;
3. the KV-time: the capacity, less the shared prefix, times T is at least the
   KV-seconds the siblings occupy: each turn's context for its decode steps
   (at least the fastest step each), and each tool wait's context for the
   wait, unless the schedule dropped it.

With a second KV tier in host memory of O tokens (vLLM's CPU offload,
`offload_tokens`), a schedule may also park a waiting context there and load it
back instead of computing it again. Relaxed (a valid bound, maybe a loose one):
the transfers are free and the tier holds only parked contexts, so parking frees
at most O*T of the waits' KV-seconds without prefill: the KV-time term becomes
T >= max(held / (C + O), (held - waits kept) / C), where `held` is what the kept
contexts occupy and "waits kept" their waits' share of it.

Which waits to drop is the schedule's choice, so the bound is the minimum over
it. Dropping a context of c tokens during a wait of L seconds frees c*L
KV-seconds for c tokens of prefill: the best choice drops the longest waits
first (their KV-seconds per recomputed token, L, are largest). With the waits
sorted by latency, the bound is the smallest over k of max(work with the k
longest dropped, KV-time with the k+1 longest dropped) (the fractional
relaxation: a valid bound), and never less than the critical path.

Simulations (W9). Ticks are barriers: every agent acts, then the world
updates. So T >= the sum over ticks of (that tick's work, or its slowest
agent at batch 1, whichever is larger) plus the world updates, and a tick's
prefill holds at least what its agents carried in beyond the cache: of the
memories M_t before tick t's observations, at most the capacity C can be
cached, so at least M_t + shared - C tokens are prefilled again. What an agent
computes again is a suffix of its memory (a prefix cache reuses prefixes only),
so that prefill's attention is at least that of the smallest memories computed
again whole (`recompute_attention`).

The minimum prefill (each context token computed once, the partial block
of a turn again, as vLLM caches only full 16-token blocks) is reported as
`min_prefill_tokens`, the yardstick of the "prefill <= 1.2x the minimum" goals.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from benchmarks.contenders.ideal import openai_tools, work_bound
from langgraph_batch.bench.toolservice import canonical_key
from langgraph_batch.bench.workloads import (
    Workload,
    observation,
    response_schema,
    system_prompt,
    task_text,
    tool_config,
)

BLOCK = 16
"""vLLM's KV block on a GPU: only full blocks are cached, so a turn recomputes its partial
last one (a profile names its engine's: `Profile.block_size`, 32 for `cpu-tiny`)."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One model call of a sibling, in tokens and seconds."""

    prompt: int
    """Prompt tokens (the shared prefix included)."""
    new: int
    """Prompt tokens not cached even when the sibling's context stayed resident."""
    out: int
    """Output tokens."""
    wait: float
    """Seconds until its next turn can start (the tool's latency; 0 after the last)."""


def _segment_tokens(message: dict[str, Any]) -> int:
    """Tokens of one non-system message as the chat template renders it."""
    from langgraph_batch.emulator.tokenizer import count_tokens, render_chat

    return count_tokens(render_chat([message], add_generation_prompt=False))


def _gen_prompt_tokens() -> int:
    from langgraph_batch.emulator.tokenizer import IM_START, count_tokens

    return count_tokens(f"{IM_START}assistant\n")


def _shared_tokens(system: str, tools: list[dict[str, Any]]) -> int:
    from langgraph_batch.emulator.tokenizer import count_tokens, render_chat

    return count_tokens(
        render_chat(
            [{"role": "system", "content": system}],
            tools=tools or None,
            add_generation_prompt=False,
        )
    )


def _cached_after(prompt: int, out: int, block: int = BLOCK) -> int:
    """What a resident context offers the next turn: its full blocks."""
    return (prompt + out) // block * block


def agent_turns(wl: Workload, index: int, seed: int, system: str) -> tuple[int, list[Turn]]:
    """Sibling `index`'s turns, replayed through the emulated model; and the shared prefix."""
    from langgraph_batch.emulator.costs import get_profile
    from langgraph_batch.emulator.scenarios import ScenarioOptions, plan_chat

    block = get_profile(wl.profile).block_size
    tools = openai_tools() if wl.tools else []
    shared = _shared_tokens(system, tools)
    gen = _gen_prompt_tokens()
    cfg = tool_config(wl, 1.0, seed)
    schema = response_schema(wl)
    fmt = (
        {"type": "json_schema", "json_schema": {"name": "Finding", "schema": schema}}
        if schema
        else None
    )
    options = ScenarioOptions(turns=wl.turns, output_tokens=wl.final_tokens, seed=seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": task_text(wl, index, seed)},
    ]
    prompt = shared + _segment_tokens(messages[1]) + gen
    turns: list[Turn] = []
    cached = shared
    while True:
        plan = plan_chat(
            messages,
            tools=tools or None,
            tool_choice="auto" if tools else "none",
            response_format=fmt,
            options=options,
        )
        out = plan.num_tokens
        if not plan.tool_calls:
            turns.append(Turn(prompt=prompt, new=prompt - cached, out=out, wait=0.0))
            return shared, turns
        call = plan.tool_calls[0]
        key = canonical_key(call.name, json.loads(call.arguments))
        turns.append(Turn(prompt=prompt, new=prompt - cached, out=out, wait=cfg.latency_for(key)))
        assistant = {
            "role": "assistant",
            "content": plan.content,
            "tool_calls": [
                {
                    "id": f"c{len(turns)}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        }
        result = {"role": "tool", "tool_call_id": f"c{len(turns)}", "content": cfg.result_for(key)}
        messages += [assistant, result]
        cached = _cached_after(prompt, out, block)
        prompt += _segment_tokens(assistant) + _segment_tokens(result)


def _critical(profile: Any, turns: list[Turn], *, cold: bool) -> float:
    """One sibling alone at batch 1: its prefills (chunked at the budget), decodes, waits."""
    path = 0.0
    for k, t in enumerate(turns):
        cached = t.prompt - t.new if (k > 0 or not cold) else 0
        todo = t.prompt - cached
        while todo > 0:
            chunk = min(todo, profile.max_batched_tokens)
            path += profile.prefill_time(chunk, cached=cached)
            cached += chunk
            todo -= chunk
        path += (t.out - 1) * profile.decode_step_time(1, t.prompt + t.out // 2)
        path += t.wait
    return path


@dataclass(slots=True)
class _Work:
    """Token totals of a schedule's engine work."""

    prefill: int = 0
    attn: float = 0.0
    prefills: int = 0
    decode: int = 0
    decode_kv: float = 0.0
    own_decode_kv: float = 0.0
    chain: int = 0

    def add_turn(self, t: Turn, shared: int) -> None:
        self.prefill += t.new
        self.attn += t.new * (t.prompt - t.new + t.new / 2)
        self.prefills += 1
        self.decode += t.out
        self.decode_kv += t.out * (t.prompt + t.out / 2)
        self.own_decode_kv += t.out * (t.prompt - shared + t.out / 2)

    def time(
        self, profile: Any, capacity_own: int, extra_prefill: int = 0, extra_attn: float = 0.0
    ) -> float:
        """Least engine time of this work (plus `extra_*` recomputed prefill)."""
        # The KV read limit: a step's decoding sequences are resident together.
        steps_kv = math.ceil(self.own_decode_kv / max(1, capacity_own))
        chain = max(self.chain, steps_kv)
        seconds, _ = work_bound(
            profile,
            prefill_tokens=self.prefill + extra_prefill,
            prefills=self.prefills,
            attn_units=self.attn + extra_attn,
            decode_tokens=self.decode,
            decode_kv=self.decode_kv,
            chain=chain,
            max_decodes=max(1, self.decode),
            budget=profile.max_batched_tokens,
        )
        return seconds


def _min_step(profile: Any) -> float:
    return float(profile.decode_step_time(1, 1))


def agents_bound(
    wl: Workload, *, n: int, seed: int, offload_tokens: int | None = None
) -> dict[str, Any]:
    """The KV-valid bound of a tool-agent workload (one replica).

    Args:
        wl: The workload.
        n: Its siblings.
        seed: The seed of its conversations.
        offload_tokens: The server's second KV tier in tokens (None: none);
            the module docstring says how the bound uses it.

    Returns:
        The bound and its parts (`makespan_s`, `kv_bound_s`, ...).
    """
    from langgraph_batch.emulator.costs import get_profile

    profile = get_profile(wl.profile)
    capacity = wl.kv_tokens if wl.kv_tokens is not None else profile.kv_tokens
    system = system_prompt(wl, seed)
    work = _Work()
    critical = 0.0
    kv_seconds = 0.0
    waits: list[tuple[float, int, float]] = []  # (latency, own context, attention units)
    shared = 0
    min_step = _min_step(profile)
    for i in range(n):
        shared, turns = agent_turns(wl, i, seed, system)
        critical = max(critical, _critical(profile, turns, cold=i == 0))
        work.chain = max(work.chain, sum(t.out for t in turns))
        for t in turns:
            work.add_turn(t, shared)
            own = t.prompt - shared
            kv_seconds += own * t.out * min_step
            if t.wait > 0:
                ctx = _cached_after(t.prompt, t.out, profile.block_size) - shared
                waits.append((t.wait, ctx, ctx * (shared + ctx / 2)))
    work.prefill += shared  # the shared prefix, computed once
    work.attn += shared * shared / 2
    capacity_own = max(1, capacity - shared)
    tier = offload_tokens or 0
    waits.sort(key=lambda w: w[0], reverse=True)
    waits_kept = sum(lat * ctx for lat, ctx, _ in waits)
    held = kv_seconds + waits_kept
    best = math.inf
    dropped_tokens = 0
    dropped_attn = 0.0
    best_dropped = 0
    # k = how many of the longest waits are dropped (recomputed).
    for k in range(len(waits) + 1):
        w_time = work.time(profile, capacity_own, dropped_tokens, dropped_attn)
        if k < len(waits):
            lat, ctx, attn = waits[k]
            held_after = held - lat * ctx
            kept_after = waits_kept - lat * ctx
        else:
            lat = ctx = 0
            attn = 0.0
            held_after = held
            kept_after = waits_kept
        kv_time = held_after / capacity_own
        if tier:
            # Parking frees up to tier*T of the kept waits' KV-seconds, no more than they hold.
            kv_time = max(
                held_after / (capacity_own + tier), (held_after - kept_after) / capacity_own
            )
        value = max(w_time, kv_time)
        if value < best:
            best, best_dropped = value, k
        if w_time >= best:
            break  # the work only grows from here
        held = held_after
        waits_kept = kept_after
        dropped_tokens += int(ctx)
        dropped_attn += attn
    min_prefill = work.prefill
    makespan = max(best, critical)
    return {
        "makespan_s": makespan,
        "work_bound_s": work.time(profile, capacity_own),
        "kv_bound_s": best,
        "critical_path_s": critical,
        "prefill_tokens": work.prefill,
        "min_prefill_tokens": min_prefill,
        "decode_tokens": work.decode,
        "shared_prefix_tokens": shared,
        "kv_capacity_tokens": capacity,
        "offload_tokens": offload_tokens,
        "waits_dropped": best_dropped,
        "waits": len(waits),
        "profile": profile.name,
        "kind": "kv-valid",
        "note": (
            "KV-valid lower bound from the emulator cost model: a schedule may keep a "
            "context through a tool wait or recompute it, never exceed the KV capacity "
            "(bench/contenders/kv_bound.py)"
        ),
    }


def recompute_attention(tokens: int, memories: list[int], shared: int) -> float:
    """The least attention (`StepShape.prefill_attn_units`) of computing `tokens` again.

    A prefix cache reuses only a prefix of a context (vLLM hashes each block with
    the blocks before it), so what an agent computes again is a suffix of its
    memory: r of its m own tokens, after the `shared` prefix, cost
    r * (shared + m - r/2) >= r * (shared + m/2) attention units. The least of
    that linear lower bound over every split of `tokens` fills the smallest
    memories first.

    Example:
        ```python
        # two memories of 1,000 and 3,000 tokens after a 500-token prefix; 1,500 again
        assert recompute_attention(1500, [3000, 1000], 500) == 1000 * 1000 + 500 * 2000
        ```
    """
    left = tokens
    attn = 0.0
    for m in sorted(memories):
        if left <= 0:
            break
        r = min(left, m)
        attn += r * (shared + m / 2)
        left -= r
    return attn


def simulation_bound(wl: Workload, *, n: int, seed: int) -> dict[str, Any]:
    """The KV-valid bound of a tick-based simulation (W9): ticks are barriers."""
    from langgraph_batch.emulator.costs import get_profile
    from langgraph_batch.emulator.scenarios import ScenarioOptions, plan_chat

    profile = get_profile(wl.profile)
    capacity = wl.kv_tokens if wl.kv_tokens is not None else profile.kv_tokens
    system = system_prompt(wl, seed)
    shared = _shared_tokens(system, [])
    gen = _gen_prompt_tokens()
    options = ScenarioOptions(turns=1, output_tokens=wl.final_tokens, seed=seed)
    memories: list[list[dict[str, Any]]] = []
    prompts: list[int] = []
    for i in range(n):
        first = {
            "role": "user",
            "content": f"{task_text(wl, i, seed)}\n{observation(wl, seed, i, 0)}",
        }
        memories.append([{"role": "system", "content": system}, first])
        prompts.append(shared + _segment_tokens(first) + gen)
    cached = [shared] * n  # what a resident memory offers the next tick
    total = 0.0
    min_prefill = shared
    per_tick: list[float] = []
    min_step = _min_step(profile)
    capacity_own = max(1, capacity - shared)
    for tick in range(1, wl.ticks + 1):
        work = _Work()
        crit = 0.0
        carried = sum(c - shared for c in cached)  # memories carried into this tick
        outs: list[int] = []
        kv_seconds = 0.0
        for i in range(n):
            plan = plan_chat(
                memories[i], tools=None, tool_choice="none", response_format=None, options=options
            )
            out = plan.num_tokens
            outs.append(out)
            t = Turn(prompt=prompts[i], new=prompts[i] - cached[i], out=out, wait=0.0)
            work.add_turn(t, shared)
            work.chain = max(work.chain, out)
            crit = max(crit, _critical(profile, [t], cold=False))
            kv_seconds += (t.prompt - shared) * out * min_step
            memories[i].append({"role": "assistant", "content": plan.content})
        if tick == 1:
            work.prefill += shared
            work.attn += shared * shared / 2
        # At most the capacity's worth of carried memory can be cached at the tick's start.
        recompute = max(0, carried - capacity_own)
        attn = recompute_attention(recompute, [c - shared for c in cached], shared)
        w = max(work.time(profile, capacity_own, recompute, attn), kv_seconds / capacity_own)
        min_prefill += work.prefill + recompute
        tick_time = max(w, crit)
        per_tick.append(tick_time)
        total += tick_time
        if tick < wl.ticks:
            total += wl.world_latency_s
            for i in range(n):
                seen = {"role": "user", "content": observation(wl, seed, i, tick)}
                memories[i].append(seen)
                cached[i] = _cached_after(prompts[i], outs[i], profile.block_size)
                prompts[i] += _segment_tokens(memories[i][-2]) + _segment_tokens(seen)
    return {
        "makespan_s": total,
        "prefill_tokens": min_prefill,
        "min_prefill_tokens": min_prefill,
        "shared_prefix_tokens": shared,
        "kv_capacity_tokens": capacity,
        "final_memory_tokens": sum(p - shared for p in prompts),
        "tick_work_s": [round(x, 4) for x in per_tick],
        "world_s": wl.world_latency_s * (wl.ticks - 1),
        "profile": profile.name,
        "kind": "kv-valid",
        "note": (
            "KV-valid lower bound from the emulator cost model: ticks are barriers, and a "
            "tick recomputes at least the memories that do not fit the KV cache "
            "(bench/contenders/kv_bound.py)"
        ),
    }
