"""The engine's records: its cumulative counters and the work of one step."""

from __future__ import annotations

from dataclasses import dataclass, field

from langgraph_batch.emulator.costs import StepShape
from langgraph_batch.emulator.request import Request

__all__ = ("EngineCounters", "ScheduledStep")


@dataclass(slots=True)
class EngineCounters:
    """Cumulative counters (what `/emulator/stats` and `/metrics` report)."""

    requests: int = 0
    """Requests received."""
    finished: int = 0
    aborted: int = 0
    prompt_tokens_received: int = 0
    prefill_tokens_computed: int = 0
    """Prompt tokens actually run through the model, again each time a
    preemption makes a request recompute them. Generated tokens recomputed
    after a preemption are not counted here."""
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache at first scheduling."""
    prefix_cache_queries: int = 0
    """Tokens looked up in the prefix cache, counted when a request is first
    admitted (not again after a preemption, as in vLLM's Prometheus counter)."""
    prefix_cache_hits: int = 0
    """Of those, tokens found in the cache."""
    generation_tokens: int = 0
    preemptions: int = 0
    """Every preemption, including repeated ones of one request."""
    steps: int = 0
    busy_time: float = 0.0
    """Engine seconds spent in steps."""
    queue_time_sum: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: int = 0


@dataclass(slots=True)
class ScheduledStep:
    """The work of one step, from `Engine.schedule`."""

    items: list[tuple[Request, int]]
    """(request, tokens computed for it in this step)."""
    shape: StepShape
    duration: float
    """Engine seconds the step takes."""
    start: float
    deferred_register: list[tuple[Request, int]] = field(default_factory=list)
    """SGLang flavour: (request, tokens) whose blocks join the cache after the step."""
