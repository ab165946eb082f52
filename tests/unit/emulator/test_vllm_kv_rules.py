"""vLLM 0.33.0's KV and scheduling rules, one test each, on tiny engines.

Every expected outcome is derived by hand from vLLM's code, in the test's
docstring, naming the file and function (paths under `vllm/v1/core/`, and
`vllm/config/scheduler.py`). Blocks hold 16 tokens; `Bn` is block id n. The
free queue starts as B1, B2, ... in order: block 0 is the null block, set
aside as vLLM's `BlockPool.__init__` does, so `_engine(n)` has n + 1 blocks
of which n are usable (the docstrings below name the usable ones B0..B(n-1)
by their order in the free queue).

Each engine runs one step at a time through `Engine.schedule`/`commit` on the
`zero` profile (every step takes no time), so the state between steps can be
read.
"""

from __future__ import annotations

from langgraph_batch.emulator.costs import get_profile
from langgraph_batch.emulator.engine import Engine, Request, RequestStatus

ZERO = get_profile("zero")


def _engine(blocks: int, budget: int = 256, **kw: object) -> Engine:
    """An engine with `blocks` usable blocks of 16 tokens (and the null block)."""
    return Engine(profile=ZERO, kv_tokens=16 * (blocks + 1), max_batched_tokens=budget, **kw)  # type: ignore[arg-type]


def _ids(n: int, start: int) -> list[int]:
    return list(range(start, start + n))


def _req(rid: str, prompt: list[int], out: int = 1, *, priority: int = 0) -> Request:
    return Request(
        request_id=rid, prompt_ids=prompt, output_ids=_ids(out, 90_000), priority=priority
    )


def _step(engine: Engine, now: float = 0.0) -> list[tuple[str, int]]:
    """Run one step; (request id, tokens scheduled) in the order the step holds them."""
    step = engine.schedule(now)
    if step is None:
        return []
    engine.commit(step, now + step.duration)
    return [(r.request_id, n) for r, n in step.items]


def _cached_blocks(engine: Engine, tokens: list[int]) -> int:
    """How many leading blocks of `tokens` a new request would find in the cache."""
    probe = Request(request_id="probe", prompt_ids=[*tokens, 1], output_ids=[1])
    return len(engine.kv.find_cached(probe))


def _running(engine: Engine) -> list[str]:
    return [r.request_id for r in engine.running]


# --- what stays cached, and in which order it is evicted -----------------------------


def test_finished_request_blocks_stay_cached_and_are_hit_later() -> None:
    """A finished request's full blocks stay cached; a later request hits them.

    A (40-token prompt, 1 output token): `Scheduler.schedule` gives it 40
    tokens in step 1; `KVCacheManager.allocate_slots` allocates
    cdiv(40, 16) = 3 blocks and `cache_blocks` caches the 40 // 16 = 2 full
    ones. A samples its one token and finishes: `Scheduler._free_request` ->
    `KVCacheManager.free` -> `BlockPool.free_blocks` keeps the hashes, so 2
    blocks stay cached and all 8 are free. B (A's 40 tokens + 8) looks up at
    most 48 - 1 tokens (`KVCacheManager.get_computed_blocks`): 2 full blocks,
    32 tokens, both A's. `record_prefix_cache_stats` counts 40 + 48 queried
    tokens, 0 + 32 hits.
    """
    engine = _engine(8)
    prompt = _ids(40, 100)
    engine.add_request(_req("A", prompt))
    assert _step(engine) == [("A", 40)]
    assert engine.kv.num_free == 8
    assert engine.kv.num_cached_blocks == 2
    b = _req("B", [*prompt, *_ids(8, 500)])
    engine.add_request(b)
    assert _step(engine) == [("B", 16)]
    assert b.cached_tokens == 32
    c = engine.counters
    assert (c.prefix_cache_queries, c.prefix_cache_hits, c.cached_tokens) == (88, 32, 32)


