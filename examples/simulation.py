"""Agents in a simulation loop: a world ticks, every agent decides from its own memory.

    python examples/simulation.py --agents 32 --ticks 12      # built-in emulator (EMULATED)
    python examples/simulation.py --agents 64 --ticks 40 --backend-url vllm://127.0.0.1:8000

The shape of a tick-based multi-agent runtime (generative agents, a market, a
game) written as an ordinary LangGraph loop around a `fan_out`:

    START -> world -> agents (fan_out: one decision per agent) -> world -> ... -> END

`world` updates the world and hands each agent what it observes; `agents`
runs every agent once on its whole memory (the shared rules, its persona,
then every observation and action so far), all agents of a tick together.
Between ticks every agent waits on the world as a tool-calling agent waits on
its tool. Memories grow every tick; with enough agents and ticks they no
longer fit the server's KV cache together, and the order in which the tick's
calls reach the engine decides how much of them it must prefill again.
`BatchedChatModel` sends first the agents whose memory the server saw last
(still cached), so an engine that evicts the least recently used recomputes
only what does not fit (`langgraph-batch bench W9` compares it with plain
LangGraph at every `max_concurrency`).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from typing_extensions import TypedDict  # not typing's: see _common.py

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples import _common
from langgraph_batch.nodes.fan_out import SiblingError, fan_out

RULES = (
    "You are one resident of a small simulated town. Each tick you read what you observe "
    "and answer with your next action in one short sentence: where you go, whom you talk "
    "to, what you do. Stay in character; remember what happened before."
)
PLACES = ("market", "library", "harbour", "bakery", "town hall", "park", "workshop", "inn")
WORK = ("baker", "sailor", "clerk", "carpenter", "teacher", "merchant", "guard", "painter")


class TownState(TypedDict, total=False):
    """The loop's state: the tick, every agent's memory, and the latest actions."""

    agents: int
    ticks: int
    tick: int
    memories: list[list[AnyMessage]]
    actions: list[Any]
    """What each agent did this tick (a `SiblingError` where an agent failed)."""
    log: list[str]


class AgentState(TypedDict, total=False):
    """One agent's decision: its memory in, its action out."""

    messages: list[AnyMessage]
    action: AIMessage


def persona(i: int) -> str:
    rng = random.Random(i)
    return (
        f"You are resident {i} (id key=r{i}), a {rng.choice(WORK)} who lives near the "
        f"{rng.choice(PLACES)}. You want to {rng.choice(('open a shop', 'find a friend'))}."
    )


def observation(i: int, tick: int, actions: list[Any]) -> str:
    """What agent `i` sees at `tick`: where it is, and what a few neighbours just did."""
    rng = random.Random(f"{i}:{tick}")
    seen = [
        f"resident {j} {str(getattr(actions[j], 'content', '')).strip()[:160]}"
        for j in rng.sample(range(len(actions)), min(3, len(actions)))
        if isinstance(actions[j], AIMessage)
    ]
    place = rng.choice(PLACES)
    return f"Tick {tick}. You are at the {place}. Around you: " + ("; ".join(seen) or "quiet.")


def build_graph() -> CompiledStateGraph[Any, Any, Any, Any]:
    """The town: a world node and a fan_out of one decision per agent, in a loop."""
    llm = _common.chat_model(max_tokens=64, temperature=0.7)

    async def decide(state: AgentState) -> dict[str, Any]:
        return {"action": await llm.ainvoke(state["messages"])}

    agent = StateGraph(AgentState)
    agent.add_node("decide", decide)
    agent.add_edge(START, "decide")
    agent.add_edge("decide", END)

    async def world(state: TownState) -> dict[str, Any]:
        await _common.ensure_backend()
        n, tick = state.get("agents", 8), state.get("tick", 0)
        memories, actions = state.get("memories"), state.get("actions") or []
        if memories is None:  # tick 0: every agent's rules, persona and first look around
            memories = [
                [SystemMessage(RULES), HumanMessage(f"{persona(i)}\n{observation(i, 0, [])}")]
                for i in range(n)
            ]
            return {"tick": 1, "memories": memories, "log": []}
        failed = sum(1 for a in actions if isinstance(a, SiblingError))
        log = [*state.get("log", []), f"tick {tick}: {n - failed} acted, {failed} failed"]
        if tick >= state.get("ticks", 4):
            return {"tick": tick + 1, "log": log}
        await asyncio.sleep(0.05)  # the world's own update (physics, other systems)
        memories = [
            [*memory, act, HumanMessage(observation(i, tick, actions))]
            if isinstance(act, AIMessage)
            else [*memory, HumanMessage(observation(i, tick, actions))]
            for i, (memory, act) in enumerate(zip(memories, actions, strict=True))
        ]
        return {"tick": tick + 1, "memories": memories, "log": log}

    def next_step(state: TownState) -> str:
        return END if state["tick"] > state.get("ticks", 4) else "agents"

    town = StateGraph(TownState)
    town.add_node("world", world)
    town.add_node(
        "agents",
        fan_out(
            agent.compile(name="resident"),
            items="memories",
            into="actions",
            make_input=lambda memory, i: {"messages": memory},
            result=lambda final: final["action"],
            scheduler=_common.SCHEDULER,
        ),
    )
    town.add_edge(START, "world")
    town.add_conditional_edges("world", next_step, ["agents", END])
    town.add_edge("agents", "world")
    return town.compile(name="simulation")


async def amain(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--ticks", type=int, default=8)
    _common.add_backend_args(parser)
    args = parser.parse_args(argv)
    if args.agents < 1 or args.ticks < 1:
        parser.error("--agents and --ticks must be >= 1")
    await _common.start(args)
    app = build_graph()
    inputs = {"agents": args.agents, "ticks": args.ticks}
    final, last_event = await _common.run_with_progress(app, inputs, quiet=args.quiet)
    for line in final.get("log", []):
        print(line)
    memory = final["memories"][0]
    print(f"resident 0 remembers {len(memory)} messages; its last action:")
    print(f"  {str(final['actions'][0].content)[:200]}")
    _common.print_llm_stats(last_event)
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return asyncio.run(amain(argv))
    finally:
        _common.stop_emulator()


if __name__ == "__main__":
    raise SystemExit(main())
