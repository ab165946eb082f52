# ruff: noqa: E501  (the samples keep the engines' real, long lines)
"""The Prometheus text parser and the engines' metric mappings."""

from __future__ import annotations

import math

from langgraph_batch.backends._prometheus import parse_prometheus
from langgraph_batch.backends.sglang import parse_sglang_metrics
from langgraph_batch.backends.vllm import parse_vllm_metrics

# Shaped like vLLM 0.33's /metrics with two engines (data parallel), trimmed.
VLLM_METRICS = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1000.0
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 600.0
vllm:prefix_cache_hits_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 400.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:num_preemptions_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 51200.0
vllm:prompt_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 48800.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7000.0
vllm:generation_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3000.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 40.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 40.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.2
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27500",prefix_caching_hash_algo="sha256"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27500",prefix_caching_hash_algo="sha256"} 1.0
garbage line without value
"""

SGLANG_METRICS = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 17.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 4.0
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 0.42
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 412000.0
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 0.83
# TYPE sglang:num_retracted_reqs gauge
sglang:num_retracted_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 2.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{engine_type="unified",is_streaming="false",model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 1000.0
sglang:prompt_tokens_total{engine_type="unified",is_streaming="true",model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 500.0
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{engine_type="unified",is_streaming="true",model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 90.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="Qwen/Qwen2.5-7B-Instruct"} 1100.0
sglang:cached_tokens_total{cache_source="host",model_name="Qwen/Qwen2.5-7B-Instruct"} 100.0
"""


def test_parser_labels_values_and_junk() -> None:
    s = parse_prometheus(
        '# comment\nplain 3\nwith{a="x,y",b="q\\"uote"} 1.5 1700000000000\n'
        'nan_metric NaN\ninf{le="+Inf"} +Inf\nbroken{a="x" 2\nnovalue{a="1"}\n\n'
    )
    assert s.sum("plain") == 3.0
    [(labels, value)] = s.get("with")
    assert labels == {"a": "x,y", "b": 'q"uote'}
    assert value == 1.5
    assert s.sum("nan_metric") == 0.0
    assert math.isinf(s.get("inf")[0][1])
    assert "broken" not in s
    assert "novalue" not in s
    assert s.sum("missing") is None
    assert s.mean("missing") is None


def test_parser_name_filter() -> None:
    s = parse_prometheus(VLLM_METRICS, names={"vllm:num_requests_running"})
    assert list(s.names()) == ["vllm:num_requests_running"]


def test_vllm_metrics() -> None:
    m = parse_vllm_metrics(VLLM_METRICS)
    assert m.num_requests_running == 20.0
    assert m.num_requests_waiting == 3.0
    assert m.kv_cache_usage == 0.375
    assert m.num_preemptions_total == 3.0
    assert m.prefix_cache_queries_total == 2000.0
    assert m.prefix_cache_hits_total == 1000.0
    assert m.cache_hit_rate == 0.5
    assert m.prompt_tokens_total == 100000.0
    assert m.generation_tokens_total == 10000.0
    assert m.block_size == 16
    assert m.kv_capacity_tokens == 2 * 16 * 27500
    assert m.prefix_caching is True
    assert m.engines == 2  # data-parallel engines of one server


def test_vllm_metrics_before_kv_is_sized() -> None:
    m = parse_vllm_metrics(
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="None"} 1.0\n'
    )
    assert m.kv_capacity_tokens is None
    assert m.block_size == 16
    assert m.num_requests_running is None


def test_sglang_metrics() -> None:
    m = parse_sglang_metrics(SGLANG_METRICS)
    assert m.num_requests_running == 17.0
    assert m.num_requests_waiting == 4.0
    assert m.kv_cache_usage == 0.42
    assert m.kv_capacity_tokens == 412000
    assert m.cache_hit_rate == 0.83
    assert m.num_preemptions_total == 2.0
    assert m.prompt_tokens_total == 1500.0
    assert m.generation_tokens_total == 90.0
    # Prompt tokens served from the radix cache, every cache_source summed:
    # with prompt_tokens_total, the prefill the engine computed (the decode cap's input).
    assert m.prefix_cache_hits_total == 1200.0
