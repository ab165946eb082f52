"""What the emulated model says: the `echo` and `agent` scenarios.

Everything here is deterministic: the same conversation, tools, schema and
options always give the same output (seeded by a hash of the input), so
identical siblings produce identical tool calls and answers.

- `echo`: the last user message's words, repeated to the requested length.
- `agent`: while tools are offered and the conversation holds fewer tool
  results than `turns - 1`, one tool call whose arguments satisfy the tool's
  JSON schema; otherwise a final answer of `output_tokens` tokens, or JSON
  valid for `response_format`'s schema. String arguments are the `key=<value>`
  marker of the last user message (else a short hash of it) on the first call,
  and `<key>.<n>` on the n-th later one: a real agent rarely repeats a call,
  so only siblings at the same step of the same task ask the same question
  (an enum that lists the value picks it). Markers in the last user message
  shape one conversation (a long-horizon agent): `turns=<n>` overrides the
  server's `turns`; `think=<lo>-<hi>` puts a line of assistant text of
  lo..hi tokens (drawn per turn, seeded by the conversation) before each tool
  call, as agents reason before they act.

Lengths follow vLLM's sampling parameters (`fit_length`): `max_tokens` cuts
(finish reason `length`); `ignore_eos` makes the output exactly `max_tokens`
long and `min_tokens` at least that long. Free text goes on with more
words; a tool call or schema-constrained JSON is complete, so the model can
only emit end-of-sequence tokens, which count as generated tokens but are
not in the text (vLLM skips special tokens): the JSON stays valid.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from langgraph_batch.emulator.tokenizer import render_tool_call, split_pieces

__all__ = (
    "Plan",
    "ScenarioOptions",
    "ToolCallPlan",
    "call_key",
    "fit_length",
    "plan_chat",
    "plan_text",
    "value_for_schema",
)

_DC_KWARGS: dict[str, bool] = {"frozen": True, "slots": True, "kw_only": True}
_WORDS_TEXT = (
    "the of and to in is it for on as with at by from this that are was be or an not "
    "can all one has more its new but out use may will any each our two how who way "
    "step tool data plan task test note fact then next last also most good done ok "
    "find read call list map set run send keep sort pick load save show"
)
_WORDS = tuple(_WORDS_TEXT.split())
_KEY_RE = re.compile(r"\bkey=([^\s,;]+)")
_TOOL_RE = re.compile(r"\btool=([A-Za-z0-9_.\-]+)")
_TURNS_RE = re.compile(r"\bturns=(\d{1,4})\b")
_THINK_RE = re.compile(r"\bthink=(\d{1,5})(?:-(\d{1,5}))?\b")


@dataclass(**_DC_KWARGS)
class ScenarioOptions:
    """Per-request scenario settings (server defaults, overridden per request)."""

    scenario: str = "agent"
    """`agent` or `echo`."""
    output_tokens: int = 64
    """Length of a final answer (agent) or of the text (echo)."""
    turns: int = 2
    """Model calls per agent conversation: turns-1 tool calls, then the answer."""
    repeat_tool_args: bool = False
    """Every tool call repeats the first one's arguments (else `<key>.<n>` on the n-th later)."""
    seed: int = 0


@dataclass(**_DC_KWARGS)
class ToolCallPlan:
    """One tool call the model will make."""

    id: str
    name: str
    arguments: str


@dataclass(**_DC_KWARGS)
class Plan:
    """A decided model output."""

    text: str
    """The raw text the model generates (what its tokens spell)."""
    content: str | None
    """`message.content` (None for a pure tool call)."""
    tool_calls: tuple[ToolCallPlan, ...] = ()
    finish_reason: str = "stop"
    pieces: tuple[str, ...] = ()
    """The generated text split into tokens (for streaming)."""
    structured: bool = False
    """A tool call or schema-constrained JSON: complete, nothing may follow it."""
    hidden_tokens: int = 0
    """End-of-sequence tokens generated after the text (`ignore_eos`, `min_tokens`):
    counted in usage, absent from the text."""

    @property
    def num_tokens(self) -> int:
        """Tokens this output generates (text pieces plus hidden ones)."""
        return len(self.pieces) + self.hidden_tokens


