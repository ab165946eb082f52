"""A recorded job (`langgraph_batch.record`) as a job the contenders can run again.

`plan(recording)` (`replay_plan`) reads, per sibling and turn, what the
replay must reproduce: the prompt, cached and output tokens, the tool calls,
how long the sibling waited on its tools, its resets and its start offset.
`synthesize(plan, ...)` turns it into the contenders' job (the same job
format as a workload's, see `workloads.make_job`), with the tool service's
per-call tables:

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

import json
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langgraph_batch.bench.replay_plan import (
    ReplayPlan,
    SiblingPlan,
    TurnPlan,
    plan,
    recorded_figures,
    tool_gaps,
)
from langgraph_batch.bench.toolservice import ToolServiceConfig, canonical_key, result_text_tokens
from langgraph_batch.bench.workloads import sized

__all__ = (
    "ReplayPlan",
    "SiblingPlan",
    "TurnPlan",
    "plan",
    "recorded_figures",
    "synthesize",
    "tool_gaps",
)

SYSTEM_HEAD = "You are a replayed agent. Use the tool when asked, then answer. Notes follow."
TASK_HEAD = "Task {index}: replay key={key} turns={turns}{think}. Context:"
RESET_HEAD = "Reset {index}.{turn}: replay key={key} turns={turns}{think}. Context:"
ARG = "query"
_DC: dict[str, bool] = {"slots": True, "kw_only": True}


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


def _think(sib: SiblingPlan, call_tokens: Callable[[int], int]) -> int:
    """The visible text before each of the sibling's tool calls (`think=<n>-<n>`), in tokens.

    The recorded model's output before a tool call (its reasoning) is in the next
    prompt; the replayed model shows `n` tokens of text before each call (the
    most that every tool turn allows), the rest of a turn's output is generated
    after the call and not shown (`ignore_eos`). Below 2 tokens ("Next:"): none.
    `call_tokens(k)`: the length of turn k's replayed tool call (at most).
    """
    spare = [t.output_tokens - 1 - call_tokens(k) for k, t in enumerate(sib.turns[:-1])]
    n = min(spare, default=0)
    return n if n >= 2 else 0


def _bound_value(sib: SiblingPlan, k: int) -> str:
    """The longest argument turn k's tool call can have (after a reset at r: `<key>.r<r>.<n>`)."""
    from langgraph_batch.emulator.scenarios import call_key

    resets = [r for r in range(1, k + 1) if sib.turns[r].kept_tokens is not None]
    return call_key(f"{sib.key}.r{resets[-1]}", k) if resets else call_key(sib.key, k)


def _tool_count(conv: list[dict[str, Any]]) -> int:
    return sum(1 for m in conv if m["role"] == "tool")


