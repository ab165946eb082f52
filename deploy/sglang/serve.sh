#!/usr/bin/env bash
# Launch an SGLang server with the flags langgraph-batch benefits from.
# Flags checked against the SGLang 0.5.23 sources (sglang/srt/arg_groups/fields/
# {schedule,serving,observability}.py, sglang/srt/function_call/parser_names.py).
#
#   MODEL=Qwen/Qwen2.5-7B-Instruct deploy/sglang/serve.sh [extra flags...]
#
# Then point langgraph-batch at it:  LGB_BACKEND_URL=sglang://127.0.0.1:30000
#
# Safe by default: it listens on loopback only. To serve other machines, set a key and
# a host, and read "Exposing a server" in deploy/README.md (TLS proxy, firewall):
#
#   export SGLANG_API_KEY="$(openssl rand -hex 32)"  # clients: LGB_API_KEY=<the same>
#   HOST=0.0.0.0 deploy/sglang/serve.sh
#
# SGLang takes the key only as --api-key (SGLANG_API_KEY is passed as that flag), so
# local users can read it in the process list: run the server under its own account.
set -euo pipefail

MODEL="${MODEL:-Qwen/Qwen2.5-7B-Instruct}"
SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-$MODEL}"
HOST="${HOST:-127.0.0.1}"
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

case "$HOST" in
  127.*|localhost|::1) ;;
  *)
    if [[ -z "${SGLANG_API_KEY:-}" && "${ALLOW_UNAUTHENTICATED:-0}" != 1 ]]; then
      echo "serve.sh: HOST=$HOST serves other machines but SGLANG_API_KEY is not set." >&2
      echo "  Set SGLANG_API_KEY (and read deploy/README.md), or ALLOW_UNAUTHENTICATED=1." >&2
      exit 2
    fi
    ;;
esac
if [[ -n "${SGLANG_API_KEY:-}" ]]; then
  args+=(--api-key "$SGLANG_API_KEY")
fi

exec python -m sglang.launch_server "${args[@]}" "$@"
