"""Contender `langgraph-batch`: `fan_out` + `BatchedChatModel` + coalesced tools.

Only the settings a user would choose: the server URL, the model, `max_tokens`;
the tool marked with `coalesce` (its results are the same for every sibling
asking the same question); everything else is the library's default. The
sibling subgraph is the same ReAct graph the `naive` contenders run.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph_batch.bench.contenders._common import emit, read_job, run_measured


class LgbState(TypedDict, total=False):
    """Parent state: the tasks in, the results out (no reducer on `results`)."""

    tasks: list[dict[str, Any]]
    results: list[Any]


def make_llm(job: dict[str, Any], *, answer: bool = False) -> Any:
    """BatchedChatModel pointed at the (emulated) server, as a user would configure it.

    The URL scheme follows the server (`vllm://` or `sglang://`, where the
    scheduler's prefix warming is on by default); several replicas (W4) are a
    host list, `vllm://h1,h2,h3,h4` (an `EndpointPool`, affinity routing by
    default). The `langgraph-batch-rr` contender passes `routing="round_robin"`
    through `backend_from_url`. `answer=True`: the forced answer turn's model
    (None when shapes are not forced); it shares the scheduler of the other.
    """
    from langgraph_batch.backends import backend_from_url
    from langgraph_batch.bench.contenders._graph import forced_answer_options
    from langgraph_batch.chat_model import BatchedChatModel

    extra = {"emulator": job["emulator_options"]} if job.get("emulator_options") else None
    max_tokens = job["max_tokens"]
    if answer:
        forced = forced_answer_options(job | {"extra_body": extra})
        if forced is None:
            return None
        max_tokens, extra = forced["max_tokens"], forced["extra_body"]
    urls = job.get("llm_urls") or [job["llm_url"]]
    hosts = ",".join(u.split("://", 1)[1].rstrip("/") for u in urls)
    url = job.get("lgb_url") or f"{job.get('flavor') or 'vllm'}://{hosts}"
    options: dict[str, Any] = {}
    if job.get("api_key"):  # the demo against a server with a key (never in a bench job)
        options["api_key"] = job["api_key"]
    if job.get("lgb_options"):
        # Diagnostics only (`--lgb-option`, `benchmarks.routers`): the reported runs use
        # the defaults. A `session_affinity` dict holds `SessionConfig` fields.
        options.update(job["lgb_options"])
        if isinstance(options.get("session_affinity"), dict):
            from langgraph_batch.backends import SessionConfig

            fields = dict(options["session_affinity"])
            if "headers" in fields:
                fields["headers"] = tuple(fields["headers"])
            options["session_affinity"] = SessionConfig(**fields)
    # A `policy` dict holds `BatchPolicy` fields over the model's default policy
    # (e.g. `--lgb-option 'policy={"priority": "las"}'`: the ordering measurements).
    policy = options.pop("policy", None)
    if job.get("routing"):
        options["backend"] = backend_from_url(url, routing=job["routing"], timeout=600.0)
    else:
        options["base_url"] = url
    llm = BatchedChatModel(
        model=job["model"],
        temperature=0.0,
        max_tokens=max_tokens,
        extra_body=extra,
        **options,
    )
    if isinstance(policy, dict):
        from dataclasses import replace

        from langgraph_batch import RetryPolicy

        if isinstance(policy.get("retry"), dict):  # JSON from --lgb-option carries no objects
            policy = {**policy, "retry": RetryPolicy(**policy["retry"])}
        llm = llm.model_copy(update={"policy": replace(llm.default_policy(), **policy)})
    return llm


def build(job: dict[str, Any], llm: Any, tools: list[Any], answer_llm: Any = None) -> Any:
    """Parent graph with one fan_out node over the tasks."""
    from langgraph.graph import END, START, StateGraph

    from langgraph_batch.bench.contenders._graph import (
        build_agent,
        initial_messages,
        record_tool_call,
        turns_of,
    )
    from langgraph_batch.nodes.fan_out import fan_out
    from langgraph_batch.tools import BatchToolNode

    tool_node = BatchToolNode(tools, awrap_tool_call=record_tool_call) if tools else _no_tools()
    agent = build_agent(llm, tool_node, answer_llm=answer_llm, turns=turns_of(job))

    def make_input(item: dict[str, Any], index: int) -> dict[str, Any]:
        return {"messages": initial_messages(job, item["index"]), "index": item["index"]}

    g = StateGraph(LgbState)
    g.add_node(
        "agents",
        fan_out(
            agent,
            items="tasks",
            into="results",
            make_input=make_input,
            result=lambda state: state.get("answer"),
        ),
    )
    g.add_edge(START, "agents")
    g.add_edge("agents", END)
    return g.compile()


def _no_tools() -> Any:
    def unreachable(state: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the model called a tool but the workload offers none")

    return unreachable


def main() -> None:
    """Run the job on stdin and print its result line (`python -m ...lgb`)."""
    job = read_job()
    from langgraph_batch.bench.contenders._common import RECORDER
    from langgraph_batch.bench.contenders._graph import (
        bind,
        bind_answer,
        make_http_client,
        make_tools,
        start_order,
    )
    from langgraph_batch.nodes.fan_out import SiblingError
    from langgraph_batch.tools import coalesce

    client = make_http_client()
    base = make_llm(job)
    answer_base = make_llm(job, answer=True)

    async def run(job: dict[str, Any]) -> None:
        tools = [coalesce(t) for t in make_tools(job, client)]
        llm = bind(base, tools, job)
        graph = build(job, llm, tools, bind_answer(answer_base, tools))
        tasks = [{"index": i} for i in start_order(job)]
        out = await graph.ainvoke({"tasks": tasks}, {"recursion_limit": 10_000})
        for task, r in zip(tasks, out.get("results") or [], strict=False):
            if isinstance(r, SiblingError):
                RECORDER.failed(task["index"], f"{r.error_type}: {r.message}")

    async def teardown() -> None:
        await base.get_scheduler().aclose()
        if job.get("routing"):
            await base.backend.aclose()  # passed in, so not the scheduler's to close
        await client.aclose()

    emit(run_measured(job, run, teardown=teardown))


if __name__ == "__main__":
    main()
