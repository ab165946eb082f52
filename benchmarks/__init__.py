"""Benchmark harness for langgraph-batch: workloads, contenders, metrics and reports.

Run it with `langgraph-batch bench <W1|W2|W3|W5|all>` (or `make bench`); see
benchmarks/README.md.
"""

from __future__ import annotations
