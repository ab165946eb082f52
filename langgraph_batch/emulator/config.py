"""`EmulatorConfig`: every option of the emulator, for the CLI and for Python."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from langgraph_batch.emulator.costs import get_profile
from langgraph_batch.emulator.offload import GIB

__all__ = ("FAULTS", "EmulatorConfig")

FAULTS = ("429", "500", "503", "drop", "truncate", "bad_tool_args", "slow_first_token")
"""Fault names accepted per request (`emulator.fault`) and in `faults`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatorConfig:
    """Options of one emulated inference server.

    Example:
        ```python
        cfg = EmulatorConfig(port=0, time_scale=50.0)
        with EmulatorProcess(cfg) as emu:
            print(emu.url)
        ```

    Raises:
        ValueError: an option is out of range or unknown (at construction).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    """0 picks a free port (the server reports it)."""
    profile: str = "h100-llama3-8b"
    """Cost model: h100-llama3-8b, a100-llama3-8b, a10g-qwen2.5-7b or zero."""
    flavor: Literal["vllm", "sglang"] = "vllm"
    scenario: Literal["agent", "echo"] = "agent"
    time_scale: float = 1.0
    """Engine seconds per wall second (50 runs 50x faster than the GPU)."""
    kv_tokens: int | None = None
    """KV capacity in tokens (default: the profile's); vLLM's `num_gpu_blocks` is
    this over `block_size`, one of them the null block."""
    kv_offloading_size: float | None = None
    """GiB of host memory for a second KV tier (vLLM's `--kv-offloading-size`, the
    native CPU offload connector), in blocks of the profile's `kv_bytes_per_token`
    x `block_size`. None: no tier (or set `kv_offload_tokens`)."""
    kv_offload_tokens: int | None = None
    """The second tier's capacity in tokens, instead of `kv_offloading_size`."""
    block_size: int = 16
    """KV block size in tokens (vLLM's `--block-size`: 16 on GPUs, a multiple of
    32 on the CPU backend)."""
    max_num_seqs: int = 1024
    max_batched_tokens: int = 8192
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    model: str = "emulated-llama-3-8b"
    max_model_len: int = 32768
    seed: int = 0
    enable_prefix_caching: bool = True
    output_tokens: int = 64
    """Default length of a final answer / echo text, in tokens."""
    turns: int = 2
    """Agent scenario: model calls per conversation (turns-1 tool calls)."""
    repeat_tool_args: bool = False
    """Agent scenario: every tool call of a conversation repeats its first one's
    arguments (the scenario before per-turn arguments: what coalescing answers
    from its cache); off, the n-th later call asks for `<key>.<n>`."""
    enable_auto_tool_choice: bool = True
    """Like vLLM's --enable-auto-tool-choice; off: `tool_choice: auto` is a 400."""
    prompt_tokens_details: bool = True
    """Report `usage.prompt_tokens_details.cached_tokens` (vLLM's
    --enable-prompt-tokens-details)."""
    fault_rate: float = 0.0
    """Probability that a request gets one of `faults` (seeded by `seed`)."""
    faults: tuple[str, ...] = ("429", "500", "503")
    slow_first_token_s: float = 2.0
    """Extra engine seconds before the first token under `slow_first_token`."""
    retry_after_s: float = 1.0
    """`Retry-After` of injected 429s."""
    agentic_context: bool = False
    """vLLM flavour: accept vllm-router's `vllm_xargs.agentic_context` program hints, as
    an agent-aware engine (AgentInfer's) does, and report them in `/emulator/stats`.
    Off (stock vLLM): `vllm_xargs` takes only string/number values, the object is a 400."""
    batch_delay_s: float = 1.0
    """Provider batch APIs (`/v1/batches`, `/v1/messages/batches`): wall seconds a batch
    waits before its items run (a batch finishes after this delay plus their run)."""
    rate_limit_rpm: int | None = None
    """Requests per minute before a 429 (None: unlimited). Every response then
    carries the provider's limit headers (`emulator._ratelimit`); the minute is
    `60 / time_scale` wall seconds."""
    rate_limit_tpm: int | None = None
    """Input + output tokens per minute (OpenAI's TPM; output counted at
    `max_tokens` on admission, settled at the end)."""
    rate_limit_itpm: int | None = None
    """Input tokens per minute (Anthropic's ITPM)."""
    rate_limit_otpm: int | None = None
    """Output tokens per minute (Anthropic's OTPM)."""
    hosted: Literal["anthropic", "openai"] | None = None
    """A hosted API's prompt caching instead of the engine's (docs/hosted-apis.md):
    "anthropic" also serves `POST /v1/messages` with Anthropic's cache rules and
    latency model; "openai" reports `cached_tokens` on chat completions by
    OpenAI's rules (`prompt_cache_key`, `prompt_cache_retention`). None: off."""
    log_level: str = "warning"

    def __post_init__(self) -> None:
        get_profile(self.profile)
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")
        if self.flavor not in ("vllm", "sglang"):
            raise ValueError(f"flavor must be 'vllm' or 'sglang', got {self.flavor!r}")
        if self.scenario not in ("agent", "echo"):
            raise ValueError(f"scenario must be 'agent' or 'echo', got {self.scenario!r}")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        least = 2 * self.block_size if self.flavor == "vllm" else self.block_size
        if self.kv_tokens is not None and self.kv_tokens < least:
            raise ValueError(
                f"kv_tokens must be >= {least} (a usable block besides the null block), "
                f"got {self.kv_tokens}"
            )
        if self.kv_offloading_size is not None and self.kv_offload_tokens is not None:
            raise ValueError("set kv_offloading_size or kv_offload_tokens, not both")
        if self.flavor == "sglang" and self.offload_tokens is not None:
            raise ValueError("the offload tier is vLLM's (flavor='vllm')")
        if self.offload_tokens is not None and self.offload_tokens < self.block_size:
            raise ValueError(
                f"the offload tier must hold a block of {self.block_size} tokens, got "
                f"{self.offload_tokens} (kv_offloading_size={self.kv_offloading_size}, "
                f"kv_offload_tokens={self.kv_offload_tokens})"
            )
        for name in ("max_num_seqs", "max_batched_tokens", "max_model_len", "turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.output_tokens < 0:
            raise ValueError(f"output_tokens must be >= 0, got {self.output_tokens}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}"
            )
        if not self.batch_delay_s >= 0:
            raise ValueError(f"batch_delay_s must be >= 0, got {self.batch_delay_s}")
        if not 0.0 <= self.fault_rate <= 1.0:
            raise ValueError(f"fault_rate must be in [0, 1], got {self.fault_rate}")
        for name in ("rate_limit_rpm", "rate_limit_tpm", "rate_limit_itpm", "rate_limit_otpm"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if self.hosted not in (None, "anthropic", "openai"):
            raise ValueError(f"hosted must be 'anthropic', 'openai' or None, got {self.hosted!r}")
        bad = [f for f in self.faults if f not in FAULTS]
        if bad:
            raise ValueError(f"unknown faults {bad}; choose from {', '.join(FAULTS)}")

    @property
    def offload_tokens(self) -> int | None:
        """The second tier's capacity in tokens (None: no tier).

        From `kv_offloading_size` as `CPUOffloadingSpec` sizes it: the bytes
        (GiB x 2**30) over one block's bytes, in whole blocks.
        """
        if self.kv_offload_tokens is not None:
            return self.kv_offload_tokens
        if self.kv_offloading_size is None:
            return None
        block_bytes = self.block_size * get_profile(self.profile).kv_bytes_per_token
        return int(self.kv_offloading_size * GIB) // block_bytes * self.block_size

    def with_overrides(self, **overrides: Any) -> EmulatorConfig:
        """A copy with some options changed (unknown names raise TypeError)."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"unknown EmulatorConfig options: {unknown}")
        return replace(self, **overrides)

    def to_argv(self) -> list[str]:
        """Command-line arguments of `langgraph-batch emulate` for this config."""
        argv = [
            f"--host={self.host}",
            f"--port={self.port}",
            f"--profile={self.profile}",
            f"--flavor={self.flavor}",
            f"--scenario={self.scenario}",
            f"--time-scale={self.time_scale!r}",
            f"--block-size={self.block_size}",
            f"--max-num-seqs={self.max_num_seqs}",
            f"--max-batched-tokens={self.max_batched_tokens}",
            f"--scheduling-policy={self.scheduling_policy}",
            f"--model={self.model}",
            f"--max-model-len={self.max_model_len}",
            f"--seed={self.seed}",
            f"--output-tokens={self.output_tokens}",
            f"--turns={self.turns}",
            f"--fault-rate={self.fault_rate!r}",
            f"--faults={','.join(self.faults)}",
            f"--slow-first-token-s={self.slow_first_token_s!r}",
            f"--retry-after-s={self.retry_after_s!r}",
            f"--batch-delay-s={self.batch_delay_s!r}",
            f"--log-level={self.log_level}",
        ]
        if self.kv_tokens is not None:
            argv.append(f"--kv-tokens={self.kv_tokens}")
        if self.kv_offloading_size is not None:
            argv.append(f"--kv-offloading-size={self.kv_offloading_size!r}")
        if self.kv_offload_tokens is not None:
            argv.append(f"--kv-offload-tokens={self.kv_offload_tokens}")
        argv.extend(
            f"--{name.replace('_', '-')}={getattr(self, name)}"
            for name in ("rate_limit_rpm", "rate_limit_tpm", "rate_limit_itpm", "rate_limit_otpm")
            if getattr(self, name) is not None
        )
        if self.agentic_context:
            argv.append("--agentic-context")
        if self.hosted is not None:
            argv.append(f"--hosted={self.hosted}")
        if self.repeat_tool_args:
            argv.append("--repeat-tool-args")
        if not self.enable_prefix_caching:
            argv.append("--no-enable-prefix-caching")
        if not self.enable_auto_tool_choice:
            argv.append("--no-enable-auto-tool-choice")
        if not self.prompt_tokens_details:
            argv.append("--no-prompt-tokens-details")
        return argv
