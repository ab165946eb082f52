"""A recorded job (`langgraph_batch.record`) as a job the contenders can run again.

`plan(recording)` reads, per sibling and turn, what the replay must
reproduce: the prompt, cached and output tokens, the tool calls, and how
long the sibling waited on its tools. `synthesize(plan, ...)` turns it into
the contenders' job (the same job format as a workload's, see
`workloads.make_job`), with the tool service's per-call tables:

- a shared system prompt with the recorded shared prefix's length, and one
  task per sibling sized so that its first prompt has the recorded length;
  each task carries `key=<k>` (siblings whose recorded tool calls were
  identical, call for call, get the same key, so coalescing can share them
  again) and `turns=<n>` (the emulated model makes n-1 tool calls, then answers);
- every model call is bound to its recorded output length (`max_tokens` +
  `ignore_eos`; `contenders._graph.REPLAY_CALLS`);
- each tool call waits its recorded latency (the executed run's, by call; the
  sibling's wait between its model calls when no tool run was recorded) and
  returns a result sized so that the next prompt has the recorded length.
  The replayed model shows text before each tool call (`think=<n>-<n>`: the
  most every turn of the sibling allows) and generates the rest of a turn's
  recorded output after the call, not shown (`ignore_eos`); the tool result
  carries the difference in the next prompt. Siblings sharing a call share
  its result, sized to their mean.

On the emulator the sizes are exact (its chat template and tokenizer are
known here). On a live server (`--server`) texts are sized with `/tokenize`
and the template's overhead is the emulator's, an estimate: the report says
how close the replay came either way.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph_batch._estimates import typical_tokens
from langgraph_batch.bench.toolservice import ToolServiceConfig, canonical_key, result_text_tokens
from langgraph_batch.bench.workloads import sized
from langgraph_batch.record import LLMCall, Recording

__all__ = ("ReplayPlan", "SiblingPlan", "TurnPlan", "plan", "recorded_figures", "synthesize")

SYSTEM_HEAD = "You are a replayed agent. Use the tool when asked, then answer. Notes follow."
TASK_HEAD = "Task {index}: replay key={key} turns={turns}{think}. Context:"
ARG = "query"
_DC: dict[str, bool] = {"slots": True, "kw_only": True}


@dataclass(**_DC)
class TurnPlan:
    """One model call to reproduce (tokens as the recorded server counted them)."""

    prompt_tokens: int
    cached_tokens: int | None
    output_tokens: int
    calls: tuple[str, ...] = ()
    """Digests of the tool calls this turn made (none on the answer)."""
    wait_s: float = 0.0
    """How long the tool calls after this turn took (0 after the answer)."""


@dataclass(**_DC)
class SiblingPlan:
    """One recorded conversation."""

    index: int
    turns: list[TurnPlan]
    key: str = ""
    """The replayed tool-call key (shared by siblings with identical recorded calls)."""


@dataclass(**_DC)
class ReplayPlan:
    """What a replay reproduces, and the recorded figures it is compared with."""

    siblings: list[SiblingPlan]
    shared_tokens: int
    tool_name: str
    recorded: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def _waits(recording: Recording) -> dict[tuple[int, int], float]:
    """Tool latency per (sibling, turn): the longest run the turn's calls made (in parallel)."""
    out: dict[tuple[int, int], float] = {}
    for run in recording.tools:
        if run.sibling >= 0 and run.turn >= 0:
            key = (run.sibling, run.turn)
            out[key] = max(out.get(key, 0.0), run.latency_s)
    return out


def _by_digest(recording: Recording) -> dict[str, float]:
    """The executed latency of each tool call digest (median when it ran several times)."""
    runs: dict[str, list[float]] = {}
    for run in recording.tools:
        runs.setdefault(run.args_hash, []).append(run.latency_s)
    return {h: statistics.median(v) for h, v in runs.items()}


