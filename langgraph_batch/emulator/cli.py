"""`langgraph-batch emulate`: serve the vLLM/SGLang emulator over HTTP.

Prints one line `langgraph-batch emulator ready at http://HOST:PORT` on
stdout once it listens (with `--port 0`, the port it picked).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
from collections.abc import Sequence

from langgraph_batch._extras import missing_extra
from langgraph_batch.emulator.config import FAULTS, EmulatorConfig
from langgraph_batch.emulator.costs import PROFILES

__all__ = ("build_parser", "config_from_args", "main")

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `langgraph-batch emulate`."""
    d = EmulatorConfig()
    p = argparse.ArgumentParser(
        prog="langgraph-batch emulate",
        description="An emulated vLLM (or SGLang) server: real HTTP, modelled GPU timing.",
    )
    p.add_argument("--host", default=d.host, help="bind address (default: loopback)")
    p.add_argument("--port", type=int, default=d.port, help="port; 0 picks a free one")
    p.add_argument("--profile", default=d.profile, choices=sorted(PROFILES))
    p.add_argument("--flavor", default=d.flavor, choices=["vllm", "sglang"])
    p.add_argument("--scenario", default=d.scenario, choices=["agent", "echo"])
    p.add_argument("--time-scale", type=float, default=d.time_scale,
                   help="engine seconds per wall second (50: 50x faster than the GPU)")  # fmt: skip
    p.add_argument("--kv-tokens", type=int, default=None, help="KV capacity in tokens")
    p.add_argument(
        "--kv-offloading-size",
        type=float,
        default=None,
        help="GiB of host memory for a second KV tier (vLLM's native CPU offload)",
    )
    p.add_argument(
        "--kv-offload-tokens",
        type=int,
        default=None,
        help="the second KV tier's capacity in tokens (instead of --kv-offloading-size)",
    )
    p.add_argument("--block-size", type=int, default=d.block_size, help="KV block size in tokens")
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    p.add_argument("--max-batched-tokens", type=int, default=d.max_batched_tokens)
    p.add_argument("--scheduling-policy", default=d.scheduling_policy, choices=["fcfs", "priority"])
    p.add_argument("--model", default=d.model, help="served model name")
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--output-tokens", type=int, default=d.output_tokens,
                   help="length of a final answer / echo text")  # fmt: skip
    p.add_argument("--turns", type=int, default=d.turns, help="agent: model calls per conversation")
    p.add_argument("--repeat-tool-args", action=argparse.BooleanOptionalAction,
                   default=d.repeat_tool_args,
                   help="agent: later tool calls repeat the first one's arguments")  # fmt: skip
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=d.enable_prefix_caching)  # fmt: skip
    p.add_argument("--enable-auto-tool-choice", action=argparse.BooleanOptionalAction,
                   default=d.enable_auto_tool_choice)  # fmt: skip
    p.add_argument("--prompt-tokens-details", action=argparse.BooleanOptionalAction,
                   default=d.prompt_tokens_details,
                   help="report usage.prompt_tokens_details.cached_tokens")  # fmt: skip
    p.add_argument("--fault-rate", type=float, default=d.fault_rate)
    p.add_argument("--faults", default=",".join(d.faults),
                   help=f"comma-separated, from: {', '.join(FAULTS)}")  # fmt: skip
    p.add_argument("--slow-first-token-s", type=float, default=d.slow_first_token_s)
    p.add_argument("--retry-after-s", type=float, default=d.retry_after_s)
    p.add_argument(
        "--batch-delay-s",
        type=float,
        default=d.batch_delay_s,
        help="provider batch APIs: seconds a batch waits before its items run",
    )
    for name, what in (("rpm", "requests"), ("tpm", "input + output tokens"),
                       ("itpm", "input tokens"), ("otpm", "output tokens")):  # fmt: skip
        p.add_argument(f"--rate-limit-{name}", type=int, default=None,
                       help=f"{what} per minute before a 429 (60 / time-scale wall s)")  # fmt: skip
    p.add_argument("--agentic-context", action=argparse.BooleanOptionalAction,
                   default=d.agentic_context,
                   help="accept vllm-router's vllm_xargs.agentic_context hints")  # fmt: skip
    p.add_argument("--hosted", default=None, choices=["anthropic", "openai"],
                   help="a hosted API's prompt caching (anthropic: also /v1/messages)")  # fmt: skip
    p.add_argument("--log-level", default=d.log_level,
                   choices=["critical", "error", "warning", "info", "debug"])  # fmt: skip
    return p


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    """An `EmulatorConfig` from parsed arguments."""
    return EmulatorConfig(
        host=args.host,
        port=args.port,
        profile=args.profile,
        flavor=args.flavor,
        scenario=args.scenario,
        time_scale=args.time_scale,
        kv_tokens=args.kv_tokens,
        kv_offloading_size=args.kv_offloading_size,
        kv_offload_tokens=args.kv_offload_tokens,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_batched_tokens=args.max_batched_tokens,
        scheduling_policy=args.scheduling_policy,
        model=args.model,
        max_model_len=args.max_model_len,
        seed=args.seed,
        output_tokens=args.output_tokens,
        turns=args.turns,
        repeat_tool_args=args.repeat_tool_args,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        prompt_tokens_details=args.prompt_tokens_details,
        fault_rate=args.fault_rate,
        faults=tuple(f for f in args.faults.split(",") if f),
        slow_first_token_s=args.slow_first_token_s,
        retry_after_s=args.retry_after_s,
        batch_delay_s=args.batch_delay_s,
        agentic_context=args.agentic_context,
        rate_limit_rpm=args.rate_limit_rpm,
        rate_limit_tpm=args.rate_limit_tpm,
        rate_limit_itpm=args.rate_limit_itpm,
        rate_limit_otpm=args.rate_limit_otpm,
        hosted=args.hosted,
        log_level=args.log_level,
    )


async def _run(config: EmulatorConfig) -> None:
    try:
        import uvicorn
    except ImportError:  # the optional `emulator` extra
        raise missing_extra("emulator", "the emulator needs uvicorn and starlette") from None

    from langgraph_batch.emulator.process import READY_PREFIX, _bound_port, _uvicorn_config
    from langgraph_batch.emulator.server import EmulatorServer

    server = EmulatorServer(config)
    userver = uvicorn.Server(_uvicorn_config(server))
    task = asyncio.get_running_loop().create_task(userver.serve())
    while not userver.started:
        if task.done():
            await task
            return
        await asyncio.sleep(0.01)
    url = f"http://{config.host}:{_bound_port(userver)}"
    sys.stdout.write(f"{READY_PREFIX}{url}\n")
    sys.stdout.flush()
    logger.info("emulator serving %s on %s (profile %s)", config.model, url, config.profile)
    await task


_SWITCH_INTERVAL_S = 0.0005
_GC_THRESHOLDS = (20_000, 20, 100)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `langgraph-batch emulate`; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    # The engine thread must get the GIL back within a fraction of a step
    # when its sleep ends while the event loop is busy (default: 5 ms).
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    # A full cyclic collection over a thousand live requests holds the GIL for
    # tens of milliseconds: collect young objects less often, old ones never
    # during a burst (the server makes little cyclic garbage).
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLDS)
    try:
        asyncio.run(_run(config))
    except KeyboardInterrupt:
        return 0
    return 0
