"""Prefix-cache rules, held against vLLM 0.32 (CPU) and the emulator alike.

Each test sends one stream (`benchmarks.engine_rules.run_stream`) to the real
engine and to the emulator configured like it (`conftest.RULES_ENGINE`: 8192
KV tokens = 256 blocks of 32, one of them vLLM's null block, so 255 usable;
512 batched tokens; 16 sequences) and asserts the values derived by hand from
vLLM's code in its docstring (paths under `vllm/v1/core/`). The same numbers
on both sides are the point: a rule the emulator gets wrong fails here.

Every test starts from an empty prefix cache (`POST /reset_prefix_cache`,
vLLM's dev-mode route, which the emulator serves too) and its prompts are
fresh random token ids, so nothing is shared by accident.
"""

from __future__ import annotations

import httpx
import pytest

from benchmarks.engine_rules import Call, Tokens, run_stream
from tests.engine.conftest import RULES_ENGINE, Target

pytestmark = pytest.mark.anyio

BS = RULES_ENGINE["block_size"]


async def _reset_cache(target: Target) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        resp = await client.post(f"{target.url}/reset_prefix_cache")
    assert resp.json() == {"success": True}, resp.text


async def test_shared_prefix_hits_full_blocks_only_never_the_last_token(target: Target) -> None:
    """A later request gets exactly the full blocks it shares, never its last token.

    A is 3 full blocks + 20 tokens (116). Its step caches the 116 // 32 = 3
    full blocks (`KVCacheManager.allocate_slots` -> `cache_blocks`); the
    partial 4th block gets no hash. Then, one at a time:

    - A again: `get_computed_blocks` looks up at most 116 - 1 tokens:
      3 blocks, 96 cached.
    - B = A + 40 new tokens: it shares A's 116 tokens, but only 3 blocks are
      full: 96 (the 20 shared tokens of the partial block are recomputed).
    - C = A's first 96 tokens: 3 full blocks are cached, but at most 95
      tokens may hit (`max_cache_hit_length = num_tokens - 1`): 2 blocks, 64.
    - D = A's first 97 tokens: 96.
    - E = A with its first token changed: block hashes chain from the first
      block (`kv_cache_utils.hash_block_tokens`), so nothing hits: 0.

    The counters (`record_prefix_cache_stats`) add every prompt token as a
    query and every cached token as a hit.
    """
    await _reset_cache(target)
    t = Tokens(f"prefix-{target.name}")
    a = t.take(3 * BS + 20)
    other = (a[0] % 4000) + 1
    calls = [
        Call("A", a),
        Call("A_again", a),
        Call("B", a + t.take(40)),
        Call("C", a[: 3 * BS]),
        Call("D", a[: 3 * BS + 1]),
        Call("E", (other, *a[1:])),
    ]
    result = await run_stream(target.url, target.model, [[c] for c in calls])
    cached = {name: o.cached_tokens for name, o in result.outcomes.items()}
    assert cached == {"A": 0, "A_again": 96, "B": 96, "C": 64, "D": 96, "E": 0}
    assert all(o.completion_tokens == 1 for o in result.outcomes.values())
    assert result.counters["prefix_cache_queries"] == sum(len(c.prompt) for c in calls)
    assert result.counters["prefix_cache_hits"] == 96 + 96 + 64 + 96
    assert result.counters["prompt_tokens_cached"] == 96 + 96 + 64 + 96


async def test_lru_eviction_tail_first_within_a_request_lru_across(target: Target) -> None:
    """Which finished prefixes survive a request that needs their blocks.

    255 usable blocks (256, less the null block `BlockPool.__init__` sets
    aside). A, B, C each have 80 full blocks + 16 tokens (81 blocks), one
    after the other. Each finishes and `SingleTypeKVCacheManager.free` hands
    `BlockPool.free_blocks` its blocks tail first: the unhashed partial block
    goes to the front of the free queue (`prepend_n`), the 80 hashed ones to
    the back (`append_n`), the last block first. The next request takes the
    front: the previous one's partial block, then never-used blocks, so A, B
    and C use 81 + 80 + 80 = 241 blocks. After C the queue is: C's partial
    block, the 255 - 241 = 14 never-used blocks, then A's blocks 79..0, B's
    79..0, C's 79..0.

    D (39 full blocks + 16 tokens, 40 blocks) takes C's partial block, the
    14 unused ones and 25 of A's: A's blocks 79..55 lose their hash
    (`BlockPool._maybe_evict_cached_block`). A keeps blocks 0..54: LRU
    across requests (A was freed first), tail first within one (a request
    keeps the head of its prompt longest).

    Probes, one at a time, each re-sending a prompt unchanged: C and B hit
    their 80 blocks (2560 tokens; each takes only D's freed partial block
    and gives it back), D its 39 (1248), A its surviving 55 (1760). Had the
    null block not been set aside, A would keep 56 blocks (1792).
    """
    await _reset_cache(target)
    t = Tokens(f"lru-{target.name}")
    a, b, c = (t.take(80 * BS + 16) for _ in range(3))
    d = t.take(39 * BS + 16)
    order = [("A", a), ("B", b), ("C", c), ("D", d), ("C2", c), ("B2", b), ("D2", d), ("A2", a)]
    result = await run_stream(target.url, target.model, [[Call(n, p)] for n, p in order])
    cached = {name: o.cached_tokens for name, o in result.outcomes.items()}
    assert cached == {
        "A": 0,
        "B": 0,
        "C": 0,
        "D": 0,
        "C2": 80 * BS,
        "B2": 80 * BS,
        "D2": 39 * BS,
        "A2": 55 * BS,
    }
    assert result.counters["preemptions"] == 0


async def test_chunked_prefill_blocks_are_shared_when_scheduled(target: Target) -> None:
    """A prompt longer than the step budget is prefilled in chunks; a sharer sees each chunk.

    P has 1500 tokens, Q shares P's first 1472 (46 full blocks) and adds 128.
    Both queue while the server is paused (`hold`), so the first step sees
    both. Budget 512 tokens a step (`max_num_batched_tokens`):

    - step 1: P (running first, fcfs) gets 512 tokens; Q gets no budget.
    - step 2: P gets 512 more.
    - step 3: P gets its last 476; 36 tokens of budget are left, so Q is
      admitted. P's chunk was cached when it was *scheduled*
      (`allocate_slots` -> `cache_blocks` covers the tokens scheduled in
      this step, 1500 // 32 = 46 blocks), before Q's lookup in the same
      step: Q hits all 46 blocks, 1472 tokens, and computes 36 of its 128.
      (Were blocks cached only after their step ran, as SGLang does, Q would
      see 1024.)
    - step 4: Q computes its last 92 tokens and answers; P answered at step 3.
    """
    await _reset_cache(target)
    t = Tokens(f"chunk-{target.name}")
    p = t.take(1500)
    q = p[:1472] + t.take(128)
    result = await run_stream(target.url, target.model, [[Call("P", p), Call("Q", q)]], hold=True)
    assert result.cached("P") == 0
    assert result.cached("Q") == 1472
    assert result.finish_order() == ["P", "Q"]
    assert result.counters["prefix_cache_queries"] == 1500 + 1600
    assert result.counters["prefix_cache_hits"] == 1472