def recorded_figures(recording: Recording) -> dict[str, Any]:
    """The recorded run's totals, measured as the replay measures its own (see `compare`)."""
    calls = recording.calls
    prompt = sum(c.prompt_tokens or 0 for c in calls)
    known = [c.cached_tokens for c in calls if c.cached_tokens is not None]
    cached = sum(known) if known else None
    gaps = tool_gaps(recording.siblings().values())
    start = min((c.start_s for c in calls), default=0.0)
    end = max([c.end_s for c in calls] + [t.end_s for t in recording.tools], default=0.0)
    return {
        "siblings": len(recording.siblings()),
        "llm_requests": len(calls),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cache_hit_rate": cached / prompt if prompt and cached is not None else None,
        "generation_tokens": sum(c.output_tokens or 0 for c in calls),
        "tool_calls_requested": sum(len(c.tool_calls) for c in calls),
        "tool_calls_executed": len(recording.tools),
        "tool_latency_mean_s": statistics.fmean(t.latency_s for t in recording.tools)
        if recording.tools
        else None,
        "tool_wait_mean_s": statistics.fmean(gaps) if gaps else None,
        "tool_wait_total_s": sum(gaps),
        "makespan_s": end - start,
        "failures": sum(1 for c in calls if c.error),
    }


def tool_gaps(siblings: Iterable[Sequence[LLMCall]]) -> list[float]:
    """Each sibling's wait between consecutive model calls (its tool calls, seen from it)."""
    out: list[float] = []
    for calls in siblings:
        out.extend(b.start_s - a.end_s for a, b in itertools.pairwise(calls))
    return out


def plan(recording: Recording) -> ReplayPlan:
    """What a replay of `recording` must reproduce, per sibling and turn.

    Raises:
        ValueError: the recording holds no model call.
    """
    siblings = recording.siblings()
    if not siblings:
        raise ValueError("the recording holds no model call: nothing to replay")
    warnings = list(recording.warnings)
    waits, latency = _waits(recording), _by_digest(recording)
    names = [n for c in recording.calls for n, _ in c.tool_calls]
    tool_name = max(set(names), key=names.count) if names else "tool"
    out: list[SiblingPlan] = []
    unknown_usage = 0
    for sid, calls in sorted(siblings.items()):
        turns: list[TurnPlan] = []
        for k, call in enumerate(calls):
            prompt = call.prompt_tokens
            if prompt is None:  # no usage: the typical estimate of the new texts
                unknown_usage += 1
                prompt = (turns[-1].prompt_tokens if turns else 0) + typical_tokens(
                    sum(c for _, _, c in call.new)
                )
            wait = 0.0
            if k + 1 < len(calls):
                wait = waits.get((sid, call.turn), 0.0)
                if not wait:  # no tool run recorded: its digests', else the sibling's wait
                    known = [latency[h] for _, h in call.tool_calls if h in latency]
                    wait = max(known) if known else max(0.0, calls[k + 1].start_s - call.end_s)
            turns.append(
                TurnPlan(
                    prompt_tokens=prompt,
                    cached_tokens=call.cached_tokens,
                    output_tokens=max(1, call.output_tokens or 1),
                    calls=tuple(h for _, h in call.tool_calls) if k + 1 < len(calls) else (),
                    wait_s=wait,
                )
            )
        out.append(SiblingPlan(index=len(out), turns=turns))
    if unknown_usage:
        warnings.append(f"{unknown_usage} model calls without usage: prompt lengths estimated")
    _assign_keys(out)
    prefix = (recording.summary or {}).get("shared_prefix")
    tokens = prefix.get("tokens") if isinstance(prefix, Mapping) else None
    shared_tokens = 0  # a summary without a usable figure: recomputed below
    if isinstance(tokens, int | float) and math.isfinite(tokens):
        shared_tokens = max(0, int(tokens))
    if not shared_tokens:
        from langgraph_batch.record import shared_prefix

        firsts = [calls[0] for calls in siblings.values()]
        shared_tokens = int(shared_prefix(firsts)["tokens"])
    return ReplayPlan(
        siblings=out,
        shared_tokens=shared_tokens,
        tool_name=tool_name,
        recorded=recorded_figures(recording),
        warnings=warnings,
    )