def test_aborted_request_blocks_stay_cached() -> None:
    """An aborted request's full blocks stay cached too.

    A (40-token prompt, 10 output tokens) runs one step: 3 blocks, 2 cached.
    `Scheduler.finish_requests(FINISHED_ABORTED)` -> `_free_request` ->
    `KVCacheManager.free`: the same path as a finish, so the 2 full blocks
    keep their hashes and a request with A's prefix hits 2 blocks.
    """
    engine = _engine(8)
    prompt = _ids(40, 100)
    a = _req("A", prompt, out=10)
    engine.add_request(a)
    _step(engine)
    engine.abort(a)
    assert engine.kv.num_free == 8
    assert _cached_blocks(engine, prompt) == 2


def test_lru_first_freed_request_is_evicted_first_and_tail_before_head() -> None:
    """LRU over finished requests; within a request the tail goes first.

    8 blocks. A (32 tokens) takes B0 B1 and caches both; it finishes and
    `SingleTypeKVCacheManager.free` hands `BlockPool.free_blocks` its blocks
    in reverse, so B1 then B0 are appended to the free queue: B2..B7 B1 B0.
    B (32 other tokens) takes B2 B3 and is freed the same way: B4..B7 B1 B0
    B3 B2. C (80 tokens) needs 5 blocks; `BlockPool.get_new_blocks` pops the
    front: B4 B5 B6 B7 B1, evicting B1, A's tail
    (`_maybe_evict_cached_block`). A's prefix now hits 1 block, B's 2. C
    finishes (5 full blocks, appended B1 B7 B6 B5 B4): B0 B3 B2 B1 B7 B6 B5
    B4. D (32 tokens) takes B0 B3: A's head, then B's tail. A hits 0 blocks,
    B 1, C all 5. Three evictions in all.
    """
    engine = _engine(8)
    a, b, c = _ids(32, 100), _ids(32, 200), _ids(80, 300)
    for rid, prompt in (("A", a), ("B", b), ("C", c)):
        engine.add_request(_req(rid, prompt))
        _step(engine)
        if rid == "C":
            assert (_cached_blocks(engine, a), _cached_blocks(engine, b)) == (1, 2)
    engine.add_request(_req("D", _ids(32, 400)))
    _step(engine)
    assert [_cached_blocks(engine, p) for p in (a, b, c)] == [0, 1, 5]
    assert engine.kv.evictions == 3


def test_blocks_without_a_hash_are_reused_before_cached_ones() -> None:
    """Freed blocks without a hash go to the front of the free queue.

    8 blocks. A (40 tokens) holds B0 B1 B2; B2 is not full (tokens 32-39),
    so it has no hash. `BlockPool.free_blocks` prepends blocks without a hash
    ("LIFO reuse of non-cached blocks") and appends cached ones: B2 B3..B7
    B1 B0. B (96 tokens) needs 6 blocks and takes B2..B7: nothing evicted, A's
    2 cached blocks survive.
    """
    engine = _engine(8)
    a = _ids(40, 100)
    engine.add_request(_req("A", a))
    _step(engine)
    engine.add_request(_req("B", _ids(96, 200)))
    assert _step(engine) == [("B", 96)]
    assert engine.kv.evictions == 0
    assert _cached_blocks(engine, a) == 2


def test_duplicate_blocks_are_cached_and_keep_the_prefix_findable() -> None:
    """A block equal to a cached one is cached as well.

    6 blocks. A (64 tokens) caches B0..B3 and finishes: B4 B5 B3 B2 B1 B0.
    B has the same 64 tokens: it may hit at most 63 tokens, so 3 blocks
    (B0 B1 B2, touched out of the queue by `BlockPool.touch`), and recomputes
    tokens 48-63 in a new block, B4. `cache_full_blocks` caches B4 under the
    hash B3 already has (no de-duplication, `BlockHashToBlockMap` note #1):
    5 cached blocks. B finishes; its blocks go back tail first, all cached:
    B5 B3 B4 B2 B1 B0. X (32 tokens) takes B5 and B3, which evicts B3's entry
    (`_maybe_evict_cached_block` pops that block id only). B4 still carries
    the hash, so A's 64 tokens still hit 4 blocks (`get_one_block`).
    """
    engine = _engine(6)
    a = _ids(64, 100)
    engine.add_request(_req("A", a))
    _step(engine)
    b = _req("B", a)
    engine.add_request(b)
    assert _step(engine) == [("B", 16)]
    assert b.cached_tokens == 48
    assert engine.kv.num_cached_blocks == 5
    engine.add_request(_req("X", _ids(32, 300)))
    _step(engine)
    assert engine.kv.evictions == 1
    assert _cached_blocks(engine, a) == 4


