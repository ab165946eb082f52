"""`EndpointPool`: one `Backend` over several replicas, with cache-affinity routing.

Replicas of one model each keep their own prefix (KV) cache. A sibling's
turn 2 re-sends turn 1's whole conversation; it is a cache hit only on the
replica that served turn 1. A round-robin balancer scatters a sibling's turns
over all replicas and recomputes the prefix almost every time; the pool
instead routes every call with the same `ChatRequest.route_key` (every call of
one fan_out sibling) or, without one, the same system + first user message,
to the same replica. The key is data on the request, set where it is built:
the pool reads no context variable, so requests the scheduler merges into one
batch route exactly as they would alone.

Routing (`routing="affinity"`, the default) is consistent hashing with
bounded loads (Mirrokni, Thorup and Zadimoghaddam, 2018): a key's replica is
the first one clockwise on a hash ring whose in-flight count stays within
`ceil(load_factor * average)`; a hot replica overflows to the next one on the
ring. The chosen replica is remembered per key in a bounded LRU, so later
turns stick to it even when the walk moved the key off its ring position.

A replica that fails with `BackendConnectionError` is marked down for a
cooldown (doubling per consecutive failure) and the call moves to another
replica, unless it already delivered output to its caller (the rule the
scheduler's retries follow too: `Delivery`, in `langgraph_batch._retry_policy`);
keys re-route. When every replica is down the last connection error is raised.

Example:
    ```python
    from langgraph_batch.backends import VLLMBackend
    from langgraph_batch.backends.pool import EndpointPool

    pool = EndpointPool([VLLMBackend("http://gpu1:8000"), VLLMBackend("http://gpu2:8000")])
    # or: backend_from_url("vllm://gpu1:8000,gpu2:8000", routing="affinity")
    ```
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import itertools
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

from langgraph_batch._redact import safe_url
from langgraph_batch._retry_policy import Delivery
from langgraph_batch.backends._session import affinity_key, conversation_key
from langgraph_batch.backends.base import (
    Backend,
    BackendCapabilities,
    ChatChunk,
    ChatRequest,
    ChatResponse,
    EngineMetrics,
    ModelInfo,
)
from langgraph_batch.errors import BackendConnectionError, BackendError

__all__ = ("EndpointPool", "Routing", "affinity_key", "conversation_key")

logger = logging.getLogger(__name__)

Routing = Literal["affinity", "round_robin", "least_loaded"]
_ROUTINGS: tuple[str, ...] = get_args(Routing)


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class _Replica:
    """Bookkeeping for one member backend."""

    __slots__ = ("backend", "down_until", "failures", "index", "inflight")

    def __init__(self, index: int, backend: Backend) -> None:
        self.index = index
        self.backend = backend
        self.inflight = 0
        self.failures = 0
        self.down_until = 0.0


class EndpointPool(Backend):
    """A `Backend` that spreads calls over several replicas of one model.

    Example:
        ```python
        pool = EndpointPool(
            [VLLMBackend("http://gpu1:8000"), VLLMBackend("http://gpu2:8000")],
            routing="affinity",
        )
        async with Scheduler(pool) as scheduler:
            ...
        ```

    Args:
        backends: the replicas (at least one). The pool owns them: `aclose`
            closes every one.
        routing: `"affinity"` (a sibling's or conversation's calls go to one
            replica; consistent hashing with bounded loads), `"round_robin"`
            or `"least_loaded"` (fewest in-flight calls).
        load_factor: affinity only; a replica takes a new key while its
            in-flight count stays within `ceil(load_factor * average)`.
            Must be >= 1.
        cooldown_s: how long a replica that failed to connect is skipped;
            doubles per consecutive failure, up to `max_cooldown_s`.
        max_cooldown_s: the longest cooldown.
        virtual_nodes: ring points per replica (more: a more even spread).
        max_affinity_keys: size of the key -> replica LRU.
        clock: monotonic seconds (injectable for tests).

    Raises:
        ValueError: no backends, an unknown routing, `load_factor < 1`, or a
            non-positive cooldown / node count.
    """

    def __init__(
        self,
        backends: Sequence[Backend],
        *,
        routing: Routing = "affinity",
        load_factor: float = 1.25,
        cooldown_s: float = 5.0,
        max_cooldown_s: float = 60.0,
        virtual_nodes: int = 160,
        max_affinity_keys: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        members = list(backends)
        if not members:
            raise ValueError("EndpointPool needs at least one backend; got an empty sequence")
        for b in members:
            if not isinstance(b, Backend):
                raise ValueError(f"EndpointPool members must be Backend instances, got {b!r}")
        if routing not in _ROUTINGS:
            raise ValueError(f"routing={routing!r} is not one of {', '.join(_ROUTINGS)}")
        if not load_factor >= 1.0:
            raise ValueError(f"load_factor={load_factor!r} must be >= 1.0")
        if not cooldown_s > 0 or not max_cooldown_s >= cooldown_s:
            raise ValueError(
                f"cooldown_s={cooldown_s!r} must be > 0 and max_cooldown_s={max_cooldown_s!r} "
                ">= cooldown_s"
            )
        if virtual_nodes < 1 or max_affinity_keys < 1:
            raise ValueError(
                f"virtual_nodes={virtual_nodes!r} and max_affinity_keys={max_affinity_keys!r} "
                "must be >= 1"
            )
        self.routing: Routing = routing
        self.load_factor = float(load_factor)
        self.cooldown_s = float(cooldown_s)
        self.max_cooldown_s = float(max_cooldown_s)
        self.max_affinity_keys = max_affinity_keys
        self._clock = clock
        self._replicas = [_Replica(i, b) for i, b in enumerate(members)]
        self._affinity: OrderedDict[str, int] = OrderedDict()
        self._rr = itertools.count()
        self._last_error: BackendConnectionError | None = None
        points = sorted(
            (_hash64(f"{r.backend.key}#{r.index}#{v}"), r.index)
            for r in self._replicas
            for v in range(virtual_nodes)
        )
        self._ring_hashes = [h for h, _ in points]
        self._ring_owners = [i for _, i in points]
        first = members[0].capabilities
        self.capabilities = BackendCapabilities(
            priority=all(b.capabilities.priority for b in members),
            metrics=any(b.capabilities.metrics for b in members),
            batch_completions=all(b.capabilities.batch_completions for b in members),
            flavor=first.flavor,
            hosted_prompt_cache=all(b.capabilities.hosted_prompt_cache for b in members),
        )
        self.base_url = ",".join(b.base_url for b in members)

    # ------------------------------------------------------------ introspection

    def __repr__(self) -> str:
        return f"<EndpointPool routing={self.routing} replicas={len(self._replicas)}>"

    @property
    def key(self) -> str:
        """`EndpointPool(<routing>):<sorted member keys>`."""
        members = ",".join(sorted(r.backend.key for r in self._replicas))
        return f"EndpointPool({self.routing}):{members}"

    @property
    def backends(self) -> tuple[Backend, ...]:
        """The member backends, in construction order."""
        return tuple(r.backend for r in self._replicas)

    def inflight(self) -> tuple[int, ...]:
        """Calls on the wire per replica now, in member order."""
        return tuple(r.inflight for r in self._replicas)

    def is_down(self, index: int) -> bool:
        """True while replica `index` sits out a connection-failure cooldown."""
        return self._replicas[index].down_until > self._clock()

    # ------------------------------------------------------------ routing

    def _up(self, exclude: set[int]) -> list[_Replica]:
        now = self._clock()
        return [r for r in self._replicas if r.index not in exclude and r.down_until <= now]

    def _all_down(self) -> BackendError:
        if self._last_error is not None:
            return self._last_error
        return BackendConnectionError(
            f"all {len(self._replicas)} replicas of the pool are down or were tried; "
            "check that the servers are up",
            url=self.base_url,
        )

    def _pick(self, request: ChatRequest, exclude: set[int]) -> _Replica:
        """Choose the replica for `request`, skipping `exclude` and down replicas.

        Raises:
            BackendError: every replica is down or excluded.
        """
        up = self._up(exclude)
        if not up:
            raise self._all_down()
        if self.routing == "round_robin":
            return up[next(self._rr) % len(up)]
        if self.routing == "least_loaded":
            start = next(self._rr)
            return min(up, key=lambda r: (r.inflight, (r.index - start) % len(self._replicas)))
        return self._pick_affinity(up, affinity_key(request))

    def _pick_affinity(self, up: list[_Replica], key: str) -> _Replica:
        """Consistent hashing with bounded loads, behind a remembered-key LRU.

        A remembered key whose replica is up keeps it, whatever its load (its
        prefix is cached there). Otherwise walk the ring from the key to the
        first replica within the load bound, and remember it.
        """
        up_ids = {r.index for r in up}
        remembered = self._affinity.get(key)
        if remembered is not None and remembered in up_ids:
            self._remember(key, remembered)
            return self._replicas[remembered]
        total = sum(r.inflight for r in up) + 1
        capacity = math.ceil(self.load_factor * total / len(up))
        n_points = len(self._ring_hashes)
        start = bisect.bisect_left(self._ring_hashes, _hash64(key))
        chosen: _Replica | None = None
        seen: set[int] = set()
        for step in range(n_points):
            owner = self._ring_owners[(start + step) % n_points]
            if owner in seen or owner not in up_ids:
                continue
            seen.add(owner)
            if self._replicas[owner].inflight + 1 <= capacity:
                chosen = self._replicas[owner]
                break
            if len(seen) == len(up_ids):
                break
        if chosen is None:  # unreachable with load_factor >= 1; keep a safe answer
            chosen = min(up, key=lambda r: r.inflight)
        self._remember(key, chosen.index)
        return chosen

    def _remember(self, key: str, index: int) -> None:
        self._affinity[key] = index
        self._affinity.move_to_end(key)
        while len(self._affinity) > self.max_affinity_keys:
            self._affinity.popitem(last=False)

    def _mark_down(self, replica: _Replica, error: BackendConnectionError) -> None:
        replica.failures += 1
        cooldown = min(self.cooldown_s * 2 ** (replica.failures - 1), self.max_cooldown_s)
        now = self._clock()
        replica.down_until = now + cooldown
        self._last_error = error
        logger.warning(
            "pool replica %s unreachable; skipping it for %.1f s",
            replica.backend.base_url,
            cooldown,
            extra={"replica": replica.backend.base_url, "cooldown_s": cooldown},
        )

    def _mark_up(self, replica: _Replica) -> None:
        if replica.failures:
            logger.info("pool replica %s is back", safe_url(replica.backend.base_url))
        replica.failures = 0

    # ------------------------------------------------------------ Backend API

    async def chat(
        self,
        request: ChatRequest,
        *,
        on_chunk: Callable[[ChatChunk], None] | None = None,
    ) -> ChatResponse:
        """Route `request` to a replica and run it there.

        A replica that cannot be reached is marked down and the call moves
        to the next one, unless it already delivered output (`Delivery`).

        Raises:
            BackendError: what the replica raised; the last connection error
                when every replica is down.
        """
        delivery = Delivery()
        forward = delivery.wrap(on_chunk) if on_chunk is not None else None
        tried: set[int] = set()
        while True:
            replica = self._pick(request, tried)
            tried.add(replica.index)
            replica.inflight += 1
            try:
                response = await replica.backend.chat(request, on_chunk=forward)
            except BackendConnectionError as exc:
                self._mark_down(replica, exc)
                if not delivery.replayable:
                    raise
                continue
            finally:
                replica.inflight -= 1
            self._mark_up(replica)
            return response

    async def complete_batch_settled(
        self, requests: Sequence[ChatRequest]
    ) -> list[ChatResponse | BackendError]:
        """Split the batch by routed replica and run the parts concurrently.

        Each request gets its own response or error, in input order. A part
        whose replica cannot be reached (every member failed to connect) is
        re-routed, that replica excluded, like a single call.

        Returns:
            One `ChatResponse` or `BackendError` per request, in input order.
        """
        results: list[ChatResponse | BackendError | None] = [None] * len(requests)

        async def run_part(indices: list[int], tried: set[int], replica: _Replica) -> None:
            while True:
                part = [requests[i] for i in indices]
                replica.inflight += len(part)
                try:
                    out = await replica.backend.complete_batch_settled(part)
                finally:
                    replica.inflight -= len(part)
                if len(out) != len(part):
                    raise BackendError(
                        f"replica {replica.backend.base_url} returned {len(out)} outcomes "
                        f"for {len(part)} requests",
                        url=replica.backend.base_url,
                    )
                if out and all(isinstance(o, BackendConnectionError) for o in out):
                    self._mark_down(replica, out[0])  # type: ignore[arg-type]
                    tried = tried | {replica.index}
                    try:
                        replica = self._pick(part[0], tried)
                    except BackendError:
                        pass  # every replica is down: the members keep their errors
                    else:
                        continue
                else:
                    self._mark_up(replica)
                for i, outcome in zip(indices, out, strict=True):
                    results[i] = outcome
                return

        groups: dict[int, list[int]] = {}
        for i, request in enumerate(requests):
            replica = self._pick(request, set())
            # Count it now so the load bound spreads the rest of the batch.
            replica.inflight += 1
            groups.setdefault(replica.index, []).append(i)
        for index, indices in groups.items():
            self._replicas[index].inflight -= len(indices)
        try:
            async with asyncio.TaskGroup() as tg:
                for index, indices in groups.items():
                    tg.create_task(run_part(indices, set(), self._replicas[index]))
        except BaseExceptionGroup as group:
            first = group.exceptions[0]
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from None
        return [r for r in results if r is not None]

    async def _each(self, fn: Callable[[Backend], Any]) -> list[Any]:
        """Run `fn(member)` on every member concurrently; exceptions are returned."""
        return list(
            await asyncio.gather(*(fn(r.backend) for r in self._replicas), return_exceptions=True)
        )

    async def metrics(self) -> EngineMetrics | None:
        """Load figures summed over the replicas that answered (None: none did).

        Counts (running, waiting, preemptions, token and cache counters, KV
        capacity) are sums; `kv_cache_usage` is the mean; `cache_hit_rate`
        is hits / queries when those are known, else the mean.
        """
        answers = await self._each(lambda b: b.metrics())
        for a in answers:
            if isinstance(a, BaseException) and not isinstance(a, Exception):
                raise a
        got: list[EngineMetrics] = [a for a in answers if isinstance(a, EngineMetrics)]
        if not got:
            return None

        def total(name: str) -> float | None:
            vals = [getattr(m, name) for m in got if getattr(m, name) is not None]
            return float(sum(vals)) if vals else None

        def mean(name: str) -> float | None:
            vals = [getattr(m, name) for m in got if getattr(m, name) is not None]
            return float(sum(vals)) / len(vals) if vals else None

        capacities = [m.kv_capacity_tokens for m in got if m.kv_capacity_tokens is not None]
        queries = total("prefix_cache_queries_total")
        hits = total("prefix_cache_hits_total")
        hit_rate = hits / queries if queries and hits is not None else mean("cache_hit_rate")
        caching = [m.prefix_caching for m in got if m.prefix_caching is not None]
        return EngineMetrics(
            num_requests_running=total("num_requests_running"),
            num_requests_waiting=total("num_requests_waiting"),
            kv_cache_usage=mean("kv_cache_usage"),
            num_preemptions_total=total("num_preemptions_total"),
            prefix_cache_queries_total=queries,
            prefix_cache_hits_total=hits,
            prompt_tokens_total=total("prompt_tokens_total"),
            generation_tokens_total=total("generation_tokens_total"),
            kv_capacity_tokens=sum(capacities) if capacities else None,
            block_size=next((m.block_size for m in got if m.block_size is not None), None),
            prefix_caching=all(caching) if caching else None,
            cache_hit_rate=hit_rate,
            engines=sum(m.engines or 1 for m in got),
        )

    async def health(self) -> bool:
        """True when at least one replica says it is healthy."""
        answers = await self._each(lambda b: b.health())
        return any(a is True for a in answers)

    async def count_tokens(self, model: str, **kw: Any) -> int:
        """The first replica that can count (replicas serve one model: one tokenizer).

        Raises:
            NotImplementedError: no replica can count tokens.
            BackendError: the last replica's failure, when every one failed.
        """
        last: Exception = NotImplementedError("no replica can count tokens")
        for replica in self._replicas:
            try:
                return await replica.backend.count_tokens(model, **kw)
            except (NotImplementedError, BackendError) as exc:
                last = exc
        raise last

    async def models(self) -> list[ModelInfo]:
        """The union of the replicas' models (first answer wins per id).

        Raises:
            BackendError: every replica failed to list its models.
        """
        answers = await self._each(lambda b: b.models())
        seen: dict[str, ModelInfo] = {}
        errors: list[BaseException] = []
        for a in answers:
            if isinstance(a, BaseException):
                errors.append(a)
                continue
            for info in a:
                seen.setdefault(info.id, info)
        if errors and len(errors) == len(answers):
            raise errors[-1]
        return list(seen.values())

    async def aclose(self) -> None:
        """Close every replica. Idempotent."""
        answers = await self._each(lambda b: b.aclose())
        for a in answers:
            if isinstance(a, BaseException):
                raise a
