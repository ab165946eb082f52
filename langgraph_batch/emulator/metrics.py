"""`/metrics` (Prometheus text, vLLM's or SGLang's names) and `/emulator/stats` JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langgraph_batch.emulator.driver import Histogram
from langgraph_batch.emulator.kv_cache import BLOCK_SIZE

if TYPE_CHECKING:
    from langgraph_batch.emulator._serving import Serving
    from langgraph_batch.emulator.engine import Engine

__all__ = ("PHASE_FIELDS", "render_metrics", "request_phases", "stats_dict")

PHASE_FIELDS = (
    "request_id",
    "arrival",
    "first_scheduled",
    "first_token",
    "finish",
    "preemptions",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
)
"""The columns of `/emulator/requests` rows."""


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}"


def _hist(lines: list[str], name: str, h: Histogram, labels: dict[str, str], doc: str) -> None:
    lines.append(f"# HELP {name} {doc}")
    lines.append(f"# TYPE {name} histogram")
    for le, n in h.cumulative():
        lines.append(f"{name}_bucket{_labels({**labels, 'le': le})} {n}")
    lines.append(f"{name}_sum{_labels(labels)} {h.total}")
    lines.append(f"{name}_count{_labels(labels)} {h.count}")


def _one(
    lines: list[str], name: str, kind: str, value: float, labels: dict[str, str], doc: str
) -> None:
    lines.append(f"# HELP {name} {doc}")
    lines.append(f"# TYPE {name} {kind}")
    lines.append(f"{name}{_labels(labels)} {value}")


def render_metrics(server: Serving) -> str:
    """The Prometheus exposition of the server's engine."""
    if server.config.flavor == "sglang":
        return _render_sglang(server)
    eng = server.engine
    c = eng.counters
    drv = server.driver
    labels = {"model_name": server.config.model, "engine": "0"}
    lines: list[str] = []
    _one(lines, "vllm:num_requests_running", "gauge", eng.num_running, labels,
         "Number of requests in model execution batches.")  # fmt: skip
    _one(lines, "vllm:num_requests_waiting", "gauge", eng.num_waiting, labels,
         "Number of requests waiting to be processed.")  # fmt: skip
    _one(lines, "vllm:kv_cache_usage_perc", "gauge", eng.kv.usage, labels,
         "KV-cache usage. 1 means 100 percent usage.")  # fmt: skip
    _one(lines, "vllm:prefix_cache_queries_total", "counter", c.prefix_cache_queries, labels,
         "Prefix cache queries, in terms of number of queried tokens.")  # fmt: skip
    _one(lines, "vllm:prefix_cache_hits_total", "counter", c.prefix_cache_hits, labels,
         "Prefix cache hits, in terms of number of cached tokens.")  # fmt: skip
    _one(lines, "vllm:prompt_tokens_cached_total", "counter", c.cached_tokens, labels,
         "Number of cached prompt tokens (local prefix cache).")  # fmt: skip
    _one(lines, "vllm:num_preemptions_total", "counter", c.preemptions, labels,
         "Cumulative number of preemption from the engine.")  # fmt: skip
    _one(lines, "vllm:prompt_tokens_total", "counter", c.prompt_tokens_received, labels,
         "Number of prefill tokens processed.")  # fmt: skip
    _one(lines, "vllm:generation_tokens_total", "counter", c.generation_tokens, labels,
         "Number of generation tokens processed.")  # fmt: skip
    cache_labels = {
        "block_size": str(BLOCK_SIZE),
        "num_gpu_blocks": str(eng.kv.num_blocks),
        "kv_cache_size_tokens": str(eng.kv.num_blocks * BLOCK_SIZE),
        "enable_prefix_caching": str(eng.kv.enable_prefix_caching),
        "cache_dtype": "auto",
        "gpu_memory_utilization": "0.9",
        "engine": "0",
    }
    _one(lines, "vllm:cache_config_info", "gauge", 1.0, cache_labels,
         "Information of the LLMEngine CacheConfig")  # fmt: skip
    _hist(lines, "vllm:time_to_first_token_seconds", drv.ttft, labels,
          "Histogram of time to first token in seconds.")  # fmt: skip
    _hist(lines, "vllm:inter_token_latency_seconds", drv.itl, labels,
          "Histogram of inter-token latency in seconds.")  # fmt: skip
    _hist(lines, "vllm:e2e_request_latency_seconds", drv.e2e, labels,
          "Histogram of e2e request latency in seconds.")  # fmt: skip
    _hist(lines, "vllm:request_queue_time_seconds", drv.queue, labels,
          "Histogram of time spent in WAITING phase for request.")  # fmt: skip
    _hist(lines, "vllm:request_prefill_time_seconds", drv.prefill, labels,
          "Histogram of time spent in PREFILL phase for request.")  # fmt: skip
    _hist(lines, "vllm:request_decode_time_seconds", drv.decode, labels,
          "Histogram of time spent in DECODE phase for request.")  # fmt: skip
    _hist(lines, "vllm:request_inference_time_seconds", drv.inference, labels,
          "Histogram of time spent in RUNNING phase for request.")  # fmt: skip
    lines.append("# HELP vllm:request_success_total Count of successfully processed requests.")
    lines.append("# TYPE vllm:request_success_total counter")
    for reason in sorted(drv.finished_by_reason):
        pairs = {**labels, "finished_reason": reason}
        lines.append(f"vllm:request_success_total{_labels(pairs)} {drv.finished_by_reason[reason]}")
    _emulator_lines(lines, server)
    return "\n".join(lines) + "\n"


