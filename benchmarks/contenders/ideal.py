"""Contender `ideal`: the lower bound on makespan from the emulator's own cost model.

WORKLOADS.md: the larger of
- all prefill and decode work executed at the best batch composition the step
  model allows (the shared prefix prefilled once, every sibling's context kept
  resident between turns, steps filled to the token budget, decodes batched),
- the longest single sibling's critical path: its turns at batch-1 speed
  (prefill of its new tokens, then one decode step per output token) plus its
  tool latencies.

Token counts come from rendering each sibling's real conversation with the
emulator's chat template and tokenizer; step times from
`langgraph_batch.emulator.costs`. Not a process: computed by the harness.
`resident_bound` is the same bound for a replayed recording (`bench --replay`).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from typing import Any

from langgraph_batch.bench.replay import Synthesis
from langgraph_batch.bench.replay_plan import ReplayPlan
from langgraph_batch.bench.toolservice import ToolServiceConfig, canonical_key, result_text
from langgraph_batch.bench.workloads import (
    TOOL_SPECS,
    Workload,
    response_schema,
    system_prompt,
    task_text,
)

MAX_BATCHED_TOKENS = 8192
"""The emulator's (and vLLM's H100 server default) token budget per step; a profile
names its engine's own (`Profile.max_batched_tokens`, 2,048 for `cpu-tiny`)."""


def openai_tools() -> list[dict[str, Any]]:
    """The workload's tools as OpenAI tool dicts (what the contenders send)."""
    return [
        {
            "type": "function",
            "function": {
                "name": spec["name"],
                "description": spec["description"],
                "parameters": {
                    "type": "object",
                    "properties": {
                        spec["arg"]: {"type": "string", "description": spec["arg_description"]}
                    },
                    "required": [spec["arg"]],
                },
            },
        }
        for spec in TOOL_SPECS
    ]


def _sibling_turns(
    wl: Workload, index: int, seed: int, system: str, tools: list[dict[str, Any]]
) -> tuple[list[tuple[int, int]], list[str]]:
    """[(prompt_tokens, output_tokens)] per turn and the tool keys it calls."""
    from langgraph_batch.emulator.scenarios import value_for_schema
    from langgraph_batch.emulator.tokenizer import count_tokens, render_chat, render_tool_call

    key = wl.key(index)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": task_text(wl, index, seed)},
    ]
    turns: list[tuple[int, int]] = []
    keys: list[str] = []
    spec = TOOL_SPECS[0]
    for turn in range(wl.turns):
        prompt = count_tokens(render_chat(messages, tools=tools or None))
        if wl.tools and turn < wl.turns - 1:
            args = json.dumps({spec["arg"]: key})
            out_tokens = count_tokens(render_tool_call(spec["name"], args))
            turns.append((prompt, out_tokens))
            keys.append(canonical_key(spec["name"], {spec["arg"]: key}))
            call = {"id": f"c{turn}", "type": "function"}
            call["function"] = {"name": spec["name"], "arguments": args}  # type: ignore[assignment]
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            result = result_text(keys[-1], wl.tool_result_words)
            messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": result})
        else:
            if wl.structured:
                value = value_for_schema(response_schema(wl) or {}, key=key, rng=random.Random(0))
                out_tokens = count_tokens(json.dumps(value))
            else:
                out_tokens = wl.final_tokens
            turns.append((prompt, out_tokens))
    return turns, keys


def work_bound(
    profile: Any,
    *,
    prefill_tokens: int,
    prefills: int,
    attn_units: float,
    decode_tokens: int,
    decode_kv: float,
    chain: int,
    max_decodes: int,
    budget: int = MAX_BATCHED_TOKENS,
) -> tuple[float, int]:
    """Least engine time for the whole job's work, and the steps it takes.

    The work (prefill tokens and their attention, decode tokens and the KV
    they read) is spread evenly over S steps, each priced by the profile's
    own step model (`Profile.step_time`), and S is chosen to minimise the
    total: at least the token budget's worth of steps, the longest
    sibling's output chain, and enough steps that no more than
    `max_decodes` sequences decode at once. Fewer, fuller steps share the
    weight reads; more, smaller decode batches read KV more cheaply where
    the engine's KV cost per token grows with the batch (vLLM on an H100).
    """
    from langgraph_batch.emulator.costs import StepShape

    if profile.zero:
        return 0.0, 0
    total = prefill_tokens + decode_tokens
    s_min = max(1, math.ceil(total / budget), chain, math.ceil(decode_tokens / max(1, max_decodes)))
    s_max = max(s_min, decode_tokens, math.ceil(total / budget))
    candidates = {s_min, s_max}
    s = float(s_min)
    while s < s_max:
        candidates.add(round(s))
        s *= 1.03
    best: tuple[float, int] | None = None
    for steps in sorted(candidates):
        decodes = decode_tokens / steps
        shape = StepShape(
            num_tokens=max(1, round(total / steps)),
            num_seqs=max(1, round(decodes + prefills / steps)),
            num_sampled=max(1, round(decodes + prefills / steps)),
            prefill_attn_units=attn_units / steps,
            decode_kv_tokens=round(decode_kv / steps),
            num_decodes=round(decodes),
        )
        time = steps * profile.step_time(shape)
        if best is None or time < best[0]:
            best = (time, steps)
    assert best is not None
    return best


