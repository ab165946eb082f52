#!/usr/bin/env bash
# Launch an SGLang server with the flags langgraph-batch benefits from.
# Flags checked against the SGLang 0.5.23 sources (sglang/srt/arg_groups/fields/
# {schedule,serving,observability}.py, sglang/srt/function_call/parser_names.py).
#
#   MODEL=Qwen/Qwen2.5-7B-Instruct deploy/sglang/serve.sh [extra flags...]
#
# Then point langgraph-batch at it:  LGB_BACKEND_URL=sglang://127.0.0.1:30000
set -euo pipefail

MODEL="${MODEL:-Qwen/Qwen2.5-7B-Instruct}"
SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-$MODEL}"
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-30000}"
# qwen25 for Qwen2.5, hermes for Hermes-style templates, llama3 for Llama 3.x.
TOOL_CALL_PARSER="${TOOL_CALL_PARSER:-qwen25}"
MAX_RUNNING_REQUESTS="${MAX_RUNNING_REQUESTS:-256}"
MEM_FRACTION_STATIC="${MEM_FRACTION_STATIC:-0.85}"
CONTEXT_LENGTH="${CONTEXT_LENGTH:-32768}"

args=(
  --model-path "$MODEL"
  --served-model-name "$SERVED_MODEL_NAME"
  --host "$HOST" --port "$PORT"
  # Prometheus /metrics (sglang:num_queue_reqs, token_usage, cache_hit_rate, ...).
  --enable-metrics
  # usage.prompt_tokens_details.cached_tokens in OpenAI responses.
  --enable-cache-report
  # OpenAI tool calls (ReAct agents).
  --tool-call-parser "$TOOL_CALL_PARSER"
  # Lets the server honour per-request priorities (HIGHER runs first on SGLang). The client
  # sends them only with backend_from_url(url, priority_scheduling=True); see README.md.
  --enable-priority-scheduling
  --max-running-requests "$MAX_RUNNING_REQUESTS"
  --mem-fraction-static "$MEM_FRACTION_STATIC"
  --context-length "$CONTEXT_LENGTH"
)

exec python -m sglang.launch_server "${args[@]}" "$@"
