"""The engine model: a vLLM V1-style step loop over a paged KV cache.

The engine is a pure, synchronous state machine with no clock of its own:
`schedule(now)` picks the work of one step and returns its duration from the
cost model; `commit(step, end)` applies the step's results at its end time.
`simulate()` drives it in virtual time (fast, deterministic: the fidelity
tests); `langgraph_batch.emulator.driver.RealTimeDriver` drives it against the
wall clock for the HTTP server.

Per step the work is O(requests scheduled), never O(tokens): tokens are
counted, and the text of a request is produced once, when it arrives.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from langgraph_batch.emulator.costs import Profile, StepShape
from langgraph_batch.emulator.kv_cache import BLOCK_SIZE, KVCache
from langgraph_batch.emulator.request import Request, RequestStatus

__all__ = (
    "Engine",
    "EngineCounters",
    "Request",
    "RequestStatus",
    "ScheduledStep",
    "simulate",
)


@dataclass(slots=True)
class EngineCounters:
    """Cumulative counters (what `/emulator/stats` and `/metrics` report)."""

    requests: int = 0
    """Requests received."""
    finished: int = 0
    aborted: int = 0
    prompt_tokens_received: int = 0
    prefill_tokens_computed: int = 0
    """Prompt (and recomputed) tokens actually run through the model."""
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache at first scheduling."""
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    steps: int = 0
    busy_time: float = 0.0
    """Engine seconds spent in steps."""
    queue_time_sum: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: int = 0


@dataclass(slots=True)
class ScheduledStep:
    """The work of one step, from `Engine.schedule`."""

    items: list[tuple[Request, int]]
    """(request, tokens computed for it in this step)."""
    shape: StepShape
    duration: float
    """Engine seconds the step takes."""
    start: float
    deferred_register: list[tuple[Request, int]] = field(default_factory=list)
    """SGLang flavour: (request, tokens) whose blocks join the cache after the step."""


Policy = Literal["fcfs", "priority"]


