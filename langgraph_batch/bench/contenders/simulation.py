"""Every contender of a simulation workload (W9): agents in a tick loop.

The shape users write today: a graph whose `world` node updates the world
and hands each agent its observation, and whose `agents` step runs every
agent once on its own growing memory (system rules, persona, then every
observation and action so far); the loop goes on for `ticks` ticks. All
agents' calls of a tick arrive together, and between ticks every agent
waits on the world update as a tool-calling agent waits on its tool.

- `naive` / `naive-bounded[-k]`: the `agents` step is one `Send` per agent
  to a node calling `ChatOpenAI` (`max_concurrency` in the run config for
  the bounded ones), as the LangGraph docs teach a map step.
- `langgraph-batch`: the `agents` step is a `fan_out` over the agents (the same
  agent function), with `BatchedChatModel` and the library's defaults; nothing
  else changes.

Each agent is a "sibling" of the report: it starts at the first tick and is
done with its last action; its model calls are in the timeline.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage

from langgraph_batch.bench.contenders._common import RECORDER, emit, read_job, run_measured


class SimState(TypedDict, total=False):
    """The world loop's state: the tick and every agent's memory."""

    tick: int
    memories: list[list[AnyMessage]]
    actions: Annotated[list[tuple[int, AIMessage]], operator.add]
    """naive: (agent, action) of every tick so far, gathered from the Sends (an
    agent's latest entry is its action of the current tick)."""
    fan_actions: list[Any]
    """langgraph-batch: the fan_out's results of the current tick, in agent order."""


def _observe(job: dict[str, Any], index: int, tick: int) -> str:
    from langgraph_batch.bench.workloads import WORKLOADS, observation

    if index < 0 or job["workload"] not in WORKLOADS:  # the warm-up's one agent
        return f"Tick {tick}. Nothing happens."
    return observation(WORKLOADS[job["workload"]], int(job.get("seed") or 0), index, tick)


async def act(llm: Any, index: int, messages: list[AnyMessage], last: bool) -> AIMessage:
    """One agent's decision at one tick (timeline events around the model call)."""
    if len(messages) == 2:
        RECORDER.event(index, "start")
    RECORDER.event(index, "llm_start")
    msg = await llm.ainvoke(messages)
    RECORDER.event(index, "llm_end")
    RECORDER.llm_calls += 1
    usage = getattr(msg, "usage_metadata", None) or {}
    RECORDER.output("answer", usage.get("output_tokens"))
    if last:
        RECORDER.done(index, str(msg.content)[:200])
    return msg  # type: ignore[no-any-return]


def build(job: dict[str, Any], llm: Any, *, fan_out_agents: bool) -> Any:
    """The world loop, its agents step a `fan_out` or one `Send` per agent."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send

    sim = job["simulation"] or {"ticks": 1, "world_latency_s": 0.0}
    ticks = int(sim["ticks"])
    n = len(job["tasks"])
    warm = n == 1 and "Warm-up" in job["tasks"][0]

    def agent_index(i: int) -> int:
        return -1 if warm else i

    async def world(state: SimState) -> dict[str, Any]:
        tick = state.get("tick", 0)
        memories = state.get("memories")
        if memories is None:
            memories = [
                [SystemMessage(job["system_prompt"]), HumanMessage(job["tasks"][i])]
                for i in range(n)
            ]
            memories = [
                [m[0], HumanMessage(f"{m[1].content}\n{_observe(job, agent_index(i), 0)}")]
                for i, m in enumerate(memories)
            ]
            return {"tick": 1, "memories": memories}
        if fan_out_agents:
            acted: list[Any] = list(state.get("fan_actions") or [])
        else:
            by_index = dict(state.get("actions") or [])
            acted = [by_index.get(i) for i in range(n)]
        if any(not isinstance(a, AIMessage) for a in acted):
            raise RuntimeError("an agent produced no action this tick")
        if tick >= ticks:
            return {"tick": tick + 1}
        await asyncio.sleep(float(sim["world_latency_s"]))  # the world update
        new = [
            [*mem, acted[i], HumanMessage(_observe(job, agent_index(i), tick))]
            for i, mem in enumerate(memories)
        ]
        return {"tick": tick + 1, "memories": new}

    def more(state: SimState) -> Any:
        if state.get("tick", 0) > ticks:
            return END
        if fan_out_agents:
            return "agents"
        return [
            Send("agent", {"index": i, "messages": mem, "tick": state["tick"]})
            for i, mem in enumerate(state["memories"])
        ]

    async def one_agent(state: dict[str, Any]) -> dict[str, Any]:
        index = state["index"]
        msg = await act(llm, index, state["messages"], state["tick"] >= ticks)
        return {"actions": [(index, msg)]}

    g = StateGraph(SimState)
    g.add_node("world", world)
    if fan_out_agents:
        from langgraph_batch.nodes.fan_out import fan_out

        agents = fan_out(
            _agent_function(llm, ticks),
            items="memories",
            into="fan_actions",
            make_input=_agent_input,
            result=lambda s: s.get("action"),
        )
        g.add_node("agents", agents)
        g.add_edge("agents", "world")
        g.add_conditional_edges("world", more, ["agents", END])
    else:
        g.add_node("agent", one_agent)  # type: ignore[type-var]
        g.add_edge("agent", "world")
        g.add_conditional_edges("world", more, ["agent", END])
    g.add_edge(START, "world")
    return g.compile()


class _AgentState(TypedDict, total=False):
    index: int
    tick: int
    messages: list[AnyMessage]
    action: AIMessage


def _agent_input(memory: list[AnyMessage], index: int) -> dict[str, Any]:
    # The tick is the number of observations so far (the first is in the persona turn).
    tick = sum(1 for m in memory if isinstance(m, HumanMessage))
    return {"index": index, "messages": memory, "tick": tick}


def _agent_function(llm: Any, ticks: int) -> Any:
    # The function the naive contenders `Send` to, given to fan_out as it is (fan_out
    # calls a plain function directly). A one-node compiled subgraph would add
    # LangGraph's own pregel loop per agent and tick, a `RunnableLambda` its per-call
    # signature checks and traced run: 64 no-op siblings took ~150-190 ms a fan_out
    # and ~70 ms that way on the 2-core benchmark machine
    # (benchmarks/results/experiments/long_horizon_policies.md).
    async def decide(state: _AgentState) -> dict[str, Any]:
        msg = await act(llm, state["index"], state["messages"], state["tick"] >= ticks)
        return {"action": msg}

    return decide


def main() -> None:
    """Run the job on stdin and print its result line (`python -m ...simulation`)."""
    job = read_job()
    lgb = job["contender"] == "langgraph-batch"
    if lgb:
        from langgraph_batch.bench.contenders.lgb import make_llm as make_lgb_llm

        llm = make_lgb_llm(job)
    else:
        from langgraph_batch.bench.contenders.naive import make_llm as make_naive_llm

        llm = make_naive_llm(job)

    async def run(job: dict[str, Any]) -> None:
        graph = build(job, llm, fan_out_agents=lgb)
        config: dict[str, Any] = {"recursion_limit": 10_000}
        if job.get("max_concurrency") and not lgb:
            config["max_concurrency"] = int(job["max_concurrency"])
        await graph.ainvoke({"tick": 0}, config)

    async def teardown() -> None:
        if lgb:
            await llm.get_scheduler().aclose()

    emit(run_measured(job, run, teardown=teardown))


if __name__ == "__main__":
    main()
