#!/usr/bin/env bash
# Serve a model's architecture with RANDOM weights for `langgraph-batch bench --server`.
# The arithmetic per token is the real model's (from its config.json); what it says is
# noise, so the benchmark forces every shape: a named tool_choice over an enum of the
# workload's keys (structured outputs keep it valid) and answers of exactly the
# workload's length (max_tokens + ignore_eos). See README.md here, "Benchmarking".
#
#   MODEL=/models/llama-3-8b deploy/vllm/bench.sh   # a directory with config.json + tokenizer
#   MODEL=meta-llama/Meta-Llama-3-8B-Instruct deploy/vllm/bench.sh   # or a Hugging Face id
#   langgraph-batch bench W1 --server vllm://127.0.0.1:8000 --model bench-model
#
# Loopback only: a benchmark server has no business on the network.
set -euo pipefail

MODEL="${MODEL:?set MODEL to a directory holding config.json and the tokenizer files, or a Hugging Face id}"
SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-bench-model}"
PORT="${PORT:-8000}"
# hermes fits Qwen2.5/Qwen3/Hermes chat templates, llama3_json Llama 3.x (only `auto`
# tool choice uses it; the forced tool turn names its tool).
TOOL_CALL_PARSER="${TOOL_CALL_PARSER:-hermes}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-8192}"
GPU_MEMORY_UTILIZATION="${GPU_MEMORY_UTILIZATION:-0.92}"

args=(
  "$MODEL"
  --host 127.0.0.1 --port "$PORT"
  --served-model-name "$SERVED_MODEL_NAME"
  # Random weights of the right shape: no download of, or memory for, real weights.
  --load-format dummy
  # Random weights must still emit a valid tool call (JSON over the enum of keys);
  # without disable_any_whitespace xgrammar lets them pad JSON with whitespace forever.
  --structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}'
  --enable-prefix-caching
  --enable-auto-tool-choice --tool-call-parser "$TOOL_CALL_PARSER"
  # usage.prompt_tokens_details.cached_tokens in every response.
  --enable-prompt-tokens-details
  --max-model-len "$MAX_MODEL_LEN"
  --gpu-memory-utilization "$GPU_MEMORY_UTILIZATION"
  # Defaults otherwise (fcfs, chunked prefill at 8192 tokens): what a user runs.
  # /metrics must stay on (no --disable-log-stats): the benchmark reads its deltas.
)

# vLLM 0.32 builds a named tool_choice's constraint itself (a structural tag that lets
# random weights pad the JSON with whitespace) unless this is 0; then the bench pins each
# forced call's arguments with its own tag (langgraph_batch/bench/contenders/_graph.py).
export VLLM_ENFORCE_STRICT_TOOL_CALLING="${VLLM_ENFORCE_STRICT_TOOL_CALLING:-0}"

exec vllm serve "${args[@]}" "$@"
