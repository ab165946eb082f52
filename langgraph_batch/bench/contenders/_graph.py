"""The sibling agent every LangGraph contender runs: a ReAct-style subgraph.

`model -> (tools -> model)* -> finish`, the way the LangGraph docs teach it:
the model node calls a chat model with the tools bound, `tools_condition`
routes tool calls to a tool node, and `finish` records the sibling's answer.
The contenders differ only in the chat model, the tool node and how the
siblings are fanned out, so the comparison is of those parts alone.

Forced shapes (`job["forced_shapes"]`, used against live servers, where the
model may have random weights): the tool turn names its tool in
`tool_choice` and the tool's one argument is an enum of the workload's keys
(structured outputs make any model produce a valid call); the answer turn
has `tool_choice="none"`, `max_tokens` = the workload's answer length and
`ignore_eos`, so every answer is exactly that long.

Every sibling's timeline goes to `RECORDER.events`: `start`, each model
call's `llm_start`/`llm_end`, each tool call's `tool_start`/`tool_end`.

Replays (`langgraph-batch bench --replay`, `job["replay_calls"]`): each
model call of sibling i's turn k is bound to that call's recorded output
length (`max_tokens` + `ignore_eos`, which any vLLM honours), and with
forced shapes the plan, not a turn count, says which call is the answer.
A recorded reset or compaction is a step of its call (`keep`, `text`): the
sibling's conversation drops to its first `keep` messages and a user
message `text` follows, before the call; the state keeps the result, so the
turns after it grow from there (the server sees the recorded prefix reuse).
A sibling's recorded start offset (`job["start_offsets"]`, wall seconds
from the run's start) delays its first model call; see `wait_start`.
"""

from __future__ import annotations

import asyncio
import json
import operator
import time
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypedDict

import httpx
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages
from langgraph.prebuilt import tools_condition
from pydantic import BaseModel, Field, create_model

from langgraph_batch.bench.contenders._common import RECORDER

FORCED_KEYS: dict[int, str] = {}
"""Forced shapes with per-sibling keys (`job["task_keys"]`; `bind` sets it): sibling ->
its key. Its n-th tool call (n earlier ones) is pinned to `call_key(key, n)`, the
emulated model's convention, by `forced_call_options`."""

REPLAY_CALLS: dict[int, list[dict[str, Any]]] = {}
"""The run's per-call plan of a replay (`bind` sets it from the job; empty otherwise):
sibling -> one `{"max_tokens": int, "answer": bool}` per model call, with `keep`
(messages kept) and `text` (the new user message) on a reset."""

REPLAY_STARTS: dict[int, float] = {}
"""A replay's start offsets (`bind` sets it from `job["start_offsets"]`): sibling ->
wall seconds after the run's start before its first model call."""


class AgentState(TypedDict, total=False):
    """State of one sibling."""

    messages: Annotated[list[AnyMessage], add_messages]
    index: int
    answer: str
    calls: int
    """Model calls made so far (a reset drops earlier replies: they cannot be counted)."""


class ParentState(TypedDict, total=False):
    """State of the parent map-reduce graph."""

    tasks: list[dict[str, Any]]
    results: Annotated[list[dict[str, Any]], operator.add]


def initial_messages(job: dict[str, Any], index: int) -> list[AnyMessage]:
    """System prompt (shared) plus the sibling's task."""
    return [SystemMessage(job["system_prompt"]), HumanMessage(job["tasks"][index])]


def make_http_client() -> httpx.AsyncClient:
    """One client for all tool calls of the run (the tool service caps concurrency)."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(300.0),
        limits=httpx.Limits(max_connections=4096, max_keepalive_connections=512),
    )


def make_tools(job: dict[str, Any], client: httpx.AsyncClient) -> list[BaseTool]:
    """LangChain tools that call the benchmark's tool service over HTTP."""
    tools: list[BaseTool] = []
    # Forced shapes: an enum of the keys, or (per-sibling keys) any string, the call's
    # value being pinned per call (`forced_call_options`): the tools render the same for
    # every sibling and turn, so the shared prefix stays one.
    keys = job.get("tool_keys") if job.get("forced_shapes") and not job.get("task_keys") else None
    for spec in job["tools"]:
        name: str = spec["name"]
        arg: str = spec["arg"]
        url = f"{job['tool_url']}/tools/{name}"
        kind: Any = Literal[tuple(keys)] if keys else str  # an enum of the keys when forced
        fields: dict[str, Any] = {arg: (kind, Field(description=spec.get("arg_description", arg)))}
        schema: type[BaseModel] = create_model(f"{name}_args", **fields)

        def _factory(url: str = url) -> Callable[..., Any]:
            async def call(**kwargs: Any) -> str:
                resp = await client.post(url, json={"args": kwargs})
                resp.raise_for_status()
                result: str = resp.json()["result"]
                return result

            return call

        tools.append(
            StructuredTool.from_function(
                coroutine=_factory(),
                name=name,
                description=spec["description"],
                args_schema=schema,
            )
        )
    return tools


