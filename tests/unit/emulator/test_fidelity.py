"""Fidelity of the engine model, in virtual time (no clock, no network).

Figures it must match:
- H100 + Llama-3-8B: vLLM 0.26.0 measured end to end (decode with long and
  short contexts, single and batched prefill, TTFT tables); see below. These
  replaced the published cross-checks used before (TPOT 6.5 ms at
  concurrency 1 and 10.9 ms at 16, closed loop, 1024-token prompts): the
  measured engine decodes B=16 with 1k contexts at 6.9 ms per step.
- A10G + Qwen2.5-7B (BatchAgent's prefix-cache table, vLLM 0.6.6): N
  simultaneous requests with a 2547-token prompt sharing a 2048-token system
  prompt. TTFT P50 without prefix caching grows ~linearly with N; with it, it
  stays nearly flat.
"""

from __future__ import annotations

import random
import statistics

import pytest

from langgraph_batch.emulator.costs import get_profile
from langgraph_batch.emulator.engine import Engine, Request, simulate


def _ids(n: int, tag: object) -> list[int]:
    rng = random.Random(str(tag))
    return [rng.randrange(256, 128_000) for _ in range(n)]


# --- H100 + Llama-3-8B: vLLM 0.26.0 measured end to end ---------------------------
#
# benchmarks/results/calibration/h100_vllm026_llama3_8b_measured.md (and the JSON in
# vllm026_h100/ there): one H100 80GB, bf16 Llama-3-8B shape with random weights,
# output lengths forced, measured through HTTP by a Python client on the same
# machine. Each figure below is that file's; where it gives two runs, their
# mean. The engine runs in virtual time; what the measurement adds on top of
# engine time is the server's request path, modelled by `_request_path`.

_KV_TOKENS = 463_312
_H100 = get_profile("h100-llama3-8b")


def _request_path(prompt_lens: list[int]) -> list[float]:
    """When each of several requests sent at t=0 reaches the engine.

    vLLM's API server renders each request's chat template in turn (~1 ms)
    and tokenizes whatever requests are pending in one batch (~20 ms plus
    ~1 us per token) before handing them to the engine. Fitted once, with
    the cost model, to the TTFT tables and the single-prompt prefill: a lone
    4,000-token prompt waits ~25 ms, a burst reaches the engine in a few
    batches. The engine's own timings are unaffected.
    """
    render_s, batch_s, per_token_s = 1e-3, 20e-3, 1e-6
    enter = [(i + 1) * render_s for i in range(len(prompt_lens))]
    out = [0.0] * len(prompt_lens)
    t, i = 0.0, 0
    while i < len(prompt_lens):
        t = max(t, enter[i])
        j = i
        while j < len(prompt_lens) and enter[j] <= t:
            j += 1
        t += batch_s + per_token_s * sum(prompt_lens[i:j])
        for k in range(i, j):
            out[k] = t
        i = j
    return out


def _send(engine: Engine, reqs: list[Request], start: float = 0.0) -> None:
    """Send `reqs` together at `start` through the request path; run to the end."""
    arrivals = _request_path([r.prompt_len for r in reqs])
    simulate(engine, [(start + t, r) for t, r in zip(arrivals, reqs, strict=True)])


def _ms_per_token(reqs: list[Request]) -> float:
    """Mean over requests of (last token - first token) / (tokens - 1), in ms."""
    return 1e3 * statistics.mean(
        (r.finish_time - r.first_token_time) / (r.num_output - 1)  # type: ignore[operator]
        for r in reqs
    )