def test_evicted_while_waiting_on_a_tool_recomputes_exactly_the_evicted_part() -> None:
    """A conversation's next turn recomputes what eviction took, and the new tokens.

    10 blocks. Turn 1 (64 prompt tokens, 16 output tokens) computes 64 + 15
    tokens (the last sampled token is never run): 5 blocks, B0..B3 cached by
    `cache_blocks`, B4 (tokens 64-78) not full. Freed: B4 B5..B9 B3 B2 B1 B0.
    Turn 2's prompt is turn 1's 80 tokens plus a 16-token tool result. With
    no other traffic it hits 4 blocks (64 tokens) and computes 32. Instead,
    while the tool runs, X (128 tokens) takes 8 blocks, B4..B9 B3 B2, and
    evicts turn 1's two tail blocks. Turn 2 then hits B0 B1 (32 tokens) and
    computes 64: the two evicted blocks (32 tokens) more.
    """

    def turn_two(busy: bool) -> tuple[int, int]:
        engine = _engine(10)
        one = _req("turn1", _ids(64, 100), out=16)
        engine.add_request(one)
        while not one.finished:
            _step(engine)
        if busy:
            engine.add_request(_req("X", _ids(128, 1000)))
            _step(engine)
        two = _req("turn2", [*one.all_ids[: one.num_known_tokens], *_ids(16, 500)])
        engine.add_request(two)
        before = engine.counters.prefill_tokens_computed
        _step(engine)
        assert two.cached_tokens is not None
        return two.cached_tokens, engine.counters.prefill_tokens_computed - before

    assert turn_two(busy=False) == (64, 32)
    assert turn_two(busy=True) == (32, 64)


def test_hits_in_the_free_queue_count_against_free_blocks() -> None:
    """Admitting a request takes its evictable hits out of the free blocks.

    6 blocks. A (64 tokens) caches B0..B3 and finishes: B4 B5 B3 B2 B1 B0. R
    (17 tokens, 3 output tokens) takes B4 B5, leaving 4 free, all A's. B (A's
    64 tokens + 16) hits those 4 blocks and needs 1 new one.
    `SingleTypeKVCacheManager.get_num_blocks_to_allocate` counts 1 new + 4
    evictable hits = 5 > 4 free, so `allocate_slots` returns None and B
    waits. When R finishes (B5, not full, to the front; B4 cached, to the
    back), 6 are free: B is admitted with 64 cached tokens and computes 16.
    """
    engine = _engine(6)
    a = _ids(64, 100)
    engine.add_request(_req("A", a))
    _step(engine)
    engine.add_request(_req("R", _ids(17, 200), out=3))
    _step(engine)
    b = _req("B", [*a, *_ids(16, 300)])
    engine.add_request(b)
    assert _step(engine) == [("R", 1)]
    assert _step(engine) == [("R", 1)]  # R finishes here
    assert _step(engine) == [("B", 16)]
    assert b.cached_tokens == 64


def test_admission_needs_room_for_the_whole_prompt() -> None:
    """A waiting request is admitted only if all its known tokens fit.

    8 blocks, budget 32. A (31 tokens) holds 2 blocks. B (100 tokens) would
    start with a 31-token chunk (2 blocks) but `allocate_slots` gets
    `full_sequence_must_fit=scheduler_reserve_full_isl` (True by default,
    `vllm/config/scheduler.py`) and needs cdiv(100, 16) = 7 blocks > 6 free:
    B is not admitted. With the option off, the chunk is admitted.
    """
    for reserve, expected in ((True, [("A", 1)]), (False, [("A", 1), ("B", 31)])):
        engine = _engine(8, budget=32, scheduler_reserve_full_isl=reserve)
        engine.add_request(_req("A", _ids(31, 100), out=5))
        _step(engine)
        engine.add_request(_req("B", _ids(100, 200)))
        assert _step(engine) == expected


