"""Graph nodes: `fan_out` runs one sibling subgraph per item, isolated and resumable."""

from __future__ import annotations

from langgraph_batch.nodes.fan_out import FanOutNode, SiblingError, fan_out

__all__ = (
    "FanOutNode",
    "SiblingError",
    "fan_out",
)
