"""Graph nodes: `fan_out` runs one sibling subgraph per item, isolated and resumable."""

from __future__ import annotations

from langgraph_batch.nodes._admission import AdmissionStats, SiblingAdmission
from langgraph_batch.nodes.fan_out import FanOutNode, SiblingError, fan_out

__all__ = (
    "AdmissionStats",
    "FanOutNode",
    "SiblingAdmission",
    "SiblingError",
    "fan_out",
)