# --- preemption ----------------------------------------------------------------------


def test_fcfs_preempts_the_last_running_request() -> None:
    """Out of blocks, fcfs preempts `running[-1]`.

    6 blocks. A, B, C (31 tokens each) are admitted in step 1 with 2 blocks
    each; nothing is free. Step 2: each decodes token 32, still inside 2
    blocks. Step 3: A's token 33 needs a third block; `Scheduler.schedule`
    calls `allocate_slots`, gets None and pops `self.running[-1]`, C
    (`_preempt_request`). C's 2 blocks come back, A takes one, B the other.
    C is waiting with `num_computed_tokens` 0 and is not admitted in this step.
    """
    engine = _engine(6)
    reqs = {rid: _req(rid, _ids(31, 100 * (i + 1)), out=10) for i, rid in enumerate("ABC")}
    for r in reqs.values():
        engine.add_request(r)
    assert _step(engine) == [("A", 31), ("B", 31), ("C", 31)]
    assert _step(engine) == [("A", 1), ("B", 1), ("C", 1)]
    assert _step(engine) == [("A", 1), ("B", 1)]
    c = reqs["C"]
    assert _running(engine) == ["A", "B"]
    assert (c.status, c.num_computed, c.num_preemptions) == (RequestStatus.WAITING, 0, 1)
    assert engine.counters.preemptions == 1


def _preempt_c_then_resume() -> tuple[Engine, Request, list[tuple[str, int]]]:
    """7 blocks; C is preempted in step 3 and resumed in step 4 (see the tests)."""
    engine = _engine(7)
    a, b = _req("A", _ids(31, 100), out=3), _req("B", _ids(31, 200), out=3)
    c = _req("C", _ids(47, 300), out=5)
    for r in (a, b, c):
        engine.add_request(r)
    assert _step(engine) == [("A", 31), ("B", 31), ("C", 47)]
    assert _step(engine) == [("A", 1), ("B", 1), ("C", 1)]
    assert _step(engine) == [("A", 1), ("B", 1)]
    assert c.status is RequestStatus.WAITING
    return engine, c, _step(engine)


def test_preempted_request_recomputes_after_its_own_cached_blocks() -> None:
    """A preempted request comes back with hits on its blocks still cached.

    7 blocks. Step 1: A, B (31 tokens) take 2 blocks each, C (47) takes 3
    (B4 B5 B6). Step 2: each decodes one token; C's `cache_blocks` now covers
    48 tokens, so all 3 of its blocks are cached. Step 3: A needs a third
    block; fcfs preempts C (`_preempt_request`: blocks freed, hashes kept,
    appended tail first: B6 B5 B4; `num_computed_tokens = 0`). A takes B6 and
    B takes B5, evicting C's two tail blocks; A and B sample their third and
    last token and finish. Step 4: C (49 known tokens: 47 + 2 generated) looks
    up at most 48 tokens and finds only B4, its head: 16 tokens. It computes
    the other 33, its 2 generated tokens included.
    """
    _, c, step4 = _preempt_c_then_resume()
    assert step4 == [("C", 33)]
    assert c.num_computed == 49
    assert c.num_output == 3


def test_prefix_cache_counters_skip_readmission_after_preemption() -> None:
    """Prefix-cache counters count a request when it is first admitted.

    In the scenario above, `KVCacheManager.record_prefix_cache_stats` runs
    at each admission; `PrefixCacheStats.record` puts C's second admission
    (`num_preemptions > 0`) into `preempted_queries`/`preempted_hits`, which
    `PrometheusStatLogger` does not export. So `vllm:prefix_cache_queries`
    is 31 + 31 + 47 = 109, `vllm:prefix_cache_hits` 0 (C's 16-token hit on
    readmission is not counted), and `vllm:num_preemptions` is 1.
    `cached_tokens` (`prompt_tokens_cached`) keeps C's first-admission 0.
    """
    engine, c, _ = _preempt_c_then_resume()
    counters = engine.counters
    assert (counters.prefix_cache_queries, counters.prefix_cache_hits) == (109, 0)
    assert (counters.preemptions, counters.cached_tokens, c.cached_tokens) == (1, 0, 0)


