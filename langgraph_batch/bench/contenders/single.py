"""W7's contenders: one tool-free model call per document, all at once.

- `abatch-bounded`: `ChatOpenAI.abatch(inputs, config={"max_concurrency": 64})`.
- `abatch`: the same, unbounded.
- `langgraph-batch`: `BatchedChatModel.abatch(inputs)`, library defaults (the
  scheduler sends these tool-free single-turn requests together through
  `/v1/chat/completions/batch`).
- `langgraph-batch-fan-out`: `fan_out` over a one-node subgraph calling the
  same `BatchedChatModel`.
- `langgraph-batch-nobatch` (diagnostic): `BatchedChatModel.abatch` with the
  scheduler's HTTP batching off (`max_batch_size=1`), to show what batching
  adds or costs.

Every answer is forced to the workload's length (`max_tokens` +
`ignore_eos`, the same on the emulator and on a live server), so the
comparison is of the clients alone. A callback records each call's start
and end in the timeline.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypedDict
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from langgraph_batch.bench.contenders._common import RECORDER, emit, read_job, run_measured

BOUNDED_CONCURRENCY = 64


class _Timeline(AsyncCallbackHandler):
    """`llm_start`/`llm_end` of each item, found by the `index` in its run metadata."""

    def __init__(self) -> None:
        self.runs: dict[UUID, int] = {}

    async def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[Any]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        index = int((metadata or {}).get("index", -1))
        self.runs[run_id] = index
        RECORDER.event(index, "start")
        RECORDER.event(index, "llm_start")

    async def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        index = self.runs.pop(run_id, -1)
        RECORDER.event(index, "llm_end")
        RECORDER.done(index)


def _messages(job: dict[str, Any], index: int) -> list[Any]:
    return [SystemMessage(job["system_prompt"]), HumanMessage(job["tasks"][index])]


def _answer_options(job: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    extra: dict[str, Any] = {"ignore_eos": True}
    if job.get("emulator_options"):
        extra["emulator"] = job["emulator_options"]
    return int(job["answer_tokens"]), extra


def make_chat_openai(job: dict[str, Any]) -> Any:
    """ChatOpenAI for the documents, answers forced to the workload's length."""
    from langchain_openai import ChatOpenAI

    max_tokens, extra = _answer_options(job)
    return ChatOpenAI(
        model=job["model"],
        base_url=job["llm_url"].rstrip("/") + "/v1",
        api_key="x",  # type: ignore[arg-type]
        temperature=0.0,
        max_tokens=max_tokens,  # type: ignore[call-arg]
        timeout=600.0,
        max_retries=2,
        extra_body=extra,
    )


def make_batched(job: dict[str, Any], *, batching: bool = True) -> Any:
    """BatchedChatModel for the documents (library defaults; `batching=False`: diagnostic)."""
    from langgraph_batch.chat_model import BatchedChatModel

    max_tokens, extra = _answer_options(job)
    url = job.get("lgb_url") or f"{job.get('flavor') or 'vllm'}://{job['llm_url'].split('://')[1]}"
    options: dict[str, Any] = {
        "model": job["model"],
        "base_url": url,
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "extra_body": extra,
    }
    model = BatchedChatModel(**options)
    if not batching:
        policy = dataclasses.replace(model.default_policy(), max_batch_size=1)
        model = BatchedChatModel(**options, policy=policy)
    return model


class _State(TypedDict, total=False):
    tasks: list[dict[str, Any]]
    results: list[Any]


class _ItemState(TypedDict, total=False):
    index: int
    answer: str


def _record(index: int, msg: Any) -> None:
    RECORDER.llm_calls += 1
    usage = getattr(msg, "usage_metadata", None) or {}
    RECORDER.output("answer", usage.get("output_tokens"))
    text = msg.content if isinstance(msg, AIMessage) and isinstance(msg.content, str) else ""
    RECORDER.done(index, text)


def build_fan_out(job: dict[str, Any], llm: Any) -> Any:
    """A parent graph with one `fan_out` node over a one-node subgraph calling `llm`."""
    from langgraph.graph import END, START, StateGraph

    from langgraph_batch.nodes.fan_out import fan_out

    async def extract(state: _ItemState) -> dict[str, Any]:
        index = state["index"]
        RECORDER.event(index, "start")
        RECORDER.event(index, "llm_start")
        msg = await llm.ainvoke(_messages(job, index))
        RECORDER.event(index, "llm_end")
        _record(index, msg)
        return {"answer": msg.content}

    sub = StateGraph(_ItemState)
    sub.add_node("extract", extract)
    sub.add_edge(START, "extract")
    sub.add_edge("extract", END)
    item_graph = sub.compile(name="extract")

    g = StateGraph(_State)
    g.add_node(
        "docs",
        fan_out(
            item_graph,
            items="tasks",
            into="results",
            make_input=lambda item, index: {"index": item["index"]},
            result=lambda state: state.get("answer"),
        ),
    )
    g.add_edge(START, "docs")
    g.add_edge("docs", END)
    return g.compile()


def main() -> None:
    """Run the job on stdin and print its result line (`python -m ...single`)."""
    job = read_job()
    name = job["contender"]
    if name in ("abatch", "abatch-bounded"):
        llm = make_chat_openai(job)
    else:
        llm = make_batched(job, batching=name != "langgraph-batch-nobatch")

    async def run(job: dict[str, Any]) -> None:
        n = len(job["tasks"])
        if name == "langgraph-batch-fan-out":
            graph = build_fan_out(job, llm)
            await graph.ainvoke({"tasks": [{"index": i} for i in range(n)]})
            return
        handler = _Timeline()
        configs: list[Any] = [{"metadata": {"index": i}, "callbacks": [handler]} for i in range(n)]
        if name == "abatch-bounded":
            for c in configs:
                c["max_concurrency"] = BOUNDED_CONCURRENCY
        outs = await llm.abatch(
            [_messages(job, i) for i in range(n)], config=configs, return_exceptions=True
        )
        for i, out in enumerate(outs):
            if isinstance(out, BaseException):
                RECORDER.failed(i, f"{type(out).__name__}: {out}")
            else:
                _record(i, out)

    async def teardown() -> None:
        if name.startswith("langgraph-batch"):
            await llm.get_scheduler().aclose()

    emit(run_measured(job, run, teardown=teardown))


if __name__ == "__main__":
    main()