_encode_str = json.encoder.encode_basestring_ascii


def _seed_for(*parts: object) -> int:
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        # Same bytes as json.dumps(p) for the common str/int parts, without
        # building a JSONEncoder per call.
        if isinstance(p, str):
            raw = _encode_str(p)
        elif isinstance(p, int) and not isinstance(p, bool):
            raw = str(p)
        else:
            raw = json.dumps(p, sort_keys=True, default=str)
        h.update(raw.encode())
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "big")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, Mapping) and p.get("type") == "text"
        )
    return ""


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of the last user message ('' when there is none)."""
    for m in reversed(messages):
        if m.get("role") == "user":
            return _text_of(m.get("content"))
    return ""


def key_of(text: str) -> str:
    """The `key=<value>` marker of `text`, else a short stable hash of it."""
    m = _KEY_RE.search(text)
    if m:
        return m.group(1)
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def words_text(n_tokens: int, rng: random.Random, *, lead: str = "") -> str:
    """Text of exactly `n_tokens` tokens (lead text counts, and is cut if longer)."""
    pieces = split_pieces(lead)[:n_tokens] if lead else []
    while len(pieces) < n_tokens:
        pieces.append(" " + rng.choice(_WORDS))
    text = "".join(pieces)
    if text.startswith(" ") and not lead:
        text = text[1:]
    return text


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    for _ in range(32):
        if not isinstance(ref, str) or not ref.startswith("#/"):
            break
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, Mapping) else {}
        schema = node if isinstance(node, Mapping) else {}
        ref = schema.get("$ref")
    return schema


def value_for_schema(
    schema: Mapping[str, Any],
    *,
    key: str,
    rng: random.Random,
    root: Mapping[str, Any] | None = None,
    depth: int = 0,
) -> Any:
    """A value valid for a JSON schema (the subset tool and response schemas use).

    Strings are `key` (padded or cut to min/maxLength); enums pick a member
    deterministically; objects fill every property; arrays get
    max(1, minItems) items.
    """
    root = schema if root is None else root
    schema = _resolve(schema, root)
    if depth > 12:
        return None
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        options = list(schema["enum"])
        if key in options:  # the model follows its task's key when it may
            return key
        return options[rng.randrange(len(options))]
    for combo in ("anyOf", "oneOf", "allOf"):
        alts = schema.get(combo)
        if isinstance(alts, list) and alts:
            non_null = [a for a in alts if _resolve(a, root).get("type") != "null"]
            if combo == "allOf":
                merged: dict[str, Any] = {}
                for a in alts:
                    merged.update(_resolve(a, root))
                return value_for_schema(merged, key=key, rng=rng, root=root, depth=depth + 1)
            return value_for_schema(
                (non_null or alts)[0], key=key, rng=rng, root=root, depth=depth + 1
            )
    typ = schema.get("type")
    if isinstance(typ, list):
        typ = next((t for t in typ if t != "null"), "null")
    if typ is None:
        typ = "object" if "properties" in schema else "string"
    if typ == "object":
        props: Mapping[str, Any] = schema.get("properties") or {}
        out: dict[str, Any] = {}
        for name, sub in props.items():
            out[name] = value_for_schema(sub, key=key, rng=rng, root=root, depth=depth + 1)
        for name in schema.get("required") or ():
            if name not in out:
                out[name] = key
        return out
    if typ == "array":
        items = schema.get("items") or {"type": "string"}
        n = max(1, int(schema.get("minItems", 1)))
        if "maxItems" in schema:
            n = min(n, int(schema["maxItems"]))
        return [
            value_for_schema(items, key=key, rng=rng, root=root, depth=depth + 1) for _ in range(n)
        ]
    if typ == "string":
        s = key
        lo = int(schema.get("minLength", 0))
        if len(s) < lo:
            s = (s + "-" + "x" * lo)[:lo] if s else "x" * lo
        if "maxLength" in schema:
            s = s[: int(schema["maxLength"])]
        return s
    if typ in ("integer", "number"):
        lo = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        hi = schema.get("maximum", schema.get("exclusiveMaximum", lo + 100))
        lo_i, hi_i = int(lo), int(hi)
        if "exclusiveMinimum" in schema:
            lo_i += 1
        if "exclusiveMaximum" in schema:
            hi_i -= 1
        v = rng.randint(lo_i, max(lo_i, hi_i))
        return v if typ == "integer" else float(v)
    if typ == "boolean":
        return True
    return None


def _choose_tool(
    tools: Sequence[Mapping[str, Any]], tool_choice: Any, user_text: str
) -> Mapping[str, Any] | None:
    def fn(t: Mapping[str, Any]) -> Mapping[str, Any]:
        f = t.get("function", t)
        return f if isinstance(f, Mapping) else {}

    if isinstance(tool_choice, Mapping):
        wanted = (tool_choice.get("function") or {}).get("name")
        return next((fn(t) for t in tools if fn(t).get("name") == wanted), None)
    m = _TOOL_RE.search(user_text)
    if m:
        named = next((fn(t) for t in tools if fn(t).get("name") == m.group(1)), None)
        if named is not None:
            return named
    return fn(tools[0]) if tools else None


def _schema_of(response_format: Any) -> Mapping[str, Any] | None:
    if not isinstance(response_format, Mapping):
        return None
    kind = response_format.get("type")
    if kind == "json_schema":
        js = response_format.get("json_schema") or {}
        schema = js.get("schema") if isinstance(js, Mapping) else None
        return schema if isinstance(schema, Mapping) else {"type": "object"}
    if kind == "json_object":
        return {"type": "object", "properties": {"answer": {"type": "string"}}}
    return None


def _turns_of(user: str, default: int) -> int:
    """The conversation's own `turns=<n>` marker, else the server's setting."""
    m = _TURNS_RE.search(user)
    return max(1, int(m.group(1))) if m else default


def _think_text(user: str, rng: random.Random) -> str:
    """The assistant text before a tool call (`think=<lo>-<hi>` tokens), '' without the marker."""
    m = _THINK_RE.search(user)
    if m is None:
        return ""
    lo = int(m.group(1))
    hi = int(m.group(2)) if m.group(2) else lo
    n = rng.randint(min(lo, hi), max(lo, hi))
    return words_text(n, rng, lead="Next:") if n > 0 else ""


def call_key(key: str, calls_before: int) -> str:
    """The argument value of a conversation's tool call after `calls_before` earlier ones."""
    return key if calls_before == 0 else f"{key}.{calls_before}"


