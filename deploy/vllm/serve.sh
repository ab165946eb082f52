#!/usr/bin/env bash
# Launch a vLLM OpenAI-compatible server with the flags langgraph-batch benefits from.
# Flags checked against the vLLM 0.20.0 and 0.33.0 sources (vllm/engine/arg_utils.py,
# vllm/entrypoints/*/cli_args.py, vllm/config/{cache,scheduler}.py). See README.md here.
#
#   MODEL=Qwen/Qwen2.5-7B-Instruct deploy/vllm/serve.sh [extra vllm serve flags...]
#
# Then point langgraph-batch at it:  LGB_BACKEND_URL=vllm://127.0.0.1:8000
#
# Safe by default: it listens on loopback only. To serve other machines, set a key and
# a host, and read "Exposing a server" in deploy/README.md (TLS proxy, firewall):
#
#   export VLLM_API_KEY="$(openssl rand -hex 32)"    # clients: LGB_API_KEY=<the same>
#   HOST=0.0.0.0 deploy/vllm/serve.sh
#
# vLLM reads VLLM_API_KEY itself (the same check as --api-key, and the key stays out of
# the process list, where --api-key would show it to every local user).
set -euo pipefail

MODEL="${MODEL:-Qwen/Qwen2.5-7B-Instruct}"
SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-$MODEL}"
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-8000}"
# hermes fits Qwen2.5/Qwen3 and Hermes models; llama3_json for Llama 3.x; see README.md.
TOOL_CALL_PARSER="${TOOL_CALL_PARSER:-hermes}"
MAX_NUM_SEQS="${MAX_NUM_SEQS:-256}"
MAX_NUM_BATCHED_TOKENS="${MAX_NUM_BATCHED_TOKENS:-8192}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-32768}"
GPU_MEMORY_UTILIZATION="${GPU_MEMORY_UTILIZATION:-0.90}"

args=(
  "$MODEL"
  --host "$HOST" --port "$PORT"
  --served-model-name "$SERVED_MODEL_NAME"
  # Sibling agents share long prompt prefixes; V1 has this on by default, say it anyway.
  --enable-prefix-caching
  # The scheduler sends `priority` (lower runs first); vLLM ignores it under the default fcfs.
  --scheduling-policy priority
  # tool_choice "auto" (what ReAct agents send) is an HTTP 400 without these two.
  --enable-auto-tool-choice --tool-call-parser "$TOOL_CALL_PARSER"
  # usage.prompt_tokens_details.cached_tokens: the cache-hit figures in stats and benchmarks.
  --enable-prompt-tokens-details
  # Echo X-Request-Id so client logs and server logs line up.
  --enable-request-id-headers
  --max-num-seqs "$MAX_NUM_SEQS"
  --max-num-batched-tokens "$MAX_NUM_BATCHED_TOKENS"
  --max-model-len "$MAX_MODEL_LEN"
  --gpu-memory-utilization "$GPU_MEMORY_UTILIZATION"
  # /metrics is on by default. Do NOT pass --disable-log-stats: it also stops the
  # Prometheus gauges (num_requests_waiting, kv_cache_usage_perc) the scheduler adapts to.
)

case "$HOST" in
  127.*|localhost|::1) ;;
  *)
    if [[ -z "${VLLM_API_KEY:-}" && "${ALLOW_UNAUTHENTICATED:-0}" != 1 ]]; then
      echo "serve.sh: HOST=$HOST serves other machines but VLLM_API_KEY is not set." >&2
      echo "  Set VLLM_API_KEY (and read deploy/README.md), or ALLOW_UNAUTHENTICATED=1." >&2
      exit 2
    fi
    ;;
esac
if [[ -n "${VLLM_API_KEY:-}" ]]; then
  export VLLM_API_KEY
fi

exec vllm serve "${args[@]}" "$@"
