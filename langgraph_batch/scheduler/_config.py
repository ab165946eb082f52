"""`BatchPolicy`: the scheduler's user-facing configuration, a frozen value object.

The decision logic that applies it lives in `_policy.py` (`Planner`).
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from typing_extensions import deprecated

from langgraph_batch._estimates import CONTEXT_TOKENS_PRIOR
from langgraph_batch._rate_budget import RateLimitPolicy
from langgraph_batch._retry_policy import RetryPolicy
from langgraph_batch.scheduler._priority import PRIORITY_MODES, PriorityMode

__all__ = ("BatchPolicy", "PrefixWarming", "PriorityMode")


PrefixWarming = Literal["auto", "on", "off"]
_PREFIX_WARMING: tuple[str, ...] = ("auto", "on", "off")


# Deprecated keywords (outside the dataclass's fields, so that `dataclasses.replace`
# and `fields()` never see them) -> what they are now.
_DEPRECATED = {
    "max_inflight": "inflight_limit",
    "max_retries": "retry=RetryPolicy(max_attempts=max_retries + 1)",
    "backoff_base_s": "retry=RetryPolicy(initial_interval=...)",
    "backoff_max_s": "retry=RetryPolicy(max_interval=...)",
}
_DEPRECATED_MAX_INFLIGHT = (
    "BatchPolicy's max_inflight is deprecated: it is inflight_limit (BatchedChatModel's "
    "max_inflight, the hard cap, keeps its name)"
)
_RETRY_FIELDS = {
    "max_retries": "max_attempts",
    "backoff_base_s": "initial_interval",
    "backoff_max_s": "max_interval",
}


def _current_spelling(cls: type, fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` with the deprecated keywords turned into today's (one DeprecationWarning each).

    Warns at the caller of `BatchPolicy(...)` (this runs inside the metaclass's `__call__`).
    A deprecated keyword beside its replacement is a TypeError, unless every field
    is given: `dataclasses.replace(policy, max_retries=5)` restates them all, and
    the deprecated keyword is then the change asked for.
    """
    if not fields.keys() & _DEPRECATED.keys():
        return fields
    restated = fields.keys() >= {f.name for f in dataclasses.fields(cls) if f.init}
    fields = dict(fields)
    if "max_inflight" in fields:
        warnings.warn(_DEPRECATED_MAX_INFLIGHT, DeprecationWarning, stacklevel=3)
        old = fields.pop("max_inflight")
        if "inflight_limit" in fields and not restated:
            raise TypeError("pass inflight_limit= only (max_inflight= is its deprecated name)")
        fields["inflight_limit"] = old
    old_retry = {name: fields.pop(name) for name in _RETRY_FIELDS if name in fields}
    if old_retry:
        warnings.warn(
            f"BatchPolicy's {', '.join(old_retry)} deprecated: pass "
            "retry=RetryPolicy(max_attempts=..., initial_interval=..., max_interval=...)",
            DeprecationWarning,
            stacklevel=3,
        )
        if "retry" in fields and not restated:
            raise TypeError(f"pass retry= only ({', '.join(old_retry)}: its deprecated spelling)")
        if "max_retries" in old_retry:
            _check_int("max_retries", old_retry["max_retries"], 0)
            old_retry["max_retries"] += 1
        base = fields.get("retry", RetryPolicy())  # the policy's own, under replace()
        fields["retry"] = replace(base, **{_RETRY_FIELDS[k]: v for k, v in old_retry.items()})
    return fields


def _read_retry(old: str) -> str:
    return f"BatchPolicy.{old} is deprecated: read BatchPolicy.retry ({_DEPRECATED[old]})"


