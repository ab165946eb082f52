"""The agent scenario's long-horizon markers and per-turn tool arguments."""

from __future__ import annotations

import json
from typing import Any

from langgraph_batch.emulator.scenarios import ScenarioOptions, plan_chat
from langgraph_batch.emulator.tokenizer import count_tokens

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


def conversation(options: ScenarioOptions, task: str) -> list[tuple[str | None, Any]]:
    """(content, arguments or None for the answer) of every turn the model takes."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    out: list[tuple[str | None, Any]] = []
    for _ in range(30):
        plan = plan_chat(
            messages, tools=TOOLS, tool_choice="auto", response_format=None, options=options
        )
        if not plan.tool_calls:
            out.append((plan.content, None))
            return out
        call = plan.tool_calls[0]
        out.append((plan.content, json.loads(call.arguments)))
        messages.append(
            {
                "role": "assistant",
                "content": plan.content,
                "tool_calls": [
                    {"id": "c", "type": "function",
                     "function": {"name": "search", "arguments": call.arguments}}
                ],
            }
        )  # fmt: skip
        messages.append({"role": "tool", "tool_call_id": "c", "content": "ok"})
    raise AssertionError("the conversation never ended")


def test_turns_and_think_markers_shape_one_conversation() -> None:
    turns = conversation(ScenarioOptions(turns=2), "fix key=k1 turns=5 think=10-40 now")
    assert len(turns) == 5  # the marker wins over the server's 2
    for content, args in turns[:-1]:
        assert content is not None
        assert content.startswith("Next:")
        assert 10 <= count_tokens(content) <= 40
        assert args is not None
    assert turns[-1][1] is None
    # Without markers: the server's turns, no text before the calls.
    plain = conversation(ScenarioOptions(turns=3), "fix key=k1 now")
    assert [c for c, _ in plain[:-1]] == [None, None]


def test_tool_arguments_change_every_turn_unless_asked_to_repeat() -> None:
    varied = conversation(ScenarioOptions(turns=4), "fix key=k7")
    assert [a for _, a in varied[:-1]] == [{"q": "k7"}, {"q": "k7.1"}, {"q": "k7.2"}]
    same = conversation(ScenarioOptions(turns=4, repeat_tool_args=True), "fix key=k7")
    assert [a for _, a in same[:-1]] == [{"q": "k7"}] * 3