def answer_text(msg: AIMessage) -> str:
    """The final answer as text (structured output parsed or raw)."""
    parsed = msg.additional_kwargs.get("parsed")
    if parsed is not None:
        return json.dumps(parsed if isinstance(parsed, dict) else str(parsed))
    content = msg.content
    return content if isinstance(content, str) else json.dumps(content)


def _output_tokens(msg: Any) -> int | None:
    usage = getattr(msg, "usage_metadata", None)
    if usage and usage.get("output_tokens") is not None:
        return int(usage["output_tokens"])
    return None


async def record_tool_call(request: Any, execute: Any) -> Any:
    """`awrap_tool_call` hook: the tool call's span in the calling sibling's timeline."""
    state = request.state if isinstance(request.state, dict) else {}
    index = state.get("index", -1)
    RECORDER.event(index, "tool_start")
    try:
        return await execute(request)
    finally:
        RECORDER.event(index, "tool_end")


async def wait_start(offset: float) -> None:
    """Wait until `offset` wall seconds after the run's start (a replayed start offset).

    Inside a fan_out the wait counts as a tool wait to the admission gate: the
    sibling gives up its active place while it waits (`tool_enter`) and asks
    for it back, as a sibling returning from a tool, when its time comes; the
    gate may pause its KV booking meanwhile (a long wait goes first). The
    contenders order their siblings by start offset, so a waiting sibling
    never holds a concurrency slot (LangGraph's `max_concurrency`, a FIFO
    semaphore) that a sibling due earlier is waiting for.
    """
    from langgraph_batch._context import current_sibling

    delay = RECORDER.t0 + offset - time.monotonic()
    if delay <= 0:
        return
    sibling = current_sibling()
    if sibling is None:
        await asyncio.sleep(delay)
        return
    await sibling.tool_enter("replay-start")
    try:
        await asyncio.sleep(delay)
    except asyncio.CancelledError:
        sibling.tool_abandon()
        raise
    await sibling.tool_exit()


def start_order(job: dict[str, Any]) -> list[int]:
    """The siblings in the order they start (by `job["start_offsets"]`, stable)."""
    n = len(job["tasks"])
    offsets = job.get("start_offsets") or [0.0] * n
    return sorted(range(n), key=lambda i: offsets[i] if i < len(offsets) else 0.0)


def turns_of(job: dict[str, Any]) -> int | list[int]:
    """Each sibling's model calls (`turns_per_task`), else the job's one count.

    With forced shapes the client, not the model, ends a sibling (the answer turn
    after `turns - 1` tool results), so long-horizon siblings need their own counts.
    """
    per = job.get("turns_per_task")
    if per and len(per) == len(job.get("tasks") or ()):
        return [int(t) for t in per]
    return int(job["turns"])


def build_agent(
    llm: Any,
    tool_node: Any,
    *,
    name: str = "agent",
    answer_llm: Any = None,
    turns: int | Sequence[int] = 2,
    per_sibling: Callable[[Any, int], Any] | None = None,
) -> Any:
    """Compile the sibling subgraph around a tool-bound chat model and a tool node.

    With `answer_llm` (forced shapes) the model calls after `turns - 1` tool
    results use it; the others use `llm`. `turns` is one count for every
    sibling or one per sibling (long-horizon workloads). `per_sibling(model,
    index)` adapts the model to a sibling before each call (a router contender
    binds its `X-Session-ID` header there).
    """

    async def model(state: AgentState) -> dict[str, Any]:
        index = state["index"]
        messages = state["messages"]
        tool_results = sum(1 for m in messages if isinstance(m, ToolMessage))
        turn = state.get("calls", 0)
        if turn == 0:
            if REPLAY_STARTS.get(index):
                await wait_start(REPLAY_STARTS[index])
            RECORDER.event(index, "start")
        own = turns if isinstance(turns, int) else turns[index]
        answering = answer_llm is not None and tool_results >= own - 1
        chosen = answer_llm if answering else llm
        plan = REPLAY_CALLS.get(index)
        update: list[Any] = []  # RemoveMessage, then the kept messages
        if plan is not None and turn < len(plan):
            call = plan[turn]
            if answer_llm is not None:
                chosen = answer_llm if call["answer"] else llm
            chosen = chosen.bind(max_tokens=call["max_tokens"], extra_body={"ignore_eos": True})
            if call.get("keep") is not None:  # a recorded reset: keep a prefix, then new text
                messages = [*messages[: call["keep"]], HumanMessage(call["text"])]
                update = [RemoveMessage(id=REMOVE_ALL_MESSAGES), *messages]
        if not answering and index in FORCED_KEYS and (plan is None or turn >= len(plan)):
            chosen = chosen.bind(**forced_call_options(FORCED_KEYS[index], tool_results))
        if per_sibling is not None:
            chosen = per_sibling(chosen, index)
        RECORDER.event(index, "llm_start")
        msg = await chosen.ainvoke(messages)
        RECORDER.event(index, "llm_end")
        RECORDER.llm_calls += 1
        calls = getattr(msg, "tool_calls", None) or []
        RECORDER.tool_calls_requested += len(calls)
        RECORDER.output("tool" if calls else "answer", _output_tokens(msg))
        for call in calls:
            RECORDER.tool_args.extend(str(v) for v in (call.get("args") or {}).values())
        return {"messages": [*update, msg], "calls": turn + 1}

    def finish(state: AgentState) -> dict[str, Any]:
        last = state["messages"][-1]
        text = answer_text(last) if isinstance(last, AIMessage) else str(last.content)
        RECORDER.done(state["index"], text)
        return {"answer": text}

    def route(state: AgentState) -> str:
        return "tools" if tools_condition(dict(state)) == "tools" else "finish"

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", tool_node)
    g.add_node("finish", finish)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["tools", "finish"])
    g.add_edge("tools", "model")
    g.add_edge("finish", END)
    return g.compile(name=name)


