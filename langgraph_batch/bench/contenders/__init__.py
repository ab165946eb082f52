"""The benchmark contenders; each runs in its own process (see `_common.py`).

A contender module is run as `python -m langgraph_batch.bench.contenders.<name>`
with a job JSON on stdin and prints one result JSON line on stdout. `_common`
imports nothing beyond the standard library: the research harness's
`batchagent` contender (`benchmarks/contenders/batchagent_runner.py`) uses it
in its own virtual environment, without LangGraph.
"""

from __future__ import annotations

# What the harness, the live probes and the demo share with the contenders (the
# contenders' own modules import `_common` and `_graph` directly).
from langgraph_batch.bench.contenders._common import (
    RECORDER,
    RESULT_PREFIX,
    WARMUP_KEY,
    parse_metrics,
    sum_stats,
    warmup_job,
)
from langgraph_batch.bench.contenders._graph import bind, make_http_client, make_tools

__all__ = (
    "RECORDER",
    "RESULT_PREFIX",
    "WARMUP_KEY",
    "bind",
    "make_http_client",
    "make_tools",
    "parse_metrics",
    "sum_stats",
    "warmup_job",
)