def _emulator_lines(lines: list[str], server: Serving) -> None:
    drv = server.driver
    c = server.engine.counters
    labels = {"model_name": server.config.model}
    _one(lines, "emulator:lag_seconds", "gauge", drv.lag_s, labels,
         "Wall seconds the last engine step started after its scheduled time.")  # fmt: skip
    _one(lines, "emulator:max_lag_seconds", "gauge", drv.max_lag_s, labels,
         "Largest step-start lag since start or the last reset.")  # fmt: skip
    _one(lines, "emulator:time_scale", "gauge", drv.time_scale, labels,
         "Engine seconds per wall second.")  # fmt: skip
    _one(lines, "emulator:prefill_tokens_computed_total", "counter", c.prefill_tokens_computed,
         labels, "Prompt tokens run through the model (recomputation included).")  # fmt: skip
    _one(lines, "emulator:evictions_total", "counter", server.engine.kv.evictions, labels,
         "Cached blocks evicted to make room.")  # fmt: skip


def _render_sglang(server: Serving) -> str:
    eng = server.engine
    c = eng.counters
    drv = server.driver
    labels = {"model_name": server.config.model}
    lines: list[str] = []
    hit = c.prefix_cache_hits / c.prefix_cache_queries if c.prefix_cache_queries else 0.0
    _one(lines, "sglang:num_running_reqs", "gauge", eng.num_running, labels,
         "The number of running requests.")  # fmt: skip
    _one(lines, "sglang:num_queue_reqs", "gauge", eng.num_waiting, labels,
         "The number of requests in the waiting queue.")  # fmt: skip
    _one(lines, "sglang:token_usage", "gauge", eng.kv.usage, labels,
         "The token usage.")  # fmt: skip
    _one(lines, "sglang:max_total_num_tokens", "gauge", eng.kv_capacity_tokens, labels,
         "Maximum total number of tokens in the KV cache pool.")  # fmt: skip
    _one(lines, "sglang:cache_hit_rate", "gauge", hit, labels,
         "The prefix cache hit rate.")  # fmt: skip
    _one(lines, "sglang:num_retracted_reqs", "gauge", c.preemptions, labels,
         "The number of retracted requests.")  # fmt: skip
    _one(lines, "sglang:prompt_tokens_total", "counter", c.prompt_tokens_received, labels,
         "Number of prefill tokens processed.")  # fmt: skip
    _one(lines, "sglang:cached_tokens_total", "counter", c.cached_tokens,
         {**labels, "cache_source": "device"},
         "Number of cached prompt tokens by source.")  # fmt: skip
    _one(lines, "sglang:generation_tokens_total", "counter", c.generation_tokens, labels,
         "Number of generation tokens processed.")  # fmt: skip
    _hist(lines, "sglang:time_to_first_token_seconds", drv.ttft, labels,
          "Histogram of time to first token in seconds.")  # fmt: skip
    _hist(lines, "sglang:inter_token_latency_seconds", drv.itl, labels,
          "Histogram of inter-token latency in seconds.")  # fmt: skip
    _emulator_lines(lines, server)
    return "\n".join(lines) + "\n"


def request_phases(engine: Engine, since: float) -> list[list[Any]]:
    """Rows of `PHASE_FIELDS` for the finished requests that arrived at or after `since`."""
    return [
        [
            r.request_id,
            r.arrival,
            r.first_scheduled,
            r.first_token_time,
            r.finish_time,
            r.num_preemptions,
            r.prompt_len,
            r.cached_tokens,
            r.num_output,
        ]
        for r in engine.finished_log
        if r.arrival >= since
    ]


def stats_dict(server: Serving) -> dict[str, Any]:
    """`GET /emulator/stats`: the engine counters and the driver's lag."""
    eng = server.engine
    c = eng.counters
    drv = server.driver
    return {
        "profile": server.config.profile,
        "flavor": server.config.flavor,
        "time_scale": drv.time_scale,
        "requests": c.requests,
        "finished": c.finished,
        "aborted": c.aborted,
        "running": eng.num_running,
        "waiting": eng.num_waiting,
        "prompt_tokens_received": c.prompt_tokens_received,
        "prefill_tokens_computed": c.prefill_tokens_computed,
        "cached_tokens": c.cached_tokens,
        "prefix_cache_queries": c.prefix_cache_queries,
        "prefix_cache_hits": c.prefix_cache_hits,
        "generation_tokens": c.generation_tokens,
        "preemptions": c.preemptions,
        "evictions": eng.kv.evictions,
        "steps": c.steps,
        "busy_time_s": c.busy_time,
        "engine_time_s": drv.now(),
        "mean_queue_time_s": c.queue_time_sum / c.ttft_count if c.ttft_count else None,
        "mean_ttft_s": c.ttft_sum / c.ttft_count if c.ttft_count else None,
        "kv_cache_usage": eng.kv.usage,
        "kv_capacity_tokens": eng.kv_capacity_tokens,
        "lag_s": drv.lag_s,
        "max_lag_s": drv.max_lag_s,
        "late_steps": drv.late_steps,
        "max_wake_late_s": drv.max_wake_late_s,
        "max_work_s": drv.max_work_s,
        "agentic_context": server.hints.stats(),
    }