def plan_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any,
    response_format: Any,
    options: ScenarioOptions,
) -> Plan:
    """Decide what the model answers to a chat request (before max_tokens)."""
    user = last_user_text(messages)
    key = key_of(user)
    rng = random.Random(_seed_for(options.seed, user, len(messages), options.scenario))
    tools = list(tools or ())
    if tool_choice == "none":
        tools = []
    n_tool_results = sum(1 for m in messages if m.get("role") == "tool")
    forced = tool_choice == "required" or isinstance(tool_choice, Mapping)
    turns = _turns_of(user, options.turns)
    if tools and (forced or (options.scenario == "agent" and n_tool_results < turns - 1)):
        tool = _choose_tool(tools, tool_choice, user)
        if tool is not None:
            params = tool.get("parameters") or {"type": "object", "properties": {}}
            calls_before = 0 if options.repeat_tool_args else n_tool_results
            args = value_for_schema(params, key=call_key(key, calls_before), rng=rng)
            arguments = json.dumps(args if isinstance(args, dict) else {})
            name = str(tool.get("name", ""))
            call = ToolCallPlan(
                id=f"chatcmpl-tool-{uuid.uuid4().hex}", name=name, arguments=arguments
            )
            think = _think_text(user, rng) if options.scenario == "agent" else ""
            # The chat template renders an assistant turn as its content, a newline,
            # then the call: generate the same text so the next turn's prompt reuses it.
            text = render_tool_call(name, arguments)
            if think:
                text = f"{think}\n{text}"
            return Plan(
                text=text,
                content=think or None,
                tool_calls=(call,),
                finish_reason="tool_calls",
                pieces=tuple(split_pieces(text)),
                structured=True,
            )
    schema = _schema_of(response_format)
    if schema is not None:
        text = json.dumps(value_for_schema(schema, key=key, rng=rng))
        return Plan(text=text, content=text, pieces=tuple(split_pieces(text)), structured=True)
    if options.scenario == "echo":
        text = echo_text(user, options.output_tokens)
    else:
        text = words_text(options.output_tokens, rng, lead=f"Final answer for {key}:")
    return Plan(text=text, content=text, pieces=tuple(split_pieces(text)))


