"""Contenders `naive` and `naive-bounded`: LangGraph `Send` map-reduce with ChatOpenAI.

Written as the LangGraph docs teach it: a conditional edge returns one `Send`
per task to a node that runs the ReAct subgraph; `naive-bounded` passes
`max_concurrency` in the run config (held across tool waits, as LangGraph does).
With several replicas (W4) each call goes to the next replica's URL in turn,
as a round-robin load balancer in front of them would send it.
"""

from __future__ import annotations

import hashlib
from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Send

from langgraph_batch.bench.contenders._common import RECORDER, emit, read_job, run_measured
from langgraph_batch.bench.contenders._graph import (
    ParentState,
    build_agent,
    initial_messages,
    record_tool_call,
    turns_of,
)


def build(job: dict[str, Any], llm: Any, tools: list[Any], answer_llm: Any = None) -> Any:
    """The parent graph: Send one branch per task to the agent subgraph."""
    tool_node = ToolNode(tools, awrap_tool_call=record_tool_call) if tools else _no_tools()
    agent = build_agent(
        llm, tool_node, answer_llm=answer_llm, turns=turns_of(job), per_sibling=_session(job)
    )

    async def run_agent(state: dict[str, Any]) -> dict[str, Any]:
        index = state["index"]
        try:
            out = await agent.ainvoke({"messages": initial_messages(job, index), "index": index})
        except Exception as exc:
            RECORDER.failed(index, exc)
            raise
        return {"results": [{"index": index, "answer": out.get("answer")}]}

    def fan(state: ParentState) -> list[Send]:
        return [Send("agent", {"index": t["index"]}) for t in state["tasks"]]

    g = StateGraph(ParentState)
    g.add_node("agent", run_agent)  # type: ignore[type-var]
    g.add_conditional_edges(START, fan, ["agent"])
    g.add_edge("agent", END)
    return g.compile()


def _session(job: dict[str, Any]) -> Any:
    """Through a router (`-router` contenders): each agent's calls carry its program id.

    What a user does for vllm-router's program scheduling against stock vLLM: one
    `X-Session-ID` per agent (`ChatOpenAI.bind(extra_headers=...)`), here a digest
    of the agent's task standing in for a task id.
    """
    header = job.get("session_header")
    if not header:
        return None
    ids = [session_id(task) for task in job["tasks"]]
    return lambda llm, index: llm.bind(extra_headers={header: ids[index]})


def session_id(task: str) -> str:
    """An agent's program id for `X-Session-ID`: a digest of its task (a task id's stand-in)."""
    return "agent-" + hashlib.blake2b(task.encode(), digest_size=8).hexdigest()


def _no_tools() -> Any:
    def unreachable(state: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the model called a tool but the workload offers none")

    return unreachable


def make_llm(job: dict[str, Any], url: str | None = None, *, answer: bool = False) -> Any:
    """ChatOpenAI pointed at the server, as a user would configure it.

    `answer=True`: the forced answer turn's model (None when shapes are not forced).
    """
    from langchain_openai import ChatOpenAI

    from langgraph_batch.bench.contenders._graph import forced_answer_options

    extra = {"emulator": job["emulator_options"]} if job.get("emulator_options") else None
    max_tokens = job["max_tokens"]
    if answer:
        forced = forced_answer_options(job | {"extra_body": extra})
        if forced is None:
            return None
        max_tokens, extra = forced["max_tokens"], forced["extra_body"]
    return ChatOpenAI(
        model=job["model"],
        base_url=(url or job["llm_url"]).rstrip("/") + "/v1",
        api_key=job.get("api_key") or "x",  # type: ignore[arg-type]
        temperature=0.0,
        max_tokens=max_tokens,  # type: ignore[call-arg]
        timeout=600.0,
        max_retries=2,
        extra_body=extra,
    )


def round_robin(llms: list[Any]) -> Any:
    """One model over several replicas, each call to the next one (a plain load balancer)."""
    if len(llms) == 1:
        return llms[0]
    import itertools

    from langchain_core.runnables import RunnableLambda

    counter = itertools.count()

    async def balanced(messages: Any) -> Any:
        return await llms[next(counter) % len(llms)].ainvoke(messages)

    return RunnableLambda(balanced, name="round_robin")


def main() -> None:
    """Run the job on stdin and print its result line (`python -m ...naive`)."""
    job = read_job()
    from langgraph_batch.bench.contenders._graph import (
        bind,
        bind_answer,
        make_http_client,
        make_tools,
        start_order,
    )

    client = make_http_client()

    async def run(job: dict[str, Any]) -> None:
        tools = make_tools(job, client)
        # Through a router (`model_url`), every call goes to its one URL.
        urls = (
            [job["model_url"]] if job.get("model_url") else job.get("llm_urls") or [job["llm_url"]]
        )
        llm = round_robin([bind(make_llm(job, u), tools, job) for u in urls])
        answer_llm = None
        if job.get("forced_shapes"):
            answer_llm = round_robin(
                [bind_answer(make_llm(job, u, answer=True), tools) for u in urls]
            )
        graph = build(job, llm, tools, answer_llm)
        config: dict[str, Any] = {"recursion_limit": 10_000}
        if job.get("max_concurrency"):
            config["max_concurrency"] = int(job["max_concurrency"])
        tasks = [{"index": i} for i in start_order(job)]
        await graph.ainvoke({"tasks": tasks, "results": []}, config)

    emit(run_measured(job, run, teardown=client.aclose))


if __name__ == "__main__":
    main()