def bind(llm: BaseChatModel, tools: Sequence[BaseTool], job: dict[str, Any]) -> Any:
    """Bind the tools (and the final answer's JSON schema, as a user would).

    Forced shapes: the tools with the first one named in `tool_choice`, and
    `strict` so that the arguments follow the tool's schema: vLLM >= 0.32
    with a tool parser forces only the call's envelope (`<tool_call>{"name":
    ..., "arguments": `) for a named `tool_choice`, and pins the arguments'
    schema only for a tool marked strict (its `--tool-strict-level auto`);
    without it a model with random weights writes any JSON value there.
    A replay's per-call plan is taken from the job here (see `REPLAY_CALLS`).
    """
    REPLAY_CALLS.clear()
    REPLAY_CALLS.update(enumerate(job.get("replay_calls") or []))
    REPLAY_STARTS.clear()
    REPLAY_STARTS.update(enumerate(job.get("start_offsets") or []))
    FORCED_KEYS.clear()
    if job.get("forced_shapes") and job.get("task_keys") and tools:
        FORCED_KEYS.update(enumerate(job["task_keys"]))
    if job.get("forced_shapes") and tools:
        return llm.bind_tools(list(tools), tool_choice=tools[0].name, strict=True)
    schema = job.get("response_schema")
    if not tools:
        if schema:
            return llm.bind(response_format=_response_format(schema))
        return llm
    if schema:
        return llm.bind_tools(list(tools), response_format=_response_format(schema), strict=True)
    return llm.bind_tools(list(tools))


def bind_answer(llm: BaseChatModel | None, tools: Sequence[BaseTool]) -> Any:
    """The forced answer turn: the tools still listed (the prompt keeps its prefix), none called.

    `llm` carries the answer length (`max_tokens`, `ignore_eos`); None when
    the shapes are not forced.
    """
    if llm is None:
        return None
    return llm.bind_tools(list(tools), tool_choice="none") if tools else llm


def call_key(key: str, calls_before: int) -> str:
    """A sibling's tool-call argument after `calls_before` earlier calls.

    The emulator's rule: `langgraph_batch.emulator.scenarios.call_key`.
    """
    return key if calls_before == 0 else f"{key}.{calls_before}"


def forced_call_options(key: str, calls_before: int) -> dict[str, Any]:
    """`extra_body` that pins a forced tool call's arguments to `{"<arg>": call_key(...)}`.

    vLLM 0.32 with a tool parser builds the named `tool_choice`'s constraint from
    the tool's schema only when the request has no structural tag of its own
    (`VLLM_ENFORCE_STRICT_TOOL_CALLING=0` on the server, else its own tag, which lets
    a random model pad the JSON with whitespace, replaces it); this one is the exact
    arguments' text, so a model with random weights makes the call a real agent
    would. Servers that do not know `structured_outputs` ignore it (the enum is gone:
    the value is then the model's).
    """
    from langgraph_batch.bench.workloads import TOOL_SPECS

    arguments = json.dumps({TOOL_SPECS[0]["arg"]: call_key(key, calls_before)})
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": arguments}}
    return {"extra_body": {"structured_outputs": {"structural_tag": json.dumps(tag)}}}


def forced_answer_options(job: dict[str, Any]) -> dict[str, Any] | None:
    """`max_tokens` and `extra_body` of the forced answer turn (None when not forced)."""
    if not job.get("forced_shapes"):
        return None
    extra = dict(job.get("extra_body") or {})
    extra["ignore_eos"] = True
    return {"max_tokens": int(job["answer_tokens"]), "extra_body": extra}


def _response_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": {"name": schema.get("title", "Answer"), "schema": schema, "strict": True},
    }
