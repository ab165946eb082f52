"""A faithful stand-in for a vLLM (or SGLang) server, with no GPU.

Real HTTP (Starlette + uvicorn) in front of a modelled engine: a vLLM V1-style
step loop with chunked prefill, a paged KV cache with prefix caching and
preemption, and step times fitted to published GPU kernel profiles.

Example:
    ```python
    from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess, serve

    with EmulatorProcess(EmulatorConfig(port=0, time_scale=50)) as emu:
        ...  # point an OpenAI client at emu.url + "/v1"

    async with serve(EmulatorConfig(port=0)) as emu:
        emu.engine.counters.prefill_tokens_computed
    ```
"""

from __future__ import annotations

from langgraph_batch.emulator.config import FAULTS, EmulatorConfig
from langgraph_batch.emulator.costs import PROFILES, Profile, get_profile
from langgraph_batch.emulator.engine import Engine, EngineCounters, Request, simulate
from langgraph_batch.emulator.process import EmulatorProcess, RunningEmulator, serve

__all__ = (
    "FAULTS",
    "PROFILES",
    "EmulatorConfig",
    "EmulatorProcess",
    "Engine",
    "EngineCounters",
    "Profile",
    "Request",
    "RunningEmulator",
    "get_profile",
    "serve",
    "simulate",
)
