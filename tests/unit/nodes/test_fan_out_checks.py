"""fan_out refuses bad input at the door and never fails a sibling silently."""

from __future__ import annotations

import importlib
import logging
from typing import Any

import pytest

from langgraph_batch.nodes import SiblingError, fan_out
from tests.unit.nodes.fakes import number_graph
from tests.unit.nodes.test_fan_out import parent_graph


class NotAScheduler:
    def get_scheduler(self) -> object:
        return object()


@pytest.mark.parametrize(
    ("kwargs", "exc", "names"),
    [
        ({"items": ""}, ValueError, "''"),
        ({"into": None}, ValueError, "None"),
        ({"make_input": "x"}, TypeError, "make_input"),
        ({"result": 3}, TypeError, "result"),
        ({"max_active": 2.5}, ValueError, "2.5"),
        ({"max_active": True}, ValueError, "True"),
        ({"max_active": -5}, ValueError, "-5"),
        ({"sibling_tokens": 1.5}, ValueError, "1.5"),
        ({"sibling_tokens": -1}, ValueError, "-1"),
        ({"kv_headroom": 0}, ValueError, "0"),
        ({"kv_headroom": "0.5"}, ValueError, "'0.5'"),
        ({"kv_headroom": 1.5}, ValueError, "1.5"),
        ({"name": ""}, ValueError, "name"),
        ({"name": 7}, ValueError, "7"),
        ({"scheduler": ""}, ValueError, "scheduler"),
        ({"scheduler": 42}, TypeError, "int"),
        ({"scheduler": NotAScheduler()}, TypeError, "get_scheduler()"),
    ],
)
def test_bad_arguments_fail_at_construction_naming_the_value(
    kwargs: dict[str, Any], exc: type[Exception], names: str
) -> None:
    args: dict[str, Any] = {"items": "xs", "into": "out", **kwargs}
    with pytest.raises(exc) as info:
        fan_out(number_graph(), **args)
    assert names in str(info.value)


@pytest.mark.parametrize("unordered", [{3, 1, 2}, frozenset({1, 2}), {1: "a"}.keys()])
async def test_unordered_items_are_refused_with_a_clear_error(unordered: Any) -> None:
    node = fan_out(
        number_graph(), items=lambda s: unordered, into="out", make_input=lambda x, i: {"x": x}
    )
    with pytest.raises(TypeError, match="no input order") as info:
        await parent_graph(node).ainvoke({"xs": []})
    assert "sorted" in str(info.value)


@pytest.mark.parametrize("not_a_sequence", [iter([1, 2]), {"a": 1}, "abc", 5])
async def test_items_that_are_not_a_sequence_are_refused(not_a_sequence: Any) -> None:
    node = fan_out(
        number_graph(), items=lambda s: not_a_sequence, into="out", make_input=lambda x, i: {}
    )
    with pytest.raises(TypeError, match="items must be a sequence") as info:
        await parent_graph(node).ainvoke({"xs": []})
    assert type(not_a_sequence).__name__ in str(info.value)


async def test_tuple_items_keep_their_order() -> None:
    node = fan_out(
        number_graph(),
        items=lambda s: tuple(s["xs"]),
        into="out",
        make_input=lambda x, i: {"x": x},
        result=lambda final: final["y"],
    )
    assert (await parent_graph(node).ainvoke({"xs": [3, 1, 2]}))["out"] == [31, 11, 21]


async def test_every_sibling_failure_logs_a_warning_without_the_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "sk-live-0123456789abcdef"

    class Leaky(Exception):
        pass

    def explode(state: dict[str, Any]) -> dict[str, Any]:
        raise Leaky(f"upstream said: Authorization: Bearer {secret} for x={state['x']}")

    from langgraph.graph import START, StateGraph

    from tests.unit.nodes.fakes import NumState

    b = StateGraph(NumState)
    b.add_node("explode", explode)
    b.add_edge(START, "explode")
    node = fan_out(b.compile(), items="xs", into="out", make_input=lambda x, i: {"x": x})
    with caplog.at_level(logging.DEBUG, logger="langgraph_batch"):
        out = await parent_graph(node).ainvoke({"xs": [1, 2, 3]})
    assert all(isinstance(r, SiblingError) for r in out["out"])
    assert secret in out["out"][0].message  # the caller still gets the message
    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and "failed" in r.getMessage()
    ]
    assert sorted(r.lgb_index for r in warnings) == [0, 1, 2]  # type: ignore[attr-defined]
    for record in warnings:
        text = record.getMessage()
        assert "Leaky" in text
        assert f"sibling {record.lgb_index} failed" in text  # type: ignore[attr-defined]
        assert record.lgb_error_type == "Leaky"  # type: ignore[attr-defined]
    for record in caplog.records:
        assert secret not in record.getMessage()
        assert secret not in str(record.__dict__)


async def test_a_broken_progress_writer_is_reported_once_and_never_fails_the_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    run_module = importlib.import_module("langgraph_batch.nodes._run")

    calls = 0

    def broken(_: Any) -> None:
        nonlocal calls
        calls += 1
        raise ConnectionResetError("the stream's consumer went away")

    monkeypatch.setattr(run_module, "get_stream_writer", lambda: broken)
    node = fan_out(
        number_graph(),
        items="xs",
        into="out",
        make_input=lambda x, i: {"x": x},
        result=lambda final: final["y"],
    )
    with caplog.at_level(logging.WARNING, logger="langgraph_batch"):
        out = await parent_graph(node).ainvoke({"xs": [1, 2, 3]})
    assert out["out"] == [11, 21, 31]
    assert calls > 3
    warned = [r for r in caplog.records if "progress events cannot be written" in r.getMessage()]
    assert len(warned) == 1
    assert "ConnectionResetError" in warned[0].getMessage()