def test_priority_preempts_largest_priority_even_if_already_scheduled() -> None:
    """Under priority the victim is max (priority, arrival) over all of `running`.

    Budget 32, `long_prefill_token_threshold` 16, 6 blocks. Step 1: X
    (priority 5, 16 tokens) is alone, so the threshold is off ("nobody to
    starve"): 16 tokens, 1 block. Y and Z (priority 0, 48 tokens) arrive.
    Step 2: X decodes 1 token (a second block); Y gets 16 tokens (1 block),
    Z min(16, 15 left) = 15 (1 block); 2 blocks free. Step 3: X 1, Y 16
    (a block), Z 15 (a block); none free. Step 4: X is scheduled (1 token,
    budget 31 left); Y's next 16 tokens need a block and `allocate_slots`
    fails. `Scheduler.schedule` takes `max(self.running, key=(priority,
    arrival_time))` = X, which was scheduled in this step: X leaves the step,
    its 1 token goes back to the budget (`token_budget += restored`), and X
    frees 2 blocks. Y takes one and 16 tokens (budget 16 left), so Z gets
    min(18, 16, 16) = 16: one more token than without the give-back.
    """
    engine = _engine(6, budget=32, scheduling_policy="priority", long_prefill_token_threshold=16)
    x = _req("X", _ids(16, 100), out=20, priority=5)
    engine.add_request(x)
    assert _step(engine) == [("X", 16)]
    y = _req("Y", _ids(48, 200), out=5)
    z = _req("Z", _ids(48, 300), out=5)
    y.arrival, z.arrival = 1.0, 2.0
    engine.add_request(y)
    engine.add_request(z)
    assert _step(engine, 1.0) == [("X", 1), ("Y", 16), ("Z", 15)]
    assert _step(engine, 2.0) == [("X", 1), ("Y", 16), ("Z", 15)]
    assert _step(engine, 3.0) == [("Y", 16), ("Z", 16)]
    assert (x.status, x.num_computed, x.num_preemptions) == (RequestStatus.WAITING, 0, 1)
    assert _running(engine) == ["Y", "Z"]


def test_priority_request_that_preempts_itself_lets_the_next_ones_run() -> None:
    """Under priority, a request that is its own victim does not end the step.

    4 blocks. Step 1: A (priority 5, 31 tokens) is alone: 2 blocks. Step 2: A
    decodes; B (priority 0, 20 tokens) is admitted with the other 2 blocks.
    Step 3: A's token 33 needs a third block; the largest (priority, arrival)
    in `running` is A itself, so A is preempted. `Scheduler.schedule` then
    goes on (`continue`: "the requests after it have higher priority and may
    still fit") and B decodes. Under fcfs the loop would `break` instead,
    but there the victim is the last running request, so nobody is left.
    """
    engine = _engine(4, scheduling_policy="priority")
    a = _req("A", _ids(31, 100), out=10, priority=5)
    engine.add_request(a)
    assert _step(engine) == [("A", 31)]
    b = _req("B", _ids(20, 200), out=10)
    b.arrival = 1.0
    engine.add_request(b)
    assert _step(engine, 1.0) == [("A", 1), ("B", 20)]
    assert _step(engine, 2.0) == [("B", 1)]
    assert (a.status, a.num_preemptions) == (RequestStatus.WAITING, 1)