def _assign_keys(siblings: Sequence[SiblingPlan]) -> None:
    """Give siblings whose recorded tool calls agree the same key (see `SiblingPlan.key`).

    The replayed model's n-th call of key k has the argument `k` (then `k.n`),
    so two siblings may share a key only if their calls are equal at every
    turn both made one: each sibling joins the first compatible group that
    starts with its first call, else starts a new one.
    """
    groups: list[tuple[str, list[tuple[str, ...]]]] = []
    for sib in siblings:
        seq = [t.calls for t in sib.turns[:-1]]
        if not seq or not all(seq):
            sib.key = f"s{sib.index}"
            continue
        for key, merged in groups:
            if merged[0] == seq[0] and all(a == b for a, b in zip(merged, seq, strict=False)):
                merged.extend(seq[len(merged) :])
                sib.key = key
                break
        else:
            groups.append((f"g{len(groups)}", list(seq)))
            sib.key = groups[-1][0]


def _tool_spec(name: str) -> dict[str, str]:
    return {
        "name": name,
        "arg": ARG,
        "description": "Look the query up and return what was found.",
        "arg_description": "what to look up",
    }


def openai_tool(spec: dict[str, str]) -> dict[str, Any]:
    """A tool spec as the contenders send it (OpenAI format)."""
    params = {
        "type": "object",
        "properties": {spec["arg"]: {"type": "string", "description": spec["arg_description"]}},
        "required": [spec["arg"]],
    }
    return {
        "type": "function",
        "function": {
            "name": spec["name"],
            "description": spec["description"],
            "parameters": params,
        },
    }


@dataclass(**_DC)
class Synthesis:
    """The replay's prompts, per-call plan and tool tables (see `synthesize`)."""

    system: str
    tasks: list[str]
    calls: list[list[dict[str, Any]]]
    tool: dict[str, str]
    latency: dict[str, float]
    result_tokens: dict[str, int]
    keys: list[str]
    prompts: list[list[int]]
    """The prompt tokens each call will have on the emulator (the bound's input)."""
    visible: list[list[int]]
    """The tokens of each call's output that its next prompt holds."""
    deviations: list[str]


def _call_message(name: str, value: str, turn: int, think: int) -> dict[str, Any]:
    args = json.dumps({ARG: value})
    call = {"id": f"c{turn}", "type": "function", "function": {"name": name, "arguments": args}}
    # Any text of `think` tokens counts as the model's (the emulator's words differ).
    text = ("Next:" + " x" * (think - 2)) if think else None
    return {"role": "assistant", "content": text, "tool_calls": [call]}


def _think(sib: SiblingPlan, call_tokens: Any) -> int:
    """The visible text before each of the sibling's tool calls (`think=<n>-<n>`), in tokens.

    The recorded model's output before a tool call (its reasoning) is in the next
    prompt; the replayed model shows `n` tokens of text before each call (the
    most that every tool turn allows), the rest of a turn's output is generated
    after the call and not shown (`ignore_eos`). Below 2 tokens ("Next:"): none.
    """
    spare = [t.output_tokens - 1 - call_tokens(sib.key, k) for k, t in enumerate(sib.turns[:-1])]
    n = min(spare, default=0)
    return n if n >= 2 else 0


