"""What the policy core queues and answers: request states, items, outcomes, plans.

`RequestStatus` is the life of one request in the core (as vLLM v1's
`RequestStatus`): NEW, QUEUED (in a priority heap), HELD (behind a warming
prefix leader), RUNNING (holding a slot), DONE or WITHDRAWN. It is an
`IntEnum`: the hot path compares it as an int.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langgraph_batch._context import SiblingInfo
    from langgraph_batch.backends.base import ChatChunk, ChatRequest, ChatResponse

__all__ = (
    "DONE",
    "HELD",
    "NEW",
    "QUEUED",
    "RUNNING",
    "WITHDRAWN",
    "Outcome",
    "Plan",
    "PolicyItem",
    "PolicyStats",
    "RequestStatus",
    "Submission",
)


class RequestStatus(enum.IntEnum):
    """Where a request is in the policy core.

    Example:
        ```python
        item = PolicyItem(turn=1)
        assert item.state is RequestStatus.NEW
        core.enqueue(item, now=0.0)          # QUEUED, or HELD behind a prefix leader
        ```
    """

    QUEUED = 0
    """Waiting in a priority heap for a slot."""
    RUNNING = 1
    """Holding a slot (dispatched alone or in a batch)."""
    DONE = 2
    """Its attempt finished; the slot is free (a retry enqueues it again)."""
    WITHDRAWN = 3
    """Its caller went away while it waited (or the core was drained)."""
    NEW = 4
    """Created, never enqueued."""
    HELD = 5
    """Waiting, out of the heaps, until its prefix is warm (prefix warming)."""


QUEUED = RequestStatus.QUEUED
RUNNING = RequestStatus.RUNNING
DONE = RequestStatus.DONE
WITHDRAWN = RequestStatus.WITHDRAWN
NEW = RequestStatus.NEW
HELD = RequestStatus.HELD


class Outcome(enum.Enum):
    """How an inference call ended, as far as slot adaptation cares.

    Example:
        ```python
        core.on_complete(item, Outcome.RATE_LIMITED, now)  # HTTP 429: shrink the limit
        ```
    """

    OK = "ok"
    """The call returned a response."""
    RATE_LIMITED = "rate_limited"
    """HTTP 429: shrink the limit."""
    OVERLOADED = "overloaded"
    """HTTP 503: shrink the limit."""
    ERROR = "error"
    """Any other failure (no effect on the limit)."""
    CANCELLED = "cancelled"
    """The caller went away (no effect on the limit)."""


class PolicyItem:
    """One queued request as the policy sees it (the runner hangs its future on it).

    Example:
        ```python
        item = PolicyItem(turn=3, sibling_id="run1/7")
        core.enqueue(item, now=0.0)
        ```
    """

    __slots__ = (
        "batchable",
        "conversation",
        "dispatched_at",
        "enqueued_at",
        "entry",
        "future",
        "group",
        "held_at",
        "in_batch",
        "leading",
        "left",
        "payload",
        "prefix",
        "queued_s",
        "recency",
        "seq",
        "sibling_id",
        "state",
        "turn",
    )

    def __init__(
        self,
        *,
        turn: int = 0,
        sibling_id: Hashable | None = None,
        group: str | None = None,
        batchable: bool = False,
        payload: Any = None,
        prefix: Hashable | None = None,
        left: Callable[[], int] | None = None,
        conversation: Hashable | None = None,
    ) -> None:
        self.turn = turn
        """Turns (LLM calls) the caller has completed; more goes first in depth_first."""
        self.sibling_id = sibling_id
        """The sibling (program) this request belongs to, when known."""
        self.group = group
        """The fan_out run of the sibling, when known."""
        self.batchable = batchable
        """May go out in one `complete_batch` call with others."""
        self.payload = payload
        """Whatever the runner attaches (its `Submission`: the request and how to run it)."""
        self.prefix = prefix
        """Key of the shared prompt prefix (None: no prefix warming for this item)."""
        self.left = left
        """How many siblings of its fan_out run are not finished (read when the
        decode cap is applied; None: not in a fan_out run)."""
        self.conversation = conversation
        """The conversation it continues (`backends.base.conversation_key`), when known."""
        self.recency = 0
        """When that conversation last had a call complete (set at enqueue; 0: never)."""
        self.leading = False
        """This item is warming its prefix (the runner reports its first token)."""
        self.held_at = 0.0
        self.seq = -1
        self.state = RequestStatus.NEW
        self.entry: tuple[float, int, PolicyItem] | None = None
        self.enqueued_at = 0.0
        self.dispatched_at = 0.0
        self.queued_s = 0.0
        """Total time spent queued over all attempts."""
        self.in_batch = False
        self.future: Any = None

    def __repr__(self) -> str:
        return (
            f"PolicyItem(seq={self.seq}, turn={self.turn}, sibling_id={self.sibling_id!r}, "
            f"state={self.state.name})"
        )


@dataclass(slots=True)
class Plan:
    """What to do now: the answer of `Planner.plan(now)`.

    Example:
        ```python
        plan = core.plan(now)
        for item in plan.dispatch: ...      # each runs alone, one slot each
        for batch in plan.batches: ...      # each goes out as one complete_batch
        if plan.wake_at is not None: ...    # ask again at this time at the latest
        ```
    """

    dispatch: list[PolicyItem] = field(default_factory=list)
    """Items granted a slot, to run one by one, best first."""
    batches: list[list[PolicyItem]] = field(default_factory=list)
    """Groups of batchable items, each to go out in one call (one slot per member)."""
    wake_at: float | None = None
    """When an open batch window closes (None: nothing is waiting on the clock)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyStats:
    """The policy core's counters at one moment: `Planner.stats()`.

    One snapshot instead of a property per counter, as vLLM's
    `Scheduler.make_stats()` returns one `SchedulerStats`.
    """

    queued: int
    """Items waiting for a slot, held ones included."""
    ready: int
    """Items waiting for a slot that `plan` may grant (held ones excluded)."""
    held: int
    """Items held until their prefix is warm."""
    in_flight: int
    """Slots held."""
    limit: int
    """The adaptive in-flight limit."""
    limit_exact: float
    """The adaptive limit before rounding down."""
    slow_start: bool
    """Whether the limit still doubles per sample (no overload seen yet)."""
    increases: int
    """Times the limit grew on engine metrics."""
    decreases: int
    """Times the limit shrank (429/503/preemptions)."""
    decode_limit: int | None
    """The decode cap on agent requests in flight (None: not capping)."""
    warmups: int
    """Leaders dispatched (prefix warm-ups started)."""
    held_total: int
    """Items that were held behind a warming leader."""
    held_s: float
    """Seconds items spent held behind leaders, summed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Submission:
    """One `Scheduler.submit` call as its item carries it (`PolicyItem.payload`).

    The request and the caller's terms travel together, so the runner hands
    `RequestAttempts.run_item` one item, and a batch reads its members' requests
    from their items.
    """

    request: ChatRequest
    """The call, with its route key, turn and engine priority set."""
    timeout: float | None
    """Seconds for queue wait + call + retries (None: no limit)."""
    max_retries: int
    """Retries of this call's retryable errors."""
    sibling: SiblingInfo | None = None
    """The calling sibling (for logs)."""
    on_chunk: Callable[[ChatChunk], None] | None = None
    """Called with every streamed delta."""
    check: Callable[[ChatResponse], None] | None = None
    """Called with each response; a retryable error it raises is retried."""
