"""The parent side of the distributed tests: a graph with one distributed fan_out node."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from langgraph_batch import fan_out
from langgraph_batch._observe.progress import extract_fan_out_event
from langgraph_batch.distributed import RedisExecutor
from tests.fakes import fan_out as fakes
from tests.integration.distributed.conftest import GRAPHS


def executor(url: str, graph: str = "sleepy", **options: Any) -> RedisExecutor:
    options.setdefault("lease_s", 1.2)
    options.setdefault("poll_s", 0.3)
    options.setdefault("timeout", 60.0)  # a test never hangs
    options.setdefault("unavailable_timeout", 30.0)
    options.setdefault("socket_timeout", 3.0)
    return RedisExecutor(url, graph=f"{GRAPHS}:{graph}", **options)


def job_input(x: Any, i: int) -> dict[str, Any]:
    """`xs` items are ints (`x`) or dicts of Job fields (with `x`)."""
    fields = x if isinstance(x, dict) else {"x": x}
    return {"index": i, "sleep": 0.1, **fields}


def parent_graph(
    ex: RedisExecutor,
    *,
    subgraph: Any = None,
    make_input: Callable[[Any, int], Any] = job_input,
    result: Callable[[Any], Any] | None = lambda final: final["y"],
    on_error: Literal["collect", "raise"] = "collect",
    checkpointer: Any = None,
) -> Any:
    if subgraph is None:
        from tests.integration.distributed.graphs import sleepy as subgraph
    node = fan_out(
        subgraph,
        items="xs",
        into="out",
        make_input=make_input,
        result=result,
        on_error=on_error,
        executor=ex,
        name="fan",
    )
    return fakes.parent_graph(node, checkpointer=checkpointer)


async def run_parent(
    graph: Any, xs: list[Any] | None, config: Any = None
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Stream the graph; return the `out` list and the fan_out progress events.

    Each event gets `_at`: when the parent's stream delivered it (monotonic seconds).
    """
    events: list[dict[str, Any]] = []
    out: list[Any] = []
    inputs = None if xs is None else {"xs": xs}
    async for mode, chunk in graph.astream(inputs, config, stream_mode=["custom", "values"]):
        if mode == "custom":
            ev = extract_fan_out_event(chunk)
            if ev is not None:
                events.append({**ev, "_at": time.monotonic()})
        elif isinstance(chunk, dict) and "out" in chunk:
            out = chunk["out"]
    return out, events
