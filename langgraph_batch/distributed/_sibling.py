"""One sibling, run where its parent is not: the body a Redis worker and a Ray node share.

A sibling arrives as its encoded input; it leaves as an encoded outcome
record, `{"k": "ok", "v": final_state}` or `{"k": "error", "v":
SiblingError.to_dict()}`, never as an exception (its parent decides what a
failure means). Between the two it is checked against the graph's input
schema and run inside `sibling_scope`, holding a place of the host's
admission gate, as a fan_out sibling runs in process. Its group is unique
to one run, so coalesced tools share within the run and never across runs.
"""

from __future__ import annotations

import logging
from typing import Any

from langgraph_batch._context import SiblingInfo, sibling_scope
from langgraph_batch.distributed._serde import Serde, validate_input
from langgraph_batch.errors import DistributedError, InputValidationError
from langgraph_batch.nodes import SiblingAdmission, SiblingError

__all__ = ("MAX_TRACEBACK", "error_payload", "invoke_sibling")

logger = logging.getLogger(__name__)

MAX_TRACEBACK = 8192
"""Characters of a failed sibling's traceback kept in its outcome record (its end)."""


async def invoke_sibling(
    *,
    graph: Any,
    graph_path: str,
    serde: Serde,
    admission: SiblingAdmission,
    group: str,
    index: int,
    total: int,
    payload: bytes,
    host: str,
) -> bytes:
    """Run sibling `index` of run `group` from its encoded input; its encoded outcome.

    Args:
        graph: the compiled sibling graph.
        graph_path: its import path (named in an input-validation error).
        serde: the run's codec.
        admission: the host's gate (its places and KV bookings).
        group: the run's group (unique to one run).
        index: the sibling's position in the run's items (-1: unknown).
        total: how many siblings the run has.
        payload: the encoded input.
        host: who runs it, for the debug log ("worker w1", "ray node runner").
    """
    try:
        value = serde.loads(payload, what="input")
        problems = validate_input(graph, value)
        if problems:
            raise InputValidationError(
                f"sibling {index}: the input does not fit {graph_path}: " + "; ".join(problems),
                problems=problems,
            )
        info = SiblingInfo(
            group=group,
            index=index,
            total=total,
            admission=admission,
            run_id=group,
            expected_wait=admission.forecast.expected_wait,
        )
        meta = {"lgb_sibling_group": group, "lgb_sibling_index": index}
        config: Any = {
            "configurable": {"thread_id": f"lgb-{group}-{index}", **meta},
            "metadata": meta,
        }
        with sibling_scope(info):
            await admission.acquire(info, returning=False)
            try:
                final = await graph.ainvoke(value, config)
            finally:
                admission.finish(info)
        try:
            return serde.dumps({"k": "ok", "v": final}, what="result")
        except (DistributedError, TypeError) as exc:
            return error_payload(serde, exc, index)
    except Exception as exc:
        logger.debug("%s: sibling %s of run %s failed", host, index, group, exc_info=True)
        return error_payload(serde, exc, index)


def error_payload(serde: Serde, exc: BaseException, index: int) -> bytes:
    """The encoded `{"k": "error"}` record of a failed sibling (a shorter one if too big)."""
    record = SiblingError.from_exception(exc, index=index, item=None).to_dict()
    if record.get("traceback") and len(record["traceback"]) > MAX_TRACEBACK:
        record["traceback"] = "...\n" + record["traceback"][-MAX_TRACEBACK:]
    try:
        return serde.dumps({"k": "error", "v": record}, what="result")
    except (DistributedError, TypeError):
        record = {**record, "traceback": None, "message": record["message"][:1000]}
        return serde.dumps({"k": "error", "v": record}, what="result")