def synthesize(rp: ReplayPlan, *, seed: int = 0) -> Synthesis:
    """Prompts, tasks, per-call options and tool tables that reproduce `rp` on the emulator.

    A reset turn (`TurnPlan.kept_tokens`) keeps the first messages of the
    replayed conversation whose tokens come nearest the recorded kept prefix
    (the tool result just returned excluded: its size is its call's), then a
    new user message sized so that the prompt has the recorded length; that
    message names the sibling's key from then on (`<key>.r<turn>`) and the
    turns left, as the emulated model reads them. The contenders' graph
    applies it (`{"keep": m, "text": ...}` in the turn's call options).
    Every prompt, output and kept prefix that differs from the recording is
    listed in `deviations`.
    """
    from langgraph_batch.emulator.scenarios import call_key
    from langgraph_batch.emulator.tokenizer import count_tokens, render_chat, render_tool_call

    spec = _tool_spec(rp.tool_name)
    tools = [openai_tool(spec)]
    rng = random.Random(f"replay:{seed}")
    deviations: list[str] = []

    def tokens(messages: list[dict[str, Any]], gen: bool = True) -> int:
        return count_tokens(render_chat(messages, tools=tools, add_generation_prompt=gen))

    def call_tokens(value: str) -> int:
        return count_tokens(render_tool_call(spec["name"], json.dumps({ARG: value})))

    frame = tokens([{"role": "system", "content": ""}], gen=False)
    system = sized(SYSTEM_HEAD, max(1, rp.shared_tokens - frame), rng)
    system_turn = frame + count_tokens(system)
    if system_turn > rp.shared_tokens:
        deviations.append(
            f"shared prefix: the recorded siblings' first prompts share {rp.shared_tokens} "
            f"tokens, but every replayed prompt opens with the same {system_turn}-token system "
            "turn (the replay's instructions and tool schema, its smallest): first calls may "
            f"find up to {system_turn - rp.shared_tokens} tokens more cached than recorded"
        )
    convs: list[list[dict[str, Any]]] = []
    tasks: list[str] = []
    prompts: list[list[int]] = []
    why: dict[tuple[int, int], str] = {}

    def longest_call(sib: SiblingPlan) -> Callable[[int], int]:
        return lambda k: call_tokens(_bound_value(sib, k))

    thinks = [_think(s, longest_call(s)) for s in rp.siblings]
    for sib in rp.siblings:
        think = thinks[sib.index]
        head = TASK_HEAD.format(
            index=sib.index,
            key=sib.key,
            turns=len(sib.turns),
            think=f" think={think}-{think}" if think else "",
        )
        empty = tokens([{"role": "system", "content": system}, {"role": "user", "content": ""}])
        task = sized(
            head, sib.turns[0].prompt_tokens - empty, random.Random(f"r:{seed}:{sib.index}")
        )
        why[(sib.index, 0)] = "the task's replay markers alone outgrow the recorded prompt"
        tasks.append(task)
        convs.append([{"role": "system", "content": system}, {"role": "user", "content": task}])
        prompts.append([tokens(convs[-1])])
    latency: dict[str, float] = {}
    result_tokens: dict[str, int] = {}
    visible: list[list[int]] = [[] for _ in rp.siblings]
    calls: list[list[dict[str, Any]]] = [[] for _ in rp.siblings]
    keys = [sib.key for sib in rp.siblings]
    values: set[str] = set()
    for k in range(max(len(s.turns) for s in rp.siblings)):
        steps: dict[int, dict[str, Any]] = {}
        for sib in rp.siblings:
            if 0 < k < len(sib.turns) and sib.turns[k].kept_tokens is not None:
                i, think = sib.index, thinks[sib.index]
                keys[i] = f"{sib.key}.r{k}"
                steps[i] = _reset(sib, k, convs[i], keys[i], think, tokens, deviations, seed)
                prompts[i].append(tokens(convs[i]))
                why[(i, k)] = "the reset's new message cannot be that small"
        groups: dict[str, list[int]] = {}
        for sib in rp.siblings:
            if k < len(sib.turns):
                value = call_key(keys[sib.index], _tool_count(convs[sib.index]))
                groups.setdefault(value, []).append(sib.index)
        for value, members in groups.items():
            key = canonical_key(spec["name"], {ARG: value})
            needed: dict[int, int] = {}
            for i in members:
                sib, conv = rp.siblings[i], convs[i]
                turn = sib.turns[k]
                if k + 1 == len(sib.turns):  # the answer
                    calls[i].append(
                        {"max_tokens": turn.output_tokens, "answer": True} | steps.get(i, {})
                    )
                    visible[i].append(turn.output_tokens)
                    continue
                think = thinks[i]
                shown = call_tokens(value) + (think + 1 if think else 0)
                out = max(turn.output_tokens, shown)
                if out != turn.output_tokens:
                    deviations.append(
                        f"sibling {i} turn {k}: {out} output tokens, {turn.output_tokens} "
                        "recorded (the replayed tool call's own length)"
                    )
                calls[i].append({"max_tokens": out, "answer": False} | steps.get(i, {}))
                visible[i].append(shown)
                conv.append(_call_message(spec["name"], value, k, think))
                conv.append({"role": "tool", "tool_call_id": f"c{k}", "content": ""})
                if sib.turns[k + 1].kept_tokens is None:  # a reset drops this result
                    needed[i] = sib.turns[k + 1].prompt_tokens - tokens(conv)
            tooling = [i for i in members if k + 1 < len(rp.siblings[i].turns)]
            if not tooling:
                continue
            values.add(value)
            latency[key] = statistics.median(rp.siblings[i].turns[k].wait_s for i in tooling)
            floor = count_tokens(f"result[{key}]:")
            size = max(floor, round(statistics.fmean(needed.values()))) if needed else floor
            result_tokens[key] = size
            text = result_text_tokens(key, size)
            for i in tooling:
                convs[i][-1]["content"] = text
                if i in needed:
                    prompts[i].append(tokens(convs[i]))
                    why[(i, k + 1)] = (
                        f"the tool result is shared by {len(needed)} siblings, sized to their mean"
                        if len(set(needed.values())) > 1
                        else "the replayed tool call, its text and the smallest result "
                        "outgrow the recorded growth"
                    )
    deviations += _prompt_deviations(rp, prompts, why)
    return Synthesis(
        system=system,
        tasks=tasks,
        calls=calls,
        tool=spec,
        latency=latency,
        result_tokens=result_tokens,
        keys=sorted(values),
        prompts=prompts,
        visible=visible,
        deviations=deviations,
    )