def echo_text(source: str, n_tokens: int) -> str:
    """`source`'s tokens repeated to exactly `n_tokens` tokens."""
    pieces = split_pieces(source) or ["echo"]
    out = [pieces[i % len(pieces)] for i in range(max(0, n_tokens))]
    return "".join(out)


def plan_text(prompt: str, *, options: ScenarioOptions, max_tokens: int | None) -> Plan:
    """Decide a plain completion (`/v1/completions`, SGLang `/generate`)."""
    n = options.output_tokens if max_tokens is None else max_tokens
    if options.scenario == "echo":
        text = echo_text(prompt, n)
    else:
        rng = random.Random(_seed_for(options.seed, prompt, "completion"))
        text = words_text(n, rng)
    return Plan(text=text, content=text, pieces=tuple(split_pieces(text)))


def truncate(plan: Plan, max_tokens: int) -> Plan:
    """The plan cut to `max_tokens` tokens (finish_reason `length`, no tool calls)."""
    if len(plan.pieces) <= max_tokens:
        return plan
    pieces = plan.pieces[:max_tokens]
    text = "".join(pieces)
    return Plan(text=text, content=text, finish_reason="length", pieces=pieces)


def fit_length(
    plan: Plan,
    *,
    max_tokens: int,
    ignore_eos: bool = False,
    min_tokens: int = 0,
    seed: object = "",
) -> Plan:
    """The plan under vLLM's length parameters.

    `max_tokens` cuts (finish reason `length`). With `ignore_eos` the output
    is exactly `max_tokens` tokens, with `min_tokens` at least that many: free
    text goes on with more words (seeded by `seed`); a structured output (a
    tool call, schema JSON) is complete, so the rest are end-of-sequence
    tokens, generated and counted but not in the text, as vLLM skips special
    tokens. Reaching `max_tokens` under `ignore_eos` ends with finish reason
    `length` (a parsed tool call keeps `tool_calls`, as vLLM reports it).

    Example:
        ```python
        plan = fit_length(plan, max_tokens=200, ignore_eos=True)
        assert plan.num_tokens == 200
        ```
    """
    plan = truncate(plan, max_tokens)
    target = max_tokens if ignore_eos else min(max(min_tokens, 0), max_tokens)
    missing = target - plan.num_tokens
    if missing <= 0:
        # Under ignore_eos an answer ends only at max_tokens: even one whose
        # natural length was exactly max_tokens reports `length`, as vLLM does.
        if ignore_eos and not plan.tool_calls and plan.finish_reason != "length":
            plan = replace(plan, finish_reason="length")
        return plan
    if plan.structured:
        plan = replace(plan, hidden_tokens=plan.hidden_tokens + missing)
    else:
        rng = random.Random(_seed_for("more", plan.text, seed))
        pieces = plan.pieces + tuple(" " + rng.choice(_WORDS) for _ in range(missing))
        text = "".join(pieces)
        plan = replace(plan, text=text, content=text, pieces=pieces)
    if ignore_eos and not plan.tool_calls:
        plan = replace(plan, finish_reason="length")
    return plan