def test_no_waiting_request_is_admitted_in_a_step_that_preempted() -> None:
    """A step that preempted admits nobody (`if not preempted_reqs`).

    Priority policy, 5 blocks. Step 1: A (priority 0, 31 tokens) takes 2
    blocks, C (priority 1, 47 tokens) 3. Step 2: both decode within their
    blocks; C's 3 blocks are now cached. W (priority -1, 10 tokens) arrives.
    Step 3: A needs a third block; the victim is C (largest priority), whose
    3 blocks come back (B4 B3 B2); A takes B4. W would fit in the 2 free
    blocks and heads the waiting queue, but `Scheduler.schedule` skips the
    waiting requests when `preempted_reqs` is not empty. Step 4: W is admitted
    (B3); C (49 known tokens) then hits its head block B2 but needs 3 new
    blocks + 1 evictable hit = 4 with 1 free, so it waits.
    """
    engine = _engine(5, scheduling_policy="priority")
    engine.add_request(_req("A", _ids(31, 100), out=10))
    engine.add_request(_req("C", _ids(47, 200), out=10, priority=1))
    assert _step(engine) == [("A", 31), ("C", 47)]
    assert _step(engine) == [("A", 1), ("C", 1)]
    w = _req("W", _ids(10, 300), priority=-1)
    w.arrival = 1.0
    engine.add_request(w)
    assert _step(engine, 1.0) == [("A", 1)]
    assert engine.counters.preemptions == 1
    assert _step(engine, 2.0) == [("A", 1), ("W", 10)]
    assert _running(engine) == ["A"]  # W finished; C still waits


# --- chunked prefill and the step's limits -------------------------------------------


def test_chunked_prefill_20k_prompt_with_8192_budget_takes_3_steps() -> None:
    """A 20,000-token prompt under an 8,192-token budget: 3 chunks, 3 steps.

    `Scheduler.schedule` gives a request min(tokens left, budget left) per
    step (chunked prefill, on by default); the first token is sampled by the
    step that computes the prompt's last token: 8192 + 8192 + 3616.
    """
    engine = Engine(profile=get_profile("h100-llama3-8b"), max_batched_tokens=8192)
    req = _req("long", _ids(20_000, 1000), out=2)
    engine.add_request(req)
    chunks = []
    for _ in range(3):
        assert req.first_token_time is None
        chunks.append(_step(engine))
    assert chunks == [[("long", 8192)], [("long", 8192)], [("long", 3616)]]
    assert req.num_output == 1


def test_long_prefill_token_threshold_caps_chunks_only_with_company() -> None:
    """`long_prefill_token_threshold` caps a request's tokens per step.

    `Scheduler.schedule` applies it only when more than one request is
    running or waiting ("nobody to starve" otherwise). Threshold 256, budget
    8192: a lone 1000-token prompt runs in one step; two of them run 256
    tokens each per step (1000 = 3 x 256 + 232).
    """
    alone = _engine(200, budget=8192, long_prefill_token_threshold=256)
    alone.add_request(_req("A", _ids(1000, 0)))
    assert _step(alone) == [("A", 1000)]
    pair = _engine(200, budget=8192, long_prefill_token_threshold=256)
    pair.add_request(_req("A", _ids(1000, 0)))
    pair.add_request(_req("B", _ids(1000, 5000)))
    steps = [_step(pair) for _ in range(4)]
    assert steps == [[("A", 256), ("B", 256)]] * 3 + [[("A", 232), ("B", 232)]]


def test_running_requests_keep_admission_order_and_max_num_seqs() -> None:
    """Running requests are served in `running` order; at most `max_num_seqs` run.

    `max_num_seqs` 2: step 1 admits A and B (3 tokens each) and stops at
    `len(self.running) >= max_num_active_reqs`. A finishes after its first
    token; step 2 serves B's decode first (running requests before waiting
    ones), then admits C.
    """
    engine = _engine(8, max_num_seqs=2)
    engine.add_request(_req("A", [1, 2, 3]))
    engine.add_request(_req("B", [4, 5, 6], out=3))
    engine.add_request(_req("C", [7, 8, 9]))
    assert _step(engine) == [("A", 3), ("B", 3)]
    assert _step(engine) == [("B", 1), ("C", 3)]
