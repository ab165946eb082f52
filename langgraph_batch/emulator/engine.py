"""The engine model: a vLLM V1-style step loop over a paged KV cache.

The engine is a pure, synchronous state machine with no clock of its own:
`schedule(now)` picks the work of one step and returns its duration from the
cost model; `commit(step, end)` applies the step's results at its end time.
`simulate()` drives it in virtual time (fast, deterministic: the fidelity
tests); `langgraph_batch.emulator.driver.RealTimeDriver` drives it against the
wall clock for the HTTP server.

`schedule` follows vLLM 0.33.0's `Scheduler.schedule()`
(`vllm/v1/core/sched/scheduler.py`); the blocks are `kv_cache.KVCache`'s.

- Running requests come first, in the order of `running` (the order they
  were admitted in). Each gets all the tokens it has left to compute, a
  decode token or the rest of its prompt, cut to `long_prefill_token_threshold`
  (when set and more than one request is running or waiting) and to the token
  budget left (`max_batched_tokens`). A long prompt is therefore prefilled in
  chunks, one per step.
- When a running request's blocks do not fit, requests are preempted until
  they do (`_preempt_request`): under `fcfs` the last one in `running`, under
  `priority` the running request with the largest (priority, arrival), the
  first such one in `running` on a tie. That may be a request scheduled
  earlier in the same step: it then leaves the step and its tokens go back
  to the budget. A preempted request frees its blocks (those with a hash stay
  cached), its `num_computed` drops to 0 and it goes back to the front of
  the waiting queue (under `priority`, into the heap). When it is scheduled
  again it looks the cache up like a new request: its own blocks that were
  not evicted come back as hits, and it recomputes the rest, generated
  tokens included.
- If the running requests preempted anyone, no waiting request is admitted
  in that step. Otherwise waiting requests are admitted in queue order
  (`fcfs`: arrival; `priority`: (priority, arrival)) while the budget lasts
  and fewer than `max_num_seqs` run, each with its cache hits and one chunk.
  The first one whose blocks do not fit stops admission: with
  `scheduler_reserve_full_isl` (vLLM's default) it must fit all its known
  tokens, not only the chunk.
- Counters as vLLM's `/metrics` reports them: `prefix_cache_queries` and
  `prefix_cache_hits` (`vllm:prefix_cache_{queries,hits}_total`) and
  `cached_tokens` (`vllm:prompt_tokens_cached_total`) count a request when it
  is first admitted (`KVCacheManager.record_prefix_cache_stats`; requests
  admitted again after a preemption go to `PrefixCacheStats.preempted_*`,
  which no Prometheus counter exports); `preemptions`
  (`vllm:num_preemptions_total`) counts every preemption.

Deliberate simplifications: a step runs its requests at once and the next
step is scheduled only after `commit` (vLLM without async scheduling or
pipeline parallelism), so no request is ever scheduled with output still in
flight. There is no speculative decoding, no KV connector but the native CPU
offload tier (`offload.py`), and no `max_model_len` cut. Under `priority`,
ties of (priority, arrival) in the waiting queue go to the request created
first (vLLM compares request ids).

Per step the work is O(requests scheduled), never O(tokens): tokens are
counted, and the text of a request is produced once, when it arrives.
Picking a `priority` victim scans `running`, as vLLM does.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable
from typing import Literal

from langgraph_batch.emulator._engine_types import EngineCounters, ScheduledStep
from langgraph_batch.emulator._request_queue import WaitingQueue
from langgraph_batch.emulator.costs import Profile, StepShape
from langgraph_batch.emulator.kv_cache import BLOCK_SIZE, KVCache
from langgraph_batch.emulator.offload import OffloadCounters, OffloadTier
from langgraph_batch.emulator.request import Request, RequestStatus

__all__ = (
    "Engine",
    "EngineCounters",
    "Request",
    "RequestStatus",
    "ScheduledStep",
    "simulate",
)


Policy = Literal["fcfs", "priority"]


class Engine:
    """The step loop of one emulated server.

    Args:
        profile: Cost model.
        kv_tokens: KV capacity in tokens, rounded down to whole blocks: vLLM's
            `num_gpu_blocks`. The vLLM flavour sets one of them aside as the
            null block, as vLLM does; the SGLang flavour uses them all.
        block_size: Tokens per KV block (vLLM's `--block-size`).
        max_num_seqs: Most requests running at once.
        max_batched_tokens: Token budget of one step.
        scheduling_policy: `fcfs` or `priority` (lower `priority` first).
        enable_prefix_caching: Share full blocks across requests.
        flavor: `vllm` registers a block when its step is scheduled (same-step
            sharing); `sglang` inserts it only after the step ran, and keeps
            one cached copy of a block (the scheduling rules are vLLM's for both).
        long_prefill_token_threshold: Most tokens of one request per step
            when more than one request is running or waiting; 0 (vLLM's
            default) for no cap.
        scheduler_reserve_full_isl: Admit a waiting request only if blocks
            for all its known tokens fit, not only for its first chunk (vLLM's
            default, True).
        offload_tokens: Capacity of a second KV tier in host memory, in tokens
            (vLLM's `--kv-offloading-size`; `offload.OffloadTier` has its
            rules); None: no tier. A prefix that misses the GPU cache but hits
            the tier is loaded (`Profile.offload_load_s`), not computed.

    Raises:
        ValueError: a limit is not positive or a name is unknown.
    """

    def __init__(
        self,
        *,
        profile: Profile,
        kv_tokens: int | None = None,
        block_size: int = BLOCK_SIZE,
        max_num_seqs: int = 1024,
        max_batched_tokens: int = 8192,
        scheduling_policy: Policy = "fcfs",
        enable_prefix_caching: bool = True,
        flavor: Literal["vllm", "sglang"] = "vllm",
        long_prefill_token_threshold: int = 0,
        scheduler_reserve_full_isl: bool = True,
        offload_tokens: int | None = None,
    ) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_batched_tokens < 1:
            raise ValueError(f"max_batched_tokens must be >= 1, got {max_batched_tokens}")
        if scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy must be 'fcfs' or 'priority', got {scheduling_policy!r}"
            )
        if flavor not in ("vllm", "sglang"):
            raise ValueError(f"flavor must be 'vllm' or 'sglang', got {flavor!r}")
        if long_prefill_token_threshold < 0:
            raise ValueError(
                f"long_prefill_token_threshold must be >= 0, got {long_prefill_token_threshold}"
            )
        tokens = profile.kv_tokens if kv_tokens is None else kv_tokens
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        null_block = flavor == "vllm"
        least = block_size * (2 if null_block else 1)
        if tokens < least:
            raise ValueError(f"kv_tokens must be >= {least}, got {tokens}")
        self.profile = profile
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.policy: Policy = scheduling_policy
        self.flavor = flavor
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.scheduler_reserve_full_isl = scheduler_reserve_full_isl
        self.block_size = block_size
        self.kv = KVCache(
            num_blocks=tokens // block_size,
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching,
            cache_duplicates=flavor == "vllm",
            null_block=null_block,
        )
        self.offload = (
            None
            if offload_tokens is None
            else OffloadTier(
                num_blocks=offload_tokens // block_size,
                block_size=block_size,
                kv_bytes_per_token=profile.kv_bytes_per_token,
            )
        )
        self.running: list[Request] = []
        self.waiting = WaitingQueue(self.policy)
        self.counters = EngineCounters()
        self.in_flight: ScheduledStep | None = None
        self.paused = False
        """vLLM's `PauseState.PAUSED_ALL` (`POST /pause?mode=keep`): no step is
        scheduled, new requests queue up (`Scheduler.schedule` with a zero
        token budget)."""
        self.finished_log: deque[Request] = deque(maxlen=200_000)
        self.on_finish: Callable[[Request], None] | None = None
        self.notify: Callable[[Request], None] = _call_listener
        """Called for each request that made progress or was aborted; by default
        it calls the request's `listener`. A driver running the engine in its own
        thread replaces it to hand the news to the event loop in one batch."""

    # -- queue ---------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        """Requests waiting to be scheduled (aborted ones excluded)."""
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        """Requests holding KV (scheduled at least once and not finished)."""
        return len(self.running)

    @property
    def kv_capacity_tokens(self) -> int:
        """KV capacity in tokens as vLLM reports it: `num_gpu_blocks` x block size.

        The null block counts (vLLM's `kv_cache_size_tokens` and its start-up
        check of `max_model_len` count it); requests can hold one block less.
        """
        return self.kv.num_blocks * self.block_size

    @property
    def usable_kv_tokens(self) -> int:
        """Tokens the usable blocks hold (the null block excluded)."""
        return self.kv.num_usable_blocks * self.block_size

    def has_work(self) -> bool:
        """True when a step would schedule something (or requests are pending)."""
        return bool(self.running) or len(self.waiting) > 0

    def add_request(self, req: Request) -> None:
        """Queue a new request (its `arrival` is the engine time it arrived)."""
        self.counters.requests += 1
        self.counters.prompt_tokens_received += req.prompt_len
        self.waiting.push(req)

    def abort(self, req: Request) -> None:
        """Withdraw a request (client went away); its blocks are freed."""
        if req.finished:
            return
        if req.status is RequestStatus.WAITING:
            self.waiting.withdraw()
        req.status = RequestStatus.ABORTED
        self.counters.aborted += 1
        if req in self.running and (self.in_flight is None or not self._in_step(req)):
            self.running.remove(req)
            self.kv.free(req)
        if self.offload is not None:
            self.offload.finish(self.kv, req)
        self._notify(req)

    def _in_step(self, req: Request) -> bool:
        step = self.in_flight
        return step is not None and any(r is req for r, _ in step.items)

    def reset_counters(self) -> None:
        """Zero the counters (requests in flight keep running)."""
        self.counters = EngineCounters()
        self.kv.evictions = 0
        self.finished_log.clear()
        if self.offload is not None:
            self.offload.counters = OffloadCounters()

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix (blocks held by running requests stay)."""
        self.kv.reset_prefix_cache()

    # -- the step ------------------------------------------------------------

    def _preempt(self, victim: Request) -> None:
        # Scheduler._preempt_request: free the blocks (KVCacheManager.free keeps
        # the hashed ones cached), forget what was computed, back to the front.
        self.kv.free(victim)
        victim.num_computed = 0
        victim.num_preemptions += 1
        self.counters.preemptions += 1
        self.waiting.push(victim, front=True)

    def _pick_victim(self) -> int:
        """Index in `running` of the request to preempt (Scheduler.schedule)."""
        running = self.running
        if self.policy == "priority":
            # max() keeps the first of equal keys, as vLLM's does.
            victim = max(running, key=lambda r: (r.priority, r.arrival))
            return running.index(victim)
        return len(running) - 1

    def schedule(self, now: float) -> ScheduledStep | None:
        """Choose the work of one step starting at `now`; None when idle.

        Running requests go first (decodes and prefill chunks, in `running`
        order, preempting when KV runs out), then waiting ones while the
        token budget, `max_num_seqs` and KV memory allow and nobody was
        preempted in this step. The module docstring gives the rules.
        """
        if self.in_flight is not None:
            raise RuntimeError("commit the step in flight before scheduling another")
        if self.paused:
            return None
        budget = self.max_batched_tokens
        # scheduled request id -> tokens: a preempted one gives them back.
        scheduled: dict[int, int] = {}
        order: list[Request] = []
        deferred: list[tuple[Request, int]] = []
        kv = self.kv
        running = self.running
        preempted = False
        threshold = self.long_prefill_token_threshold
        if len(running) + len(self.waiting) <= 1:
            threshold = 0  # nobody to starve (Scheduler.schedule)
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            if req.status is RequestStatus.ABORTED:
                running.pop(i)
                kv.free(req)
                continue
            n = req.num_known_tokens - req.num_computed
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget)
            fits = True
            while not kv.allocate(req, n):
                v = self._pick_victim()
                victim = running.pop(v)
                if v < i:
                    i -= 1
                given_back = scheduled.pop(id(victim), None)
                if given_back is not None:
                    budget += given_back
                self._preempt(victim)
                preempted = True
                if victim is req:
                    fits = False
                    break
            if not fits:
                if self.policy == "priority":
                    continue  # it preempted itself; those after it may still fit
                break
            scheduled[id(req)] = n
            order.append(req)
            # Cached at scheduling, as allocate_slots does: a victim picked
            # later in this step leaves these blocks cached when it frees them.
            self._register(req, req.num_computed + n, deferred)
            budget -= n
            i += 1
        items = [(r, scheduled[id(r)]) for r in order if id(r) in scheduled]
        load_s = 0.0 if preempted else self._admit(now, budget, threshold, items, deferred)
        if not items:
            return None
        shape_tokens = 0
        attn_units = 0.0
        kv_tokens = 0
        sampled = 0
        decodes = 0
        for req, n in items:
            shape_tokens += n
            end = req.num_computed + n
            if end >= req.num_known_tokens:
                sampled += 1
            if n == 1 and req.num_computed >= req.prompt_len:
                kv_tokens += end
                decodes += 1
            else:
                attn_units += n * (req.num_computed + n / 2)
        shape = StepShape(
            num_tokens=shape_tokens,
            num_seqs=len(items),
            num_sampled=sampled,
            prefill_attn_units=attn_units,
            decode_kv_tokens=kv_tokens,
            num_decodes=decodes,
        )
        step = ScheduledStep(
            items=items,
            shape=shape,
            duration=self.profile.step_time(shape) + load_s,
            start=now,
            deferred_register=deferred,
        )
        self.in_flight = step
        return step

    def _admit(
        self,
        now: float,
        budget: int,
        threshold: int,
        items: list[tuple[Request, int]],
        deferred: list[tuple[Request, int]],
    ) -> float:
        """Admit waiting requests into `items` while they fit (Scheduler.schedule).

        Returns the seconds their loads from the offload tier take: the step
        waits for them (vLLM loads asynchronously and runs the request a step
        later, so this delays the step's other requests, which vLLM's does not).
        """
        kv = self.kv
        tier = self.offload
        load_s = 0.0
        while budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting.peek()
            if req is None:
                break
            hits = kv.find_cached(req) if not req.blocks else []
            hit_tokens = len(hits) * self.block_size
            # The connector's hit starts where the GPU's ends (get_num_new_matched_tokens).
            ext = (
                tier.lookup(kv, req, len(hits)) * self.block_size if tier and not req.blocks else 0
            )
            # A hit of every token computes the last one again (_update_waiting_for_remote_kv).
            done = min(hit_tokens + ext, req.num_known_tokens - 1) if ext else hit_tokens
            n = req.num_known_tokens - done
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget)
            full = self.scheduler_reserve_full_isl
            if not kv.allocate(req, done - hit_tokens + n, hits, full_sequence=full):
                break  # the head of the queue blocks the others, as in vLLM
            self.waiting.pop()
            req.status = RequestStatus.RUNNING
            req.num_computed = done
            if req.first_scheduled is None:
                req.first_scheduled = now
            if tier is not None and ext:
                seconds = self.profile.offload_load_s(ext)
                tier.load(kv, req, len(hits), ext // self.block_size, seconds)
                load_s += seconds
            if req.num_preemptions == 0:
                # KVCacheManager.record_prefix_cache_stats at admission (the
                # connector's stats beside it); a request back from a
                # preemption counts as `preempted_*`.
                req.cached_tokens = hit_tokens + ext
                c = self.counters
                c.cached_tokens += hit_tokens + ext
                c.prefix_cache_queries += req.num_known_tokens
                c.prefix_cache_hits += hit_tokens
                if tier is not None:
                    tier.counters.external_queries += req.num_known_tokens - hit_tokens
                    tier.counters.external_hits += ext
            self.running.append(req)
            items.append((req, n))
            # Registered now, so a request admitted next in this very step
            # finds these blocks (vLLM V1's same-step prefix sharing).
            self._register(req, done + n, deferred)
            budget -= n
        return load_s

    def _register(self, req: Request, tokens: int, deferred: list[tuple[Request, int]]) -> None:
        if self.offload is not None:
            self.offload.store(self.kv, req, tokens)  # written through (_build_store_jobs)
        if self.flavor == "sglang":
            deferred.append((req, tokens))
        else:
            self.kv.register_full_blocks(req, tokens)

    def commit(self, step: ScheduledStep, end: float) -> list[Request]:
        """Apply a scheduled step's results at engine time `end`.

        Returns:
            The requests that produced a token or finished in this step.
        """
        if step is not self.in_flight:
            raise RuntimeError("commit() got a step that is not in flight")
        self.in_flight = None
        c = self.counters
        c.steps += 1
        c.busy_time += step.duration
        kv = self.kv
        for req, tokens in step.deferred_register:
            if req.status is RequestStatus.RUNNING:
                kv.register_full_blocks(req, tokens)
        touched: list[Request] = []
        done: list[Request] = []
        for req, n in step.items:
            if req.status is RequestStatus.ABORTED:
                done.append(req)
                continue
            before = req.num_computed
            req.num_computed = before + n
            if before < req.prompt_len:
                c.prefill_tokens_computed += min(n, req.prompt_len - before)
            if req.num_computed >= req.num_known_tokens:
                req.num_output += 1
                c.generation_tokens += 1
                if req.first_token_time is None:
                    req.first_token_time = end
                    c.ttft_count += 1
                    c.ttft_sum += end - req.arrival
                    if req.first_scheduled is not None:
                        c.queue_time_sum += req.first_scheduled - req.arrival
                if req.token_times is not None:
                    req.token_times.append(end)
                if req.num_output >= req.target_output:
                    req.status = RequestStatus.FINISHED
                    req.finish_time = end
                    c.finished += 1
                    done.append(req)
                touched.append(req)
        if done:
            gone = {id(r) for r in done}
            self.running = [r for r in self.running if id(r) not in gone]
            for req in done:
                kv.free(req)
                if self.offload is not None:
                    self.offload.finish(self.kv, req)
                if req.status is RequestStatus.FINISHED:
                    self.finished_log.append(req)
                    if self.on_finish is not None:
                        self.on_finish(req)
        for req in touched:
            self._notify(req)
        return touched

    def _notify(self, req: Request) -> None:
        self.notify(req)


def _call_listener(req: Request) -> None:
    if req.listener is not None:
        req.listener(req)


def simulate(
    engine: Engine,
    arrivals: Iterable[tuple[float, Request]],
    *,
    until: float | None = None,
    on_token: Callable[[Request, float], Iterable[tuple[float, Request]] | None] | None = None,
) -> float:
    """Run the engine in virtual time until every request finished.

    Args:
        engine: The engine (fresh or reused).
        arrivals: (time, request) pairs; `request.arrival` is set to time.
        until: Stop at this engine time even if work remains.
        on_token: Called for each request that produced a token at time t; it
            may return new (time, request) arrivals (closed-loop clients).

    Returns:
        The engine time when the last step ended.
    """
    pending = sorted(arrivals, key=lambda a: a[0])
    heap: list[tuple[float, int, Request]] = [(t, r.seq, r) for t, r in pending]
    heapq.heapify(heap)
    now = 0.0
    while True:
        while heap and heap[0][0] <= now:
            t, _, req = heapq.heappop(heap)
            req.arrival = t
            engine.add_request(req)
        if until is not None and now >= until:
            return now
        step = engine.schedule(now)
        if step is None:
            if not heap:
                return now
            now = heap[0][0]
            continue
        now += step.duration
        touched = engine.commit(step, now)
        if on_token is not None:
            for req in touched:
                new = on_token(req, now)
                if new:
                    for t, r in new:
                        heapq.heappush(heap, (t, r.seq, r))
