"""fan_out refuses bad input at the door and never fails a sibling silently."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

import pytest

from langgraph_batch.nodes import FanOutNode, SiblingError, fan_out
from langgraph_batch.nodes._spec import FanOutSpec
from tests.fakes.fan_out import number_graph, parent_graph


class NotAScheduler:
    def get_scheduler(self) -> object:
        return object()


def _spec(subgraph: Any, **options: Any) -> FanOutSpec:
    return FanOutSpec(subgraph=subgraph, **options)


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
@pytest.mark.parametrize("build", [fan_out, FanOutNode, _spec])
def test_bad_arguments_fail_at_construction_naming_the_value(
    kwargs: dict[str, Any], exc: type[Exception], names: str, build: Callable[..., Any]
) -> None:
    # One check, wherever the options come in: the factory, the node's own
    # keywords, the spec.
    args: dict[str, Any] = {"items": "xs", "into": "out", **kwargs}
    with pytest.raises(exc) as info:
        build(number_graph(), **args)
    assert names in str(info.value)


def test_the_factory_and_the_node_build_one_frozen_spec() -> None:
    graph = number_graph()
    options: dict[str, Any] = {"items": "xs", "into": "out", "max_active": 3, "name": "n"}
    built = fan_out(graph, **options)
    assert isinstance(built.spec, FanOutSpec)
    assert FanOutNode(graph, **options).spec == built.spec
    assert FanOutNode(spec=built.spec).spec is built.spec
    assert (built.name, built.spec.node_name, built.subgraph) == ("n", "n", graph)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.spec.max_active = 4  # type: ignore[misc]
    # Defaults are the spec's: fan_out's signature shows the same ones.
    defaults = {
        name: param.default
        for name, param in inspect.signature(fan_out).parameters.items()
        if param.default is not inspect.Parameter.empty
    }
    fields = {f.name: f.default for f in dataclasses.fields(FanOutSpec)}
    assert defaults == {name: fields[name] for name in defaults}
    assert set(fields) == set(inspect.signature(fan_out).parameters)
    unnamed = fan_out(graph, items="xs", into="out")
    assert (unnamed.spec.name, unnamed.name) == (None, f"fan_out[{graph.name}]")
    with pytest.raises(TypeError, match="not both"):
        FanOutNode(graph, spec=built.spec)
    with pytest.raises(TypeError, match="not both"):
        FanOutNode(spec=built.spec, items="ys")
    with pytest.raises(TypeError, match="into"):
        FanOutNode(graph, items="xs")  # a required option missing


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

    from tests.fakes.fan_out import NumState

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
