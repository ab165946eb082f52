"""`/metrics` (Prometheus text, vLLM's or SGLang's names) and `/emulator/stats` JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langgraph_batch.emulator.driver import Histogram
from langgraph_batch.emulator.offload import GIB, OffloadCounters

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
         "Number of cached prompt tokens (prefix cache and KV connector).")  # fmt: skip
    _one(lines, "vllm:num_preemptions_total", "counter", c.preemptions, labels,
         "Cumulative number of preemption from the engine.")  # fmt: skip
    _one(lines, "vllm:prompt_tokens_total", "counter", c.prompt_tokens_received, labels,
         "Number of prefill tokens processed.")  # fmt: skip
    _one(lines, "vllm:generation_tokens_total", "counter", c.generation_tokens, labels,
         "Number of generation tokens processed.")  # fmt: skip
    tier = eng.offload
    bytes_per_token = eng.profile.kv_bytes_per_token
    # vLLM labels every CacheConfig field (`CacheConfig.metrics_info`): the
    # tier's GiB, and `kv_cache_memory_bytes`, which the emulator's token-sized
    # KV stands for (a server started with --kv-cache-memory-bytes reports it).
    offload_gib = server.config.kv_offloading_size
    if offload_gib is None and tier is not None:
        offload_gib = tier.capacity_tokens * bytes_per_token / GIB
    cache_labels = {
        "block_size": str(eng.block_size),
        "num_gpu_blocks": str(eng.kv.num_blocks),
        "kv_cache_size_tokens": str(eng.kv_capacity_tokens),
        "kv_cache_memory_bytes": str(eng.kv_capacity_tokens * bytes_per_token),
        "enable_prefix_caching": str(eng.kv.enable_prefix_caching),
        "cache_dtype": "auto",
        "gpu_memory_utilization": "0.9",
        "kv_offloading_size": str(offload_gib),
        "kv_offloading_backend": "native",
        "engine": "0",
    }
    _one(lines, "vllm:cache_config_info", "gauge", 1.0, cache_labels,
         "Information of the LLMEngine CacheConfig")  # fmt: skip
    _offload_lines(lines, eng, labels)
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


def _offload_lines(lines: list[str], eng: Engine, labels: dict[str, str]) -> None:
    """The KV connector's lines: its prefix-cache counters (`v1/metrics/loggers.py`).

    With the tier, also its transfer counters (`offloading/metrics.py`).
    """
    tier = eng.offload
    t = tier.counters if tier is not None else OffloadCounters()
    _one(lines, "vllm:external_prefix_cache_queries_total", "counter", t.external_queries,
         labels, "External prefix cache queries from KV connector cross-instance cache "
         "sharing, in terms of number of queried tokens.")  # fmt: skip
    _one(lines, "vllm:external_prefix_cache_hits_total", "counter", t.external_hits, labels,
         "External prefix cache hits from KV connector cross-instance cache sharing, "
         "in terms of number of cached tokens.")  # fmt: skip
    name = "vllm:prompt_tokens_cached_by_source_total"
    lines.append(f"# HELP {name} Prefix-cache hit tokens by the cache tier that supplied them.")
    lines.append(f"# TYPE {name} counter")
    by_source = {"device": eng.counters.prefix_cache_hits, "host": t.external_hits}
    for source, n in by_source.items():
        lines.append(f"{name}{_labels({**labels, 'source': source})} {n}")
    if tier is None:
        return
    _one(lines, "vllm:kv_offload_store_bytes_total", "counter", t.store_bytes, labels,
         "Total bytes stored from GPU to offload storage.")  # fmt: skip
    _one(lines, "vllm:kv_offload_load_bytes_total", "counter", t.load_bytes, labels,
         "Total bytes loaded from offload storage to GPU.")  # fmt: skip
    _one(lines, "vllm:kv_offload_load_time_total", "counter", t.load_time_s, labels,
         "Total load time from offload storage to GPU, in seconds.")  # fmt: skip
    _one(lines, "vllm:kv_offload_allocation_failure_total", "counter", t.allocation_failures,
         labels, "Number of KV offload store allocation attempts that failed.")  # fmt: skip


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
        "rate_limited": server.rate_limited,
        "late_steps": drv.late_steps,
        "max_wake_late_s": drv.max_wake_late_s,
        "max_work_s": drv.max_work_s,
        "agentic_context": server.hints.stats(),
        "offload": _offload_stats(eng),
    }


def _offload_stats(eng: Engine) -> dict[str, Any] | None:
    """The second tier's figures for `/emulator/stats` (None: no tier)."""
    tier = eng.offload
    if tier is None:
        return None
    t = tier.counters
    return {
        "capacity_tokens": tier.capacity_tokens,
        "stored_blocks": tier.num_stored,
        "stores": t.stored_blocks,
        "loaded_tokens": t.loaded_tokens,
        "load_time_s": t.load_time_s,
        "evicted_blocks": t.evicted_blocks,
        "allocation_failures": t.allocation_failures,
        "external_queries": t.external_queries,
        "external_hits": t.external_hits,
    }
