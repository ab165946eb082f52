"""Real routers in front of the emulator: the one home of the router benchmark code.

- `process`: `RouterProcess` (`vllm-router`, `sglang-router`) and the router
  contenders of `make bench` (`<base>-router`, `<base>-router-ps`).
- `w4`: W4 behind a router, with and without the library's session key
  (`python -m benchmarks.routers`).
"""

from __future__ import annotations

from benchmarks.routers.process import (
    FAST_HEALTH,
    ROUTERS,
    RouterProcess,
    router_command,
    router_unavailable,
    split_router,
)
from benchmarks.routers.w4 import measure_batching, measure_router, run_with_kill

__all__ = (
    "FAST_HEALTH",
    "ROUTERS",
    "RouterProcess",
    "measure_batching",
    "measure_router",
    "router_command",
    "router_unavailable",
    "run_with_kill",
    "split_router",
)
