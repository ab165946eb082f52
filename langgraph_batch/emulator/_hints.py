"""`vllm_xargs` as vLLM checks it, and the agent hints the emulator can accept.

Stock vLLM types `vllm_xargs` as `dict[str, str | int | float | list[str | int |
float]]`: a nested object such as vllm-router's program metadata
(`vllm_xargs.agentic_context`) is an HTTP 400. Engines built for program
scheduling (AgentInfer's) accept it; `EmulatorConfig(agentic_context=True)`
(`--agentic-context`) emulates one and records what the hints said, for
`GET /emulator/stats` (`agentic_context`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph_batch.emulator._http import RequestError

__all__ = ("AgentHints",)

_MAX_PROGRAMS = 100_000


def _flat(value: Any) -> bool:
    scalar = (str, int, float)
    if isinstance(value, list):
        return all(isinstance(v, scalar) for v in value)
    return isinstance(value, scalar)


class AgentHints:
    """Checks `vllm_xargs` and records accepted `agentic_context` hints.

    Args:
        accept: accept `vllm_xargs.agentic_context` (an agent-aware engine).
    """

    def __init__(self, *, accept: bool) -> None:
        self.accept = accept
        self.requests = 0
        self.steps: dict[str, set[int]] = {}
        self.expected_output: set[int] = set()
        self.priorities: set[int] = set()
        self.retention: list[float] = []

    def check(self, body: Mapping[str, Any]) -> None:
        """Refuse what vLLM refuses; record the hints of an accepted `agentic_context`.

        Raises:
            RequestError: 400 for a malformed `vllm_xargs` (vLLM's validation).
        """
        xargs = body.get("vllm_xargs")
        if xargs is None:
            return
        if not isinstance(xargs, dict):
            raise RequestError("vllm_xargs: Input should be a valid dictionary")
        for key, value in xargs.items():
            if key == "agentic_context" and self.accept and isinstance(value, dict):
                self._record(value)
            elif not _flat(value):
                raise RequestError(
                    f"vllm_xargs.{key}: Input should be a valid string, integer, number or "
                    "list of them"
                )

    def _record(self, ctx: Mapping[str, Any]) -> None:
        program = ctx.get("program_id")
        if not isinstance(program, str) or not program:
            raise RequestError("vllm_xargs.agentic_context.program_id must be a non-empty string")
        self.requests += 1
        steps = self.steps.get(program)
        if steps is None:
            if len(self.steps) >= _MAX_PROGRAMS:
                return
            steps = self.steps[program] = set()
        step = ctx.get("step_id")
        if isinstance(step, int):
            steps.add(step)
        expected = ctx.get("expected_output_length")
        if isinstance(expected, int):
            self.expected_output.add(expected)
        priority = ctx.get("priority")
        if isinstance(priority, int):
            self.priorities.add(priority)
        ttl = ctx.get("kv_retention_ttl_seconds")
        if isinstance(ttl, int | float) and not isinstance(ttl, bool):
            if not ttl >= 0:  # vllm-router: "must be seconds as a number"
                raise RequestError(
                    "vllm_xargs.agentic_context.kv_retention_ttl_seconds must be seconds"
                )
            if len(self.retention) < _MAX_PROGRAMS:
                self.retention.append(float(ttl))

    def reset(self) -> None:
        """Forget what was recorded (`POST /emulator/reset`)."""
        self.requests = 0
        self.steps.clear()
        self.expected_output.clear()
        self.priorities.clear()
        self.retention.clear()

    def stats(self) -> dict[str, Any]:
        """What the accepted hints said: requests, programs, each program's steps."""
        return {
            "accepted": self.accept,
            "requests": self.requests,
            "programs": len(self.steps),
            "steps_per_program": sorted({len(s) for s in self.steps.values()}),
            "step_ids": sorted(set().union(*self.steps.values())) if self.steps else [],
            "expected_output_length": sorted(self.expected_output),
            "priorities": sorted(self.priorities),
            "kv_retention_ttl_seconds": {
                "requests": len(self.retention),
                "min": min(self.retention, default=None),
                "max": max(self.retention, default=None),
            },
        }
