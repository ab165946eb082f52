"""Benchmark results and development scripts (the harness is `langgraph_batch.bench`).

`langgraph-batch bench` (or `make bench`) writes `benchmarks/results/`; the
scripts here measure the library's internals: `python -m
benchmarks.scheduler_overhead`, `benchmarks.http_pool_overhead`,
`benchmarks.distributed_scale`. See benchmarks/README.md.
"""

from __future__ import annotations
