"""Graph nodes: `fan_out` runs one sibling subgraph per item, isolated and resumable."""

from __future__ import annotations

from langgraph_batch.nodes._admission import SiblingAdmission as SiblingAdmission
from langgraph_batch.nodes._remote import RemoteEvent as RemoteEvent
from langgraph_batch.nodes._remote import SiblingExecutor as SiblingExecutor
from langgraph_batch.nodes._spec import check_gate_options as check_gate_options
from langgraph_batch.nodes.fan_out import FanOutNode, SiblingError, fan_out

# Also importable from here, for the library's other packages (the distributed executor and
# worker; `langgraph_batch.distributed` exports the executor protocol to users), and not part of
# `__all__` (no user API): SiblingAdmission, check_gate_options, RemoteEvent, SiblingExecutor.
__all__ = (
    "FanOutNode",
    "SiblingError",
    "fan_out",
)