def synthesize(rp: ReplayPlan, *, seed: int = 0) -> Synthesis:
    """Prompts, tasks, per-call options and tool tables that reproduce `rp` on the emulator."""
    from langgraph_batch.emulator.scenarios import call_key
    from langgraph_batch.emulator.tokenizer import count_tokens, render_chat, render_tool_call

    spec = _tool_spec(rp.tool_name)
    tools = [openai_tool(spec)]
    rng = random.Random(f"replay:{seed}")
    deviations: list[str] = []

    def tokens(messages: list[dict[str, Any]], gen: bool = True) -> int:
        return count_tokens(render_chat(messages, tools=tools, add_generation_prompt=gen))

    frame = tokens([{"role": "system", "content": ""}], gen=False)
    system = sized(SYSTEM_HEAD, max(1, rp.shared_tokens - frame), rng)
    if rp.shared_tokens < frame + count_tokens(SYSTEM_HEAD):
        deviations.append(
            f"the recorded shared prefix ({rp.shared_tokens} tokens) is shorter than the "
            f"replay's system turn with its tool ({frame + count_tokens(system)})"
        )
    convs: list[list[dict[str, Any]]] = []
    tasks: list[str] = []
    prompts: list[list[int]] = []

    def call_tokens(key: str, k: int) -> int:
        return count_tokens(render_tool_call(spec["name"], json.dumps({ARG: call_key(key, k)})))

    thinks = [_think(sib, call_tokens) for sib in rp.siblings]
    for sib in rp.siblings:
        think = thinks[sib.index]
        head = TASK_HEAD.format(
            index=sib.index,
            key=sib.key,
            turns=len(sib.turns),
            think=f" think={think}-{think}" if think else "",
        )
        empty = tokens([{"role": "system", "content": system}, {"role": "user", "content": ""}])
        want = sib.turns[0].prompt_tokens - empty
        task = sized(head, want, random.Random(f"replay:{seed}:{sib.index}"))
        if count_tokens(task) != want:
            got = empty + count_tokens(task)
            deviations.append(
                f"sibling {sib.index}: first prompt {got} tokens, {sib.turns[0].prompt_tokens} "
                "recorded"
            )
        tasks.append(task)
        convs.append([{"role": "system", "content": system}, {"role": "user", "content": task}])
        prompts.append([tokens(convs[-1])])
    latency: dict[str, float] = {}
    result_tokens: dict[str, int] = {}
    visible: list[list[int]] = [[] for _ in rp.siblings]
    calls: list[list[dict[str, Any]]] = [[] for _ in rp.siblings]
    for k in range(max(len(s.turns) for s in rp.siblings)):
        groups: dict[str, list[int]] = {}
        for sib in rp.siblings:
            if k < len(sib.turns):
                groups.setdefault(call_key(sib.key, k), []).append(sib.index)
        for value, members in groups.items():
            key = canonical_key(spec["name"], {ARG: value})
            needed: list[int] = []
            for i in members:
                sib, conv = rp.siblings[i], convs[i]
                turn = sib.turns[k]
                if k + 1 == len(sib.turns):  # the answer
                    calls[i].append({"max_tokens": turn.output_tokens, "answer": True})
                    visible[i].append(turn.output_tokens)
                    continue
                think = thinks[i]
                shown = call_tokens(sib.key, k) + (think + 1 if think else 0)
                out = max(turn.output_tokens, shown)
                if out != turn.output_tokens:
                    deviations.append(
                        f"sibling {i} turn {k}: {out} output tokens, {turn.output_tokens} "
                        "recorded (the replayed tool call's own length)"
                    )
                calls[i].append({"max_tokens": out, "answer": False})
                visible[i].append(shown)
                conv.append(_call_message(spec["name"], value, k, think))
                conv.append({"role": "tool", "tool_call_id": f"c{k}", "content": ""})
                needed.append(sib.turns[k + 1].prompt_tokens - tokens(conv))
            tooling = [i for i in members if k + 1 < len(rp.siblings[i].turns)]
            if not tooling:
                continue
            latency[key] = statistics.median(rp.siblings[i].turns[k].wait_s for i in tooling)
            floor = count_tokens(f"result[{key}]:")
            size = max(floor, round(statistics.fmean(needed)))
            result_tokens[key] = size
            text = result_text_tokens(key, size)
            for i in tooling:
                convs[i][-1]["content"] = text
                prompts[i].append(tokens(convs[i]))
    return Synthesis(
        system=system,
        tasks=tasks,
        calls=calls,
        tool=spec,
        latency=latency,
        result_tokens=result_tokens,
        keys=sorted({call_key(s.key, k) for s in rp.siblings for k in range(len(s.turns) - 1)}),
        prompts=prompts,
        visible=visible,
        deviations=deviations,
    )


def tool_config(syn: Synthesis, time_scale: float, seed: int) -> ToolServiceConfig:
    """The tool service of a replay: its per-call tables, latencies shrunk with the clock."""
    return ToolServiceConfig(
        latency_s=0.05 / time_scale,
        concurrency=4096,  # the recorded latencies already hold any queueing of the real tool
        result_words=40,
        seed=seed,
        latency_table={k: v / time_scale for k, v in syn.latency.items()},
        result_tokens_table=dict(syn.result_tokens),
    )


