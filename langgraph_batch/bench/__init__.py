"""Benchmark harness for langgraph-batch: workloads, contenders, metrics and reports.

An application on top of the library (the library never imports it), shipped
in the wheel with the `bench` extra: `pip install 'langgraph-batch[bench]'`,
then `langgraph-batch bench <W1|...|W9|all>` (or `make bench` in a checkout),
`langgraph-batch bench --replay FILE` for a job recorded with
`langgraph_batch.record`, and `langgraph-batch demo`. See benchmarks/README.md
in the repository.
"""

from __future__ import annotations
