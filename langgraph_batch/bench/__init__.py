"""Benchmark harness for langgraph-batch: workloads, contenders, metrics and reports.

Run it with `langgraph-batch bench <W1|...|W6|all>` (or `make bench`); see
benchmarks/README.md.
"""

from __future__ import annotations