def ideal(wl: Workload, *, n: int, seed: int) -> dict[str, Any]:
    """The `ideal` entry of the results JSON (times in emulated seconds).

    Several replicas (W4): the siblings split evenly over them, each replica
    prefilling the shared prefix once and keeping its siblings' contexts
    resident (perfect affinity at perfectly balanced load); the makespan is
    one replica's. On SGLang (W6) the bound is the same as on vLLM: it has no
    notion of the radix cache's timing (a shared prefix is reusable only after
    the prefill batch that computed it ran, so siblings in that first batch
    each compute it), so it assumes the prefix computed once, which only
    perfect prefix warming achieves; it stays a lower bound.
    """
    if wl.replicas > 1:
        per = math.ceil(n / wl.replicas)
        one = ideal(replace(wl, replicas=1), n=per, seed=seed)
        return one | {
            "prefill_tokens": one["prefill_tokens"] * wl.replicas,
            "decode_tokens": one["decode_tokens"] * wl.replicas,
            "replicas": wl.replicas,
            "siblings_per_replica": per,
            "note": (
                f"lower bound from the emulator cost model: {per} siblings on each of "
                f"{wl.replicas} replicas, perfect affinity (bench/contenders/ideal.py)"
            ),
        }
    from langgraph_batch.emulator.costs import get_profile
    from langgraph_batch.emulator.tokenizer import count_tokens, render_chat

    profile = get_profile(wl.profile)
    system = system_prompt(wl, seed)
    tools = openai_tools() if wl.tools else []
    # The shared prefix: the rendered system turn (system prompt + tool schemas).
    shared = count_tokens(
        render_chat(
            [{"role": "system", "content": system}],
            tools=tools or None,
            add_generation_prompt=False,
        )
    )
    tool_cfg = ToolServiceConfig(
        latency_s=wl.tool_latency_s,
        latency_range_s=wl.tool_latency_range_s,
        concurrency=wl.tool_concurrency,
        seed=seed,
    )

    prefill_tokens = shared
    attn_units = shared * (shared / 2)
    decode_tokens = 0
    decode_kv = 0.0
    chain = 0
    critical = 0.0
    own_kv = 0  # the most KV one sibling holds beside the shared prefix
    budget = profile.max_batched_tokens
    # Siblings differ only in their key and filler words: sample a few to size them.
    sample = sorted({0, n - 1, *range(0, n, max(1, n // 16))})
    per_sibling: list[tuple[list[tuple[int, int]], list[str]]] = [
        _sibling_turns(wl, i, seed, system, tools) for i in sample
    ]
    for i in range(n):
        turns, keys = per_sibling[min(range(len(sample)), key=lambda j: abs(sample[j] - i))]
        if wl.tools:
            keys = [canonical_key(TOOL_SPECS[0]["name"], {TOOL_SPECS[0]["arg"]: wl.key(i)})] * len(
                keys
            )
        resident = shared
        path = 0.0
        length = 0
        for k, (prompt, out) in enumerate(turns):
            new = max(0, prompt - resident)
            prefill_tokens += new
            attn_units += new * (resident + new / 2)
            decode_tokens += out
            decode_kv += out * (prompt + out / 2)
            length += out
            # Critical path at batch 1: prefill (chunked at the budget), then decodes.
            cached = resident if (i > 0 or k > 0) else 0
            todo = prompt - cached
            while todo > 0:
                t = min(todo, budget)
                path += profile.prefill_time(t, cached=cached)
                cached += t
                todo -= t
            path += (out - 1) * profile.decode_step_time(1, prompt + out // 2)
            if k < len(keys):
                path += tool_cfg.latency_for(keys[k])
            resident = prompt + out
            own_kv = max(own_kv, resident - shared)
        chain = max(chain, length)
        critical = max(critical, path)

    # No more siblings decode at once than the KV cache holds (shared prefix once).
    kv_capacity = wl.kv_tokens if wl.kv_tokens is not None else profile.kv_tokens
    max_decodes = max(1, min(n, (kv_capacity - shared) // max(1, own_kv)))
    work, steps = work_bound(
        profile,
        prefill_tokens=prefill_tokens,
        prefills=n * len(per_sibling[0][0]) + 1,
        attn_units=attn_units,
        decode_tokens=decode_tokens,
        decode_kv=decode_kv,
        chain=chain,
        max_decodes=max_decodes,
        budget=budget,
    )
    makespan = max(work, critical)
    del count_tokens
    return {
        "makespan_s": makespan,
        "work_bound_s": work,
        "critical_path_s": critical,
        "prefill_tokens": prefill_tokens,
        "decode_tokens": decode_tokens,
        "shared_prefix_tokens": shared,
        "steps": steps,
        "max_concurrent_decodes": max_decodes,
        "profile": profile.name,
        "note": "lower bound from the emulator cost model (bench/contenders/ideal.py)",
    }


def resident_bound(
    rp: ReplayPlan, syn: Synthesis, *, profile_name: str, start: str = "recorded"
) -> dict[str, Any]:
    """The `ideal` entry of a replay: the emulator cost model's bound with contexts resident.

    The larger of the work (every prefill and decode token at the best batch
    composition, the shared prefix once, each context kept resident between
    its turns) and the longest sibling's critical path at batch-1 speed plus
    its tool waits (after its start offset, unless `start="together"`); a reset
    keeps only its kept prefix resident. Valid while the live contexts fit the KV cache together
    (said in `note` when they do not).
    """

    from langgraph_batch.emulator.costs import get_profile

    profile = get_profile(profile_name)
    shared = min(rp.shared_tokens, *(p[0] for p in syn.prompts))
    prefill, attn, decode, decode_kv = shared, shared * shared / 2, 0, 0.0
    chain, critical, peak = 0, 0.0, 0
    for sib, prompts, shown in zip(rp.siblings, syn.prompts, syn.visible, strict=True):
        resident, length = shared, 0
        path = sib.start_s if start == "recorded" else 0.0
        for k, turn in enumerate(sib.turns):
            prompt, out = prompts[k], syn.calls[sib.index][k]["max_tokens"]
            if turn.kept_tokens is not None:  # a reset: only the kept prefix is reused
                resident = min(resident, max(shared, turn.kept_tokens))
            new = max(0, prompt - resident)
            prefill += new
            attn += new * (resident + new / 2)
            decode += out
            decode_kv += out * (prompt + out / 2)
            length += out
            cached = resident if (sib.index or k) else 0
            todo = prompt - cached
            while todo > 0:
                step = min(todo, MAX_BATCHED_TOKENS)
                path += profile.prefill_time(step, cached=cached)
                cached += step
                todo -= step
            path += (out - 1) * profile.decode_step_time(1, prompt + out // 2) + turn.wait_s
            resident = prompt + shown[k]
        peak = max(peak, resident - shared)
        chain, critical = max(chain, length), max(critical, path)
    n = len(rp.siblings)
    capacity = profile.kv_tokens
    work, steps = work_bound(
        profile,
        prefill_tokens=prefill,
        prefills=sum(len(s.turns) for s in rp.siblings) + 1,
        attn_units=attn,
        decode_tokens=decode,
        decode_kv=decode_kv,
        chain=chain,
        max_decodes=max(1, min(n, (capacity - shared) // max(1, peak))),
    )
    note = "resident lower bound from the emulator cost model (benchmarks/contenders/ideal.py)"
    if shared + n * peak > capacity:
        note += (
            f"; the contexts ({shared + n * peak} tokens at their largest) outgrow the KV "
            f"cache ({capacity}): a schedule must evict, so this bound is optimistic"
        )
    return {
        "makespan_s": max(work, critical),
        "work_bound_s": work,
        "critical_path_s": critical,
        "prefill_tokens": prefill,
        "decode_tokens": decode,
        "shared_prefix_tokens": shared,
        "steps": steps,
        "profile": profile.name,
        "note": note,
    }