class Engine:
    """The step loop of one emulated server.

    Args:
        profile: Cost model.
        kv_tokens: KV capacity in tokens (rounded down to whole blocks).
        max_num_seqs: Most requests running at once.
        max_batched_tokens: Token budget of one step.
        scheduling_policy: `fcfs` or `priority` (lower `priority` first).
        enable_prefix_caching: Share full blocks across requests.
        flavor: `vllm` registers a block when its step is scheduled (same-step
            sharing); `sglang` inserts it only after the step ran.

    Raises:
        ValueError: a limit is not positive or a name is unknown.
    """

    def __init__(
        self,
        *,
        profile: Profile,
        kv_tokens: int | None = None,
        max_num_seqs: int = 1024,
        max_batched_tokens: int = 8192,
        scheduling_policy: Policy = "fcfs",
        enable_prefix_caching: bool = True,
        flavor: Literal["vllm", "sglang"] = "vllm",
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
        tokens = profile.kv_tokens if kv_tokens is None else kv_tokens
        if tokens < BLOCK_SIZE:
            raise ValueError(f"kv_tokens must be >= {BLOCK_SIZE}, got {tokens}")
        self.profile = profile
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.policy: Policy = scheduling_policy
        self.flavor = flavor
        self.kv = KVCache(
            num_blocks=tokens // BLOCK_SIZE,
            enable_prefix_caching=enable_prefix_caching,
            cache_duplicates=flavor == "vllm",
        )
        self.running: list[Request] = []
        self._fcfs: deque[Request] = deque()
        self._heap: list[tuple[int, float, int, Request]] = []
        self._num_waiting = 0
        self.counters = EngineCounters()
        self.in_flight: ScheduledStep | None = None
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
        return self._num_waiting

    @property
    def num_running(self) -> int:
        """Requests holding KV (scheduled at least once and not finished)."""
        return len(self.running)

    @property
    def kv_capacity_tokens(self) -> int:
        """KV capacity in tokens."""
        return self.kv.num_blocks * BLOCK_SIZE

    def has_work(self) -> bool:
        """True when a step would schedule something (or requests are pending)."""
        return bool(self.running) or self._num_waiting > 0

    def _push_waiting(self, req: Request, *, front: bool = False) -> None:
        req.status = RequestStatus.WAITING
        self._num_waiting += 1
        if self.policy == "priority":
            heapq.heappush(self._heap, (req.priority, req.arrival, req.seq, req))
        elif front:
            self._fcfs.appendleft(req)
        else:
            self._fcfs.append(req)

    def _peek_waiting(self) -> Request | None:
        if self.policy == "priority":
            heap = self._heap
            while heap and heap[0][3].status is not RequestStatus.WAITING:
                heapq.heappop(heap)
            return heap[0][3] if heap else None
        q = self._fcfs
        while q and q[0].status is not RequestStatus.WAITING:
            q.popleft()
        return q[0] if q else None

    def _pop_waiting(self) -> None:
        if self.policy == "priority":
            heapq.heappop(self._heap)
        else:
            self._fcfs.popleft()
        self._num_waiting -= 1

    def add_request(self, req: Request) -> None:
        """Queue a new request (its `arrival` is the engine time it arrived)."""
        self.counters.requests += 1
        self.counters.prompt_tokens_received += req.prompt_len
        self._push_waiting(req)

    def abort(self, req: Request) -> None:
        """Withdraw a request (client went away); its blocks are freed."""
        if req.finished:
            return
        if req.status is RequestStatus.WAITING:
            self._num_waiting -= 1
        req.status = RequestStatus.ABORTED
        self.counters.aborted += 1
        if req in self.running and (self.in_flight is None or not self._in_step(req)):
            self.running.remove(req)
            self.kv.free(req)
        self._notify(req)

    def _in_step(self, req: Request) -> bool:
        step = self.in_flight
        return step is not None and any(r is req for r, _ in step.items)

    def reset_counters(self) -> None:
        """Zero the counters (requests in flight keep running)."""
        self.counters = EngineCounters()
        self.kv.evictions = 0
        self.finished_log.clear()

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix (blocks held by running requests stay)."""
        self.kv.reset_prefix_cache()

    # -- the step ------------------------------------------------------------

    def _preempt(self, victim: Request) -> None:
        self.running.remove(victim)
        self.kv.free(victim)
        victim.num_computed = 0
        victim.num_preemptions += 1
        self.counters.preemptions += 1
        self._push_waiting(victim, front=True)

    def _pick_victim(self, candidates: list[Request]) -> Request:
        if self.policy == "priority":
            return max(candidates, key=lambda r: (r.priority, r.arrival, r.seq))
        return candidates[-1]

    def schedule(self, now: float) -> ScheduledStep | None:
        """Choose the work of one step starting at `now`; None when idle.

        Running requests go first (decodes, unfinished prefill chunks), then
        waiting ones while the token budget, `max_num_seqs` and KV memory allow.
        """
        if self.in_flight is not None:
            raise RuntimeError("commit the step in flight before scheduling another")
        budget = self.max_batched_tokens
        items: list[tuple[Request, int]] = []
        kv = self.kv
        deferred: list[tuple[Request, int]] = []
        preempted = False
        scheduled: set[int] = set()
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.status is RequestStatus.ABORTED:
                self.running.pop(i)
                kv.free(req)
                continue
            n = min(req.num_known_tokens - req.num_computed, budget)
            ok = True
            while not kv.allocate(req, n):
                rest = [r for r in self.running[i:] if id(r) not in scheduled]
                victim = self._pick_victim(rest)
                self._preempt(victim)
                preempted = True
                if victim is req:
                    ok = False
                    break
            if not ok:
                continue
            items.append((req, n))
            self._register(req, req.num_computed + n, deferred)
            scheduled.add(id(req))
            budget -= n
            i += 1
        if not preempted:
            while budget > 0 and len(self.running) < self.max_num_seqs:
                cand = self._peek_waiting()
                if cand is None:
                    break
                req = cand
                first = req.first_scheduled is None
                hits = kv.find_cached(req) if not req.blocks else []
                hit_tokens = len(hits) * BLOCK_SIZE
                n = min(req.num_known_tokens - hit_tokens, budget)
                if not kv.allocate(req, n, hits):
                    break
                self._pop_waiting()
                req.status = RequestStatus.RUNNING
                req.num_computed = hit_tokens
                if first:
                    req.first_scheduled = now
                    req.cached_tokens = hit_tokens
                    c = self.counters
                    c.cached_tokens += hit_tokens
                    c.prefix_cache_queries += req.prompt_len
                    c.prefix_cache_hits += hit_tokens
                self.running.append(req)
                items.append((req, n))
                # Registered now, so a request scheduled next in this very step
                # finds these blocks (vLLM V1's same-step prefix sharing).
                self._register(req, hit_tokens + n, deferred)
                budget -= n
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
            duration=self.profile.step_time(shape),
            start=now,
            deferred_register=deferred,
        )
        self.in_flight = step
        return step

    def _register(self, req: Request, tokens: int, deferred: list[tuple[Request, int]]) -> None:
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
            if not req.finished:
                kv.register_full_blocks(req, tokens)
        touched: list[Request] = []
        done: list[Request] = []
        for req, n in step.items:
            if req.status is RequestStatus.ABORTED:
                done.append(req)
                continue
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted later in the same schedule pass
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