class _AcceptsDeprecatedKeywords(type):
    """`BatchPolicy`'s metaclass: the deprecated keywords become today's fields.

    `BatchPolicy(max_inflight=8)` warns and calls the dataclass with
    `inflight_limit=8`, so the class keeps the `__init__`, `fields()`,
    `dataclasses.replace`, equality, repr and pickling `@dataclass` gave it,
    and documentation tools read its fields as a dataclass's. (A subclass
    with its own `__init__(**fields)` would show that signature instead.)
    """

    def __call__(cls, *args: Any, **fields: Any) -> Any:
        return super().__call__(*args, **_current_spelling(cls, fields))

    @property
    def __signature__(cls) -> inspect.Signature:
        """The dataclass's `__init__` less `self`: what `inspect.signature(BatchPolicy)` shows."""
        # The generated `__init__` (a subclass's: the one it inherits).
        init = inspect.signature(
            next(c.__dict__["__init__"] for c in cls.__mro__ if "__init__" in c.__dict__)
        )
        return init.replace(parameters=list(init.parameters.values())[1:])


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchPolicy(metaclass=_AcceptsDeprecatedKeywords):
    """How a `Scheduler` queues, admits, batches and retries requests.

    Every field has a working default; the ones most worth tuning are
    `inflight_limit` (engine load) and `priority`.

    The in-flight limit: without engine metrics (a plain OpenAI-compatible
    server) it is `inflight_limit`, lowered temporarily after 429/503. With
    engine metrics (vLLM, SGLang) it starts at `initial_inflight` (default
    `inflight_limit`) and adapts between `min_inflight` and `hard_cap`
    (`inflight_cap`, default 4 x `inflight_limit`). To promise a server "never
    more than N", set `inflight_cap=N` (and `inflight_limit <= N`).
    (`BatchedChatModel(max_inflight=N)` is that hard cap: its default policy
    sets `inflight_limit=inflight_cap=N`.) `max_inflight=` is the deprecated
    spelling of `inflight_limit=`.

    The decode cap (`decode_cap`, on by default): with metrics that count
    generated tokens, agent requests are also held near the concurrency past
    which the engine's decode throughput stops growing, learned while the run
    goes; one-shot requests (what `abatch` sends) are not.

    Retries: `retry`, a `RetryPolicy` (the deprecated keywords `max_retries=`,
    `backoff_base_s=` and `backoff_max_s=` still build one: `max_attempts`,
    `initial_interval`, `max_interval`). A call's own budget
    (`Scheduler.submit(max_retries=)`, `BatchedChatModel(max_retries=)`) wins
    when it sets one; see `Scheduler.submit`.

    Example:
        ```python
        from langgraph_batch.scheduler import BatchPolicy, RetryPolicy, Scheduler

        policy = BatchPolicy(inflight_limit=128, priority="las", retry=RetryPolicy(max_attempts=4))
        scheduler = Scheduler(backend, policy=policy, name="main")
        ```

    Raises:
        ValueError: a field is out of range (the message names it).
    """

    inflight_limit: int = 64
    """The base limit: without engine metrics, the limit (and its ceiling);
    with them, the starting limit unless `initial_inflight` is set."""
    min_inflight: int = 1
    """Floor the adaptive limit never shrinks below."""
    inflight_cap: int | None = None
    """Hard cap: never more requests on the wire than this (None: 4 x
    `inflight_limit`). The limit grows towards it only on engine metrics."""
    initial_inflight: int | None = None
    """With engine metrics: the limit at start, between `min_inflight` and the
    hard cap (None: `inflight_limit`). Ignored without metrics."""
    adaptive: bool = True
    """Adapt the limit. False: exactly `inflight_limit` slots, always."""
    slow_start: bool = True
    """With engine metrics: double the limit per sample while the engine has no
    queue and we are limit-bound, until the first 429/503/preemption; then grow
    by `increase_step` (AIMD). False: always `increase_step`."""
    increase_step: float = 4.0
    """Slots added per metrics sample that shows the server has no queue while
    we are limit-bound (after slow start)."""
    kv_tokens_per_request: int | None = CONTEXT_TOKENS_PRIOR
    """With engine metrics: KV-cache tokens one request is expected to hold
    (default: the library's one prior, `CONTEXT_TOKENS_PRIOR`, 4096). The first
    sample reporting `kv_capacity_tokens` raises the starting limit to capacity /
    this (clamped to the hard cap) during slow start (None: off)."""
    kv_offload_tokens: int | None = None
    """The server's second KV tier in host memory, in tokens (vLLM's
    `--kv-offloading-size`), for a server whose metrics do not tell it (vLLM
    states the GiB, but the bytes of a token only when started with
    `--kv-cache-memory-bytes`). With a tier, fan_out pauses siblings whose
    context the tier can take first: they come back by transfer, not recompute.
    None: what the server says (no tier if it says nothing).

    !!! version-added "Added in version 0.2.0"
    """
    decrease_factor: float = 0.7
    """Multiplier applied on 429/503/preemption (0 < f < 1)."""
    adapt_cooldown_s: float = 1.0
    """At most one decrease per this many seconds (one burst of 429s = one decrease)."""
    metrics_interval_s: float = 0.5
    """How often the runner polls `backend.metrics()` (when the backend has metrics)."""
    priority: PriorityMode = "depth_first"
    """`depth_first` (more turns done goes first), `las` (least attained service
    per sibling first, Autellix) or `fifo`. FIFO among equals in every mode."""
    batch_window_s: float = 0.002
    """How long batchable requests are collected before going out together (0: off)."""
    gather_window_s: float = 0.01
    """With `depth_first`: when nothing is in flight and a conversation the server
    has seen before asks again, its request waits this long (0: off) so that the
    burst it starts (every agent of a simulation's next tick) is sent in order,
    most recently served first (their contexts are the likeliest still cached),
    instead of in the order the siblings happened to start."""
    max_batch_size: int = 64
    """Most requests in one `complete_batch` call (1: batching off)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Which failed calls are sent again, how often, how long apart (default: 3
    attempts, waits from 0.25 s doubling to 8 s, jittered; `Retry-After` honoured)."""
    timeout: float | None = None
    """Default per-request timeout, queue wait included (None: no limit)."""
    stats_window: int = 10_000
    """Latency samples kept for the percentiles in `SchedulerStats`."""
    prefix_warming: PrefixWarming = "auto"
    """Send the first request of a new shared prefix (system prompt + tools)
    alone and hold its siblings until its first token arrives: `auto` (only on
    SGLang, whose radix cache shares a prefix only after the prefill that
    computed it), `on` or `off`. See `warms_prefixes`."""
    warm_ttl_s: float = 60.0
    """A warm prefix not used for this long is warmed again (the server's
    cache may have evicted it)."""
    decode_cap: bool = True
    """With engine metrics that count generated tokens (vLLM, SGLang): hold
    agent requests in flight near the concurrency past which the engine's
    decode throughput stops growing, learned from those metrics while the run
    goes (`DecodeCap`). Long-context decode is bandwidth-bound: a larger batch
    there buys no throughput and delays every sibling. Agent requests are the
    ones that can be followed by more work (tools bound, a multi-turn
    conversation, or streamed); one-shot requests (single-turn, tool-free, not
    streamed: what `abatch` sends) are only held by the in-flight limit. Only
    with `adaptive`."""
    rate_limit: RateLimitPolicy | None = None
    """A per-minute budget of requests and tokens, shared by every scheduler on
    the same endpoint and credentials (`RateLimitPolicy`): requests wait for
    budget before they are sent, instead of drawing 429s. None: follow the
    server's rate-limit headers when it sends them (OpenAI's `x-ratelimit-*`,
    Anthropic's `anthropic-ratelimit-*`), without holding a first burst.

    !!! version-added "Added in version 0.2.0"
    """
    decode_elasticity: float = 0.25
    """How much throughput a larger decode cap must buy: a step up is taken
    only when throughput grows at least this many times as fast as
    concurrency (relative rises), 0 < e < 1. Lower favours throughput, higher
    per-request latency."""

    def __post_init__(self) -> None:
        _check_int("inflight_limit", self.inflight_limit, 1)
        _check_int("min_inflight", self.min_inflight, 1)
        if self.min_inflight > self.inflight_limit:
            raise ValueError(
                f"min_inflight={self.min_inflight} must be <= inflight_limit={self.inflight_limit}"
            )
        if self.inflight_cap is not None:
            _check_int("inflight_cap", self.inflight_cap, 1)
            if self.inflight_cap < self.inflight_limit:
                raise ValueError(
                    f"inflight_cap={self.inflight_cap} must be >= "
                    f"inflight_limit={self.inflight_limit} (or None)"
                )
        if self.initial_inflight is not None:
            _check_int("initial_inflight", self.initial_inflight, 1)
            if not self.min_inflight <= self.initial_inflight <= self.hard_cap:
                raise ValueError(
                    f"initial_inflight={self.initial_inflight} must be between "
                    f"min_inflight={self.min_inflight} and the hard cap {self.hard_cap} (or None)"
                )
        if self.kv_tokens_per_request is not None:
            _check_int("kv_tokens_per_request", self.kv_tokens_per_request, 1)
        if self.kv_offload_tokens is not None:
            _check_int("kv_offload_tokens", self.kv_offload_tokens, 1)
        if not self.increase_step > 0:
            raise ValueError(f"increase_step={self.increase_step!r} must be > 0")
        if not 0 < self.decrease_factor < 1:
            raise ValueError(f"decrease_factor={self.decrease_factor!r} must be in (0, 1)")
        if not self.adapt_cooldown_s >= 0:
            raise ValueError(f"adapt_cooldown_s={self.adapt_cooldown_s!r} must be >= 0")
        if not self.metrics_interval_s > 0:
            raise ValueError(f"metrics_interval_s={self.metrics_interval_s!r} must be > 0")
        if self.priority not in PRIORITY_MODES:
            raise ValueError(
                f"priority={self.priority!r} is not one of {', '.join(PRIORITY_MODES)}"
            )
        if not self.batch_window_s >= 0:
            raise ValueError(f"batch_window_s={self.batch_window_s!r} must be >= 0")
        if not self.gather_window_s >= 0:
            raise ValueError(f"gather_window_s={self.gather_window_s!r} must be >= 0")
        _check_int("max_batch_size", self.max_batch_size, 1)
        if not isinstance(self.retry, RetryPolicy):
            raise ValueError(f"retry={self.retry!r} must be a RetryPolicy")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"timeout={self.timeout!r} must be > 0 seconds (or None)")
        _check_int("stats_window", self.stats_window, 1)
        if self.prefix_warming not in _PREFIX_WARMING:
            raise ValueError(
                f"prefix_warming={self.prefix_warming!r} is not one of {', '.join(_PREFIX_WARMING)}"
            )
        if not self.warm_ttl_s > 0:
            raise ValueError(f"warm_ttl_s={self.warm_ttl_s!r} must be > 0")
        if self.rate_limit is not None and not isinstance(self.rate_limit, RateLimitPolicy):
            raise ValueError(f"rate_limit={self.rate_limit!r} must be a RateLimitPolicy or None")
        if not 0 < self.decode_elasticity < 1:
            raise ValueError(f"decode_elasticity={self.decode_elasticity!r} must be in (0, 1)")

    def warms_prefixes(self, flavor: str, *, hosted_prompt_cache: bool = False) -> bool:
        """Whether prefix warming is on for a backend of this flavour.

        Args:
            flavor: `BackendCapabilities.flavor` ("openai", "vllm", "sglang").
            hosted_prompt_cache: `BackendCapabilities.hosted_prompt_cache`: a
                hosted API (Anthropic, Bedrock) whose cache entry is readable
                only once the first request with it began answering.

        Returns:
            True for `on`; for `auto`, True on `sglang` and on hosted prompt
            caches (vLLM V1 shares a prefix among requests scheduled in the
            same step, so holding siblings back would only add latency there).

        Example:
            ```python
            assert BatchPolicy().warms_prefixes("sglang")
            assert not BatchPolicy().warms_prefixes("vllm")
            assert BatchPolicy().warms_prefixes("openai", hosted_prompt_cache=True)
            ```
        """
        mode = self.prefix_warming
        auto = flavor == "sglang" or hosted_prompt_cache
        return mode == "on" or (mode == "auto" and auto)

    @property
    def hard_cap(self) -> int:
        """The most slots the adaptive limit may reach."""
        if not self.adaptive:
            return self.inflight_limit
        return self.inflight_cap if self.inflight_cap is not None else 4 * self.inflight_limit

    @property
    @deprecated(_DEPRECATED_MAX_INFLIGHT)
    def max_inflight(self) -> int:
        """Deprecated: `inflight_limit`."""
        return self.inflight_limit

    @property
    @deprecated(_read_retry("max_retries"))
    def max_retries(self) -> int:
        """Deprecated: `retry.max_retries` (`retry=RetryPolicy(max_attempts=max_retries + 1)`)."""
        return self.retry.max_retries

    @property
    @deprecated(_read_retry("backoff_base_s"))
    def backoff_base_s(self) -> float:
        """Deprecated: `retry.initial_interval`."""
        return self.retry.initial_interval

    @property
    @deprecated(_read_retry("backoff_max_s"))
    def backoff_max_s(self) -> float:
        """Deprecated: `retry.max_interval`."""
        return self.retry.max_interval

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> BatchPolicy:
        """Build a policy from JSON-only configuration (Studio, the SDK).

        Args:
            config: field names to values; unknown names are an error.
                `retry` may be a dict of `RetryPolicy` fields.

        Returns:
            The policy.

        Raises:
            ValueError: an unknown field or a bad value.

        Example:
            ```python
            BatchPolicy.from_dict({"inflight_limit": 32, "retry": {"max_attempts": 5}})
            ```
        """
        known = set(cls.__dataclass_fields__) | set(_DEPRECATED)
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(
                f"unknown BatchPolicy field(s) {unknown}; known fields: {sorted(known)}"
            )
        retry = config.get("retry")
        if isinstance(retry, dict):
            retry_known = set(RetryPolicy.__dataclass_fields__) - {"retry_on"}
            if unknown := sorted(set(retry) - retry_known):
                raise ValueError(
                    f"unknown RetryPolicy field(s) {unknown}; known fields: {sorted(retry_known)}"
                )
            config = {**config, "retry": RetryPolicy(**retry)}
        if isinstance(config.get("rate_limit"), dict):
            config = {**config, "rate_limit": RateLimitPolicy(**config["rate_limit"])}
        return cls(**config)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