def make_replay_job(
    rp: ReplayPlan,
    syn: Synthesis,
    *,
    llm_url: str,
    tool_url: str,
    model: str,
    contender: str,
    live: dict[str, Any] | None = None,
    prompts: tuple[str, list[str]] | None = None,
) -> dict[str, Any]:
    """The job a contender process runs for a replay (`workloads.make_job`'s format)."""
    from langgraph_batch.bench.workloads import bounded_concurrency

    system, tasks = prompts or (syn.system, syn.tasks)
    turns = [len(s.turns) for s in rp.siblings]
    answers = [s.turns[-1].output_tokens for s in rp.siblings]
    return {
        "workload": "replay",
        "contender": contender,
        "llm_url": llm_url,
        "llm_urls": [llm_url],
        "flavor": (live or {}).get("flavor") or "vllm",
        "lgb_url": (live or {}).get("lgb_url"),
        "server": {"live": live is not None},
        "routing": None,
        "tool_url": tool_url,
        "model": model,
        "system_prompt": system,
        "tasks": tasks,
        "turns": max(turns),
        "max_tokens": max(256, *(c["max_tokens"] for cs in syn.calls for c in cs)),
        "emulator_options": {},
        "tools": [syn.tool],
        "response_schema": None,
        "forced_shapes": live is not None,
        "tool_keys": syn.keys,
        "turns_per_task": turns,
        "answer_tokens": max(answers),
        "max_concurrency": bounded_concurrency(contender),
        "max_inflight": 32,
        "seed": 0,
        "simulation": None,
        "replay_calls": syn.calls,
    }


def resident_bound(rp: ReplayPlan, syn: Synthesis, *, profile_name: str) -> dict[str, Any]:
    """The `ideal` entry of a replay: the emulator cost model's bound with contexts resident.

    The larger of the work (every prefill and decode token at the best batch
    composition, the shared prefix once, each context kept resident between
    its turns) and the longest sibling's critical path at batch-1 speed plus
    its tool waits. Valid while the live contexts fit the KV cache together
    (said in `note` when they do not).
    """
    from langgraph_batch.bench.contenders.ideal import MAX_BATCHED_TOKENS, work_bound
    from langgraph_batch.emulator.costs import get_profile

    profile = get_profile(profile_name)
    shared = min(rp.shared_tokens, *(p[0] for p in syn.prompts))
    prefill, attn, decode, decode_kv = shared, shared * shared / 2, 0, 0.0
    chain, critical, peak = 0, 0.0, 0
    for sib, prompts, shown in zip(rp.siblings, syn.prompts, syn.visible, strict=True):
        resident, path, length = shared, 0.0, 0
        for k, turn in enumerate(sib.turns):
            prompt, out = prompts[k], syn.calls[sib.index][k]["max_tokens"]
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
    note = "resident lower bound from the emulator cost model (bench/replay.py)"
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


def live_texts(
    syn: Synthesis, rp: ReplayPlan, sizer: Any, nonce: str
) -> tuple[str, list[str]]:  # pragma: no cover - exercised against live servers
    """The system prompt and tasks sized in a live server's tokens (`live.Sizer`)."""
    import asyncio

    from langgraph_batch.emulator.tokenizer import count_tokens

    specs = [(nonce + " " + SYSTEM_HEAD, count_tokens(syn.system), random.Random("sys"))]
    for sib, task in zip(rp.siblings, syn.tasks, strict=True):
        think = task.split(" think=", 1)[1].split(".", 1)[0] if " think=" in task else ""
        head = TASK_HEAD.format(
            index=sib.index,
            key=sib.key,
            turns=len(sib.turns),
            think=f" think={think}" if think else "",
        )
        specs.append((head, count_tokens(task), random.Random(f"task:{sib.index}")))
    texts = asyncio.run(sizer.fit_all(specs))
    return texts[0], texts[1:]
