"""Scheduling rules, held against vLLM 0.32 (CPU) and the emulator alike.

As in `test_rules_cache.py`: one stream to each side (`conftest.RULES_ENGINE`:
255 usable blocks of 32 tokens, 512 batched tokens, 16 sequences, fcfs,
`max_model_len` 8160), hand-derived expectations (paths under `vllm/v1/`).

Concurrent requests are queued while the server is paused (`hold=True`:
vLLM's `POST /pause?mode=keep`, served by the emulator too) and resumed when
all of them wait, so the first step sees them all. Without that barrier a
2-core host shared with other servers decides how many arrive before the
first step (measured: 0 preemptions in one run, 2 in the next, for the same
stream), and the test would check the host, not the engine.
"""

from __future__ import annotations

import httpx
import pytest

from benchmarks.engine_rules import Call, Tokens, run_stream
from tests.engine.conftest import RULES_ENGINE, Target

pytestmark = pytest.mark.anyio

BS = RULES_ENGINE["block_size"]
MML = RULES_ENGINE["max_model_len"]


async def _reset_cache(target: Target) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        resp = await client.post(f"{target.url}/reset_prefix_cache")
    assert resp.json() == {"success": True}, resp.text


async def test_preemption_by_recompute_under_a_full_cache(target: Target) -> None:
    """Eight decoding requests outgrow the KV cache: the last admitted are preempted.

    R0..R7: 32-token prompts (1 block), 1248 tokens each to generate; all
    eight are admitted in step 1 (8 x 32 tokens fit the budget). They decode
    in lockstep, one token a step; request i holds cdiv(computed, 32)
    blocks. When each needs its 32nd block, 7 x 32 + 31 = 255 blocks are
    held: R0..R6 get theirs and R7 finds none, so `Scheduler.schedule`
    preempts `running[-1]`, R7 itself (preemption 1; `_preempt_request`
    frees its 31 blocks). 31 blocks carry R0..R6 through 4 more blocks each
    (28) and 3 of them through a 5th: then R3 needs a block, none is free,
    and `running[-1]` = R6 is preempted (preemption 2). R0..R5 need 40
    blocks each at the end (32 + 1247 tokens computed): 240 of 255, so no
    more. R6 and R7 wait (`full_sequence_must_fit`: each needs its known
    tokens, 1000+, and only 15 blocks are free) until R0..R5 finish
    together, then recompute and finish last.

    Observable through the API: the preemption counter
    (`vllm:num_preemptions_total`) and the answer order: R6 and R7 answer
    after the other six (R6 has ~130 steps left after R0..R5 finish, R7
    ~290). vLLM names no victim anywhere (no log line, no per-request
    field), so the order, read by the client with nothing else on its event
    loop (`sample_s=None`), is the evidence on its side; the emulator's
    `/emulator/requests` also names the victims. Prefix-cache queries count
    first admissions only (`PrefixCacheStats.record` puts re-admissions in
    `preempted_*`, which no counter exports): 8 x 32.
    """
    await _reset_cache(target)
    t = Tokens(f"preempt-{target.name}")
    calls = [Call(f"R{i}", t.take(BS), 1248) for i in range(8)]
    result = await run_stream(target.url, target.model, [calls], hold=True, sample_s=None)
    assert all(o.completion_tokens == 1248 for o in result.outcomes.values())
    assert result.counters["preemptions"] == 2
    last_two = set(result.finish_order()[-2:])
    if target.name == "emulator":
        assert last_two == {"R6", "R7"}
    else:
        # On 2 loaded cores (CI, after the rest of the suite) the engine has
        # admitted the held phase out of its written order: one victim was then
        # R0, not R6 (seen three times; the preemption count held). R7, sent
        # last, stays among the victims.
        assert "R7" in last_two
    assert result.counters["prefix_cache_queries"] == 8 * BS
    if target.name == "emulator":
        async with httpx.AsyncClient(timeout=60) as client:
            rows = (await client.get(f"{target.url}/emulator/requests")).json()["requests"]
        ids = {o.request_id + "-0": o.name for o in result.outcomes.values()}
        preempted = {ids[row[0]]: row[5] for row in rows if row[0] in ids and row[5]}
        assert preempted == {"R6": 1, "R7": 1}


async def test_burst_over_max_num_seqs_waits(target: Target) -> None:
    """A burst of 40 requests with `max_num_seqs` 16: 24 wait while the first 16 run.

    40 requests of 20 prompt tokens and 256 generated, queued while paused.
    Step 1 admits 16 (`max_num_active_reqs`; 16 x 20 tokens fit the 512
    budget), the other 24 wait (`vllm:num_requests_waiting`) for 256 steps,
    until the 16 finish together; then 16 more run and 8 wait. Peak waiting
    while anything runs: 24; peak running: 16. The gauges are sampled every
    50 ms; 256 steps of 16 sequences last seconds on both servers, so a
    sample falls in the first wave even when the host stalls the client for
    most of a second (64 steps did not: one run sampled only the second wave).
    """
    t = Tokens(f"burst-{target.name}")
    calls = [Call(f"R{i}", t.take(20), 256) for i in range(40)]
    result = await run_stream(target.url, target.model, [calls], hold=True)
    assert all(o.completion_tokens == 256 for o in result.outcomes.values())
    assert result.peak_waiting_while_running() == 24
    assert result.peak_running == 16
    assert result.counters["preemptions"] == 0


async def test_requests_beyond_max_model_len(target: Target) -> None:
    """What a request that cannot fit gets (vLLM 0.32's front end).

    No prompt can outgrow the KV cache itself: vLLM refuses to start when
    `max_model_len` exceeds what its usable blocks hold
    (`core/kv_cache_utils._check_enough_kv_cache_memory`; 8192 KV tokens serve
    at most 8160), so the limit a request meets is `max_model_len` (8160):

    - 8161 prompt tokens: 400, `param` `input_tokens`, "at least 8161"
      (`renderers/params.py`, `_token_len_check`: one over the limit may be a
      tokenizer's cut).
    - 8200: 400, "8200" without "at least".
    - 8160 (the limit itself): `max_tokens` is cut to 8160 - 8160 = 0
      (`entrypoints/serve/utils/api_utils.get_max_tokens`), then refused:
      400 "max_tokens must be at least 1, got 0", `param` `max_tokens`.
    - 8100 with `max_tokens` 100: cut to 60, answered with 60 tokens and
      `finish_reason` `length`, not refused.
    """
    t = Tokens(f"limits-{target.name}")
    calls = [
        Call("one_over", t.take(MML + 1)),
        Call("far_over", t.take(8200)),
        Call("at_limit", t.take(MML)),
        Call("cut", t.take(8100), 100),
    ]
    result = await run_stream(target.url, target.model, [[c] for c in calls])
    out = result.outcomes
    for name, n, least in (("one_over", MML + 1, "at least "), ("far_over", 8200, "")):
        assert (out[name].status, out[name].error_param) == (400, "input_tokens")
        assert out[name].error == (
            f"This model's maximum context length is {MML} tokens. However, your prompt "
            f"contains {least}{n} input tokens, which exceeds this limit even without any "
            f"output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={n})"
        )
    assert (out["at_limit"].status, out["at_limit"].error_param) == (400, "max_tokens")
    assert out["at_limit"].error == (
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
    )
    cut = out["cut"]
    assert (cut.status, cut.completion_tokens, cut.finish_reason) == (200, 60, "length")