def _long_context_decode_ms(context: int, batch: int, out: int = 200) -> float:
    """B requests on one cached prefix of `context` tokens (+4 unique), `out` tokens each."""
    engine = Engine(profile=_H100, kv_tokens=_KV_TOKENS)
    prefix = _ids(context, ("prefix", context))
    warm = Request(request_id="warm", prompt_ids=[*prefix, *_ids(4, "w")], output_ids=[1])
    start = simulate(engine, [(0.0, warm)])
    reqs = [
        Request(request_id=str(i), prompt_ids=[*prefix, *_ids(4, i)], output_ids=[5] * out)
        for i in range(batch)
    ]
    _send(engine, reqs, start)
    assert all(r.cached_tokens == context // 16 * 16 for r in reqs)
    return _ms_per_token(reqs)


@pytest.mark.parametrize(
    ("context", "batch", "measured_ms"),
    [
        (64, 16, 6.7),  # runs: 6.7, 6.7
        (1000, 16, 6.9),  # 7.0, 6.8
        (3000, 16, 8.5),  # 7.5, 9.5
        (64, 96, 13.35),  # 12.6, 14.1
        (1000, 96, 29.95),  # 25.7, 34.2
        (3000, 96, 46.3),  # 45.8, 46.8
    ],
)
def test_h100_long_context_decode_within_15_percent(
    context: int, batch: int, measured_ms: float
) -> None:
    assert _long_context_decode_ms(context, batch) == pytest.approx(measured_ms, rel=0.15)


def test_h100_long_context_decode_throughput_stops_growing_past_16() -> None:
    # The measured engine: ~3k-token contexts give 1.5-1.9k tokens/s at B=16
    # and 1.9k at B=96; a bandwidth-bound model would give ~3x more at 96.
    tok_s = {b: b / (_long_context_decode_ms(3000, b) / 1e3) for b in (16, 32, 96)}
    assert 1500 <= tok_s[16] <= 2300
    assert tok_s[96] <= 1.25 * tok_s[16]
    assert tok_s[32] <= 1.5 * tok_s[16]


@pytest.mark.parametrize(
    ("batch", "measured_ms"), [(1, 6.59), (16, 6.78), (64, 7.77), (256, 21.77)]
)
def test_h100_short_prompt_decode_within_10_percent(batch: int, measured_ms: float) -> None:
    engine = Engine(profile=_H100, kv_tokens=_KV_TOKENS)
    reqs = [
        Request(request_id=str(i), prompt_ids=_ids(40, ("s", i)), output_ids=[5] * 200)
        for i in range(batch)
    ]
    _send(engine, reqs)
    assert _ms_per_token(reqs) == pytest.approx(measured_ms, rel=0.10)


def test_h100_single_prompt_prefill_within_10_percent() -> None:
    # The fidelity script's figure (median of 3, three runs): 32.9k-34.6k tokens/s
    # as prompt tokens / TTFT. (The calibration script's 23.2k for the same
    # case carries that script's own overhead: on the emulator it read 34.3k
    # where the fidelity script read 39.1k.)
    engine = Engine(profile=_H100, kv_tokens=_KV_TOKENS)
    req = Request(request_id="p", prompt_ids=_ids(4000, "p"), output_ids=[1])
    _send(engine, [req])
    tok_s = 4000 / req.first_token_time  # type: ignore[operator]
    assert tok_s == pytest.approx((32_900 + 34_600) / 2, rel=0.10)
    for measured in (32_900, 34_600):
        assert tok_s == pytest.approx(measured, rel=0.10)


def test_h100_batched_prefill_16x2000_within_10_percent() -> None:
    # 16 concurrent 2,000-token prompts, tokens / last TTFT, by the calibration
    # script: 35.5k tokens/s on vLLM, 34.9k on the emulator of the time, whose
    # engine did the same in 0.745 s of virtual time (42,976 tokens/s; the
    # rest was the script and the emulator's HTTP path). The script's overhead
    # cancels in the ratio, so the engine-time figure vLLM implies is
    # 42,976 x 35.5 / 34.9 tokens/s.
    engine = Engine(profile=_H100, kv_tokens=_KV_TOKENS)
    reqs = [
        Request(request_id=str(i), prompt_ids=_ids(2000, ("b", i)), output_ids=[1])
        for i in range(16)
    ]
    simulate(engine, [(0.0, r) for r in reqs])
    tok_s = 16 * 2000 / max(r.first_token_time for r in reqs)  # type: ignore[type-var]
    assert tok_s == pytest.approx(42_976 * 35_541.5 / 34_905.2, rel=0.10)


_TTFT_P50_S = {  # N -> (shared 2,048-token system prompt, unique one), + ~500 unique tokens
    5: (0.139, 0.282),
    10: (0.190, 0.468),
    20: (0.294, 0.751),
    50: (0.479, 1.661),
    100: (0.818, 3.165),
}


@pytest.mark.parametrize("n", sorted(_TTFT_P50_S))
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "unique"])
def test_h100_ttft_tables_within_10_percent(n: int, shared: bool) -> None:
    engine = Engine(profile=_H100, kv_tokens=_KV_TOKENS)
    reqs = [
        Request(
            request_id=str(i),
            prompt_ids=[*_ids(2048, "system" if shared else ("system", i)), *_ids(500, i)],
            output_ids=[7] * 16,
        )
        for i in range(n)
    ]
    _send(engine, reqs)
    p50 = statistics.median(r.first_token_time for r in reqs)  # type: ignore[type-var]
    assert p50 == pytest.approx(_TTFT_P50_S[n][0 if shared else 1], rel=0.10)
    expected_prefill = 2048 + 500 * n if shared else 2548 * n
    assert engine.counters.prefill_tokens_computed == expected_prefill


