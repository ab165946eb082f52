"""The benchmark contenders; each runs in its own process (see `_common.py`).

A contender module is run as `python -m langgraph_batch.bench.contenders.<name>`
with a job JSON on stdin and prints one result JSON line on stdout. `_common`
and `batchagent_runner` import nothing beyond the standard library (and
batch_agent, httpx): the `batchagent` contender runs in its own virtual
environment, without LangGraph (see `harness._STDLIB_RUNNER`).
"""

from __future__ import annotations