def _reset(
    sib: SiblingPlan,
    k: int,
    conv: list[dict[str, Any]],
    key: str,
    think: int,
    tokens: Callable[..., int],
    deviations: list[str],
    seed: int,
) -> dict[str, Any]:
    """Apply turn k's reset to `conv` (in place); returns the graph's step (`keep`, `text`).

    The replay keeps whole messages, ending after a system, user or tool message
    (never on an assistant tool call without its result, nor on the result just
    returned): the boundary nearest the recorded kept prefix among those that
    leave room for the new message.
    """
    from langgraph_batch.emulator.tokenizer import count_tokens, render_chat

    turn = sib.turns[k]
    kept = turn.kept_tokens or 0
    user = {"role": "user", "content": ""}
    last = len(conv) - 1 if conv and conv[-1]["role"] == "tool" else len(conv)
    # Each turn renders on its own (the template's segments): the prefix of j messages
    # is the system turn plus the next j - 1 segments, counted once each.
    bounds = [tokens(conv[:1], gen=False)]
    for msg in conv[1:last]:
        bounds.append(bounds[-1] + count_tokens(render_chat([msg], add_generation_prompt=False)))
    opening = count_tokens(render_chat([user]))  # the new message's frame and the reply's
    options = [
        (bounds[j - 1] + opening > turn.prompt_tokens, abs(bounds[j - 1] - kept), j)
        for j in range(1, last + 1)
        if conv[j - 1]["role"] != "assistant"
    ]
    m = min(options)[2]
    head = RESET_HEAD.format(
        index=sib.index,
        turn=k,
        key=key,
        turns=_tool_count(conv[:m]) + len(sib.turns) - k,
        think=f" think={think}-{think}" if think else "",
    )
    want = turn.prompt_tokens - bounds[m - 1] - opening
    text = sized(head, want, random.Random(f"reset:{seed}:{sib.index}:{k}"))
    got = bounds[m - 1]
    if got != kept:
        how = "estimated from its messages' sizes" if turn.kept_estimated else "recorded"
        deviations.append(
            f"sibling {sib.index} turn {k}: the reset keeps {got} tokens, {kept} {how} "
            f"({got - kept:+d}: the replay keeps whole messages)"
        )
    conv[:] = [*conv[:m], {"role": "user", "content": text}]
    return {"keep": m, "text": text}


def _prompt_deviations(
    rp: ReplayPlan, prompts: list[list[int]], why: dict[tuple[int, int], str]
) -> list[str]:
    """One line per replayed prompt whose length differs from the recorded one, and a total."""
    rows, diffs = [], []
    for sib, got in zip(rp.siblings, prompts, strict=True):
        for k, (turn, n) in enumerate(zip(sib.turns, got, strict=False)):
            if n != turn.prompt_tokens:
                diffs.append(n - turn.prompt_tokens)
                rows.append(
                    f"sibling {sib.index} turn {k}: prompt {n} tokens, {turn.prompt_tokens} "
                    f"recorded ({diffs[-1]:+d}: {why.get((sib.index, k), 'unexplained')})"
                )
    if not rows:
        return []
    total = sum(len(s.turns) for s in rp.siblings)
    head = (
        f"prompt sizes: {len(rows)} of {total} replayed prompts differ from the recording "
        f"({sum(diffs):+d} tokens in all, the largest by {max(map(abs, diffs))}), each below"
    )
    return [head, *rows]


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
    time_scale: float = 1.0,
    start: str = "recorded",
) -> dict[str, Any]:
    """The job a contender process runs for a replay (`workloads.make_job`'s format).

    `start="recorded"`: each sibling waits its recorded start offset (divided
    by `time_scale`, wall seconds) before its first call (`start_offsets`);
    `"together"`: all start at once.
    """
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
        "start_offsets": [s.start_s / time_scale for s in rp.siblings]
        if start == "recorded"
        else None,
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