# BatchAgent's table (two published runs), N -> (TTFT P50 no cache, TTFT P50 cache).
_PUBLISHED = {
    5: ((1.192, 1.110), (0.184, 0.153)),
    10: ((2.771, 2.730), (0.220, 0.147)),
    20: ((5.453, 5.436), (0.216, 0.149)),
    50: ((13.550, 13.551), (0.533, 0.308)),
    100: ((28.687, 28.907), (0.451, 0.469)),
}


def _a10g_p50(n: int, *, cache: bool) -> float:
    """TTFT P50 of N simultaneous 2547-token requests on the A10G profile.

    With caching on, the prefix is warmed by one request first (BatchAgent
    warms it before releasing the siblings) and each request computes only
    its last 19 tokens. The published figures imply that: a cache hit rate of
    96-99% at N=100, a cache-on wall time of 6.5 s for 100 requests, and
    ~4 ms of TTFT per added request rule out ~500 freshly computed tokens
    each (100 x 500 tokens alone take > 10 s on an A10G).
    """
    engine = Engine(profile=get_profile("a10g-qwen2.5-7b"), enable_prefix_caching=cache)
    shared = _ids(2528, "system+task-template")
    start = 0.0
    if cache:
        warm = Request(request_id="warm", prompt_ids=[*shared, *_ids(19, "w")], output_ids=[5])
        start = simulate(engine, [(0.0, warm)])
    reqs = [
        Request(request_id=str(i), prompt_ids=[*shared, *_ids(19, i)], output_ids=[7] * 64)
        for i in range(n)
    ]
    simulate(engine, [(start, r) for r in reqs])
    return statistics.median(r.ttft for r in reqs)  # type: ignore[type-var]


@pytest.mark.parametrize("n", [10, 20, 50, 100])
def test_a10g_ttft_without_prefix_cache_grows_linearly(n: int) -> None:
    published = statistics.mean(_PUBLISHED[n][0])
    p50 = _a10g_p50(n, cache=False)
    assert p50 == pytest.approx(published, rel=0.25)
    # ~0.6 s per queued 2547-token prompt ahead of the median request.
    assert p50 / (n / 2) == pytest.approx(0.6, rel=0.25)


def test_a10g_ttft_with_prefix_cache_stays_flat() -> None:
    p50 = {n: _a10g_p50(n, cache=True) for n in _PUBLISHED}
    assert p50[100] == pytest.approx(statistics.mean(_PUBLISHED[100][1]), rel=0.25)
    assert all(v < 0.6 for v in p50.values())
    assert p50[100] < 0.02 * _a10g_p50(100, cache=False)
