"""The research harness (the `langgraph-batch-benchmarks` distribution), its scripts and results.

`make bench` (`python -m benchmarks.bench all`) runs every workload with
every contender, bound and goal (`extension.Research` on top of the wheel's
`langgraph-batch bench`) and writes `benchmarks/results/`; `contenders/`
holds the bounds and the prior-art contender, `routers/` the router
contenders and W4 behind a router, `goals.py` the issues' goals, `report.py`
the charts. The other scripts measure the library's internals: `python -m
benchmarks.scheduler_overhead`, `benchmarks.http_pool_overhead`,
`benchmarks.distributed_scale`. See benchmarks/README.md.
"""

from __future__ import annotations
