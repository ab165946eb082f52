"""Sibling identity, carried from `fan_out` to every LLM and tool call inside a sibling.

`fan_out` runs each sibling inside `sibling_scope(info)`; the context variable
is copied into every LangGraph task the sibling's subgraph spawns (LangGraph
runs each task in `copy_context()`), so `current_sibling()` answers inside
`BatchedChatModel._agenerate` and inside tools, sync or async.

Outside a fan_out (a plain `Send` map-reduce), `current_sibling()` is None and
the scheduler derives the caller's turn from the conversation instead. Its
session (the replica a router keeps it on) then comes from LangGraph's
`Runtime.execution_info` where there is one (`task_route_key`): a model node
inside a subgraph that a task runs (`Send("agent", ...)` to a compiled agent)
has a checkpoint namespace `agent:<task id>|model:<id>` whose leading part
stays the same on every turn of that agent and differs between agents, even
when their opening messages are equal. A model node of the top-level graph
gets a new task id each turn: there the conversation's opening messages name
the session, as before.

The admission protocol: a sibling holds an ACTIVE place while it runs model
nodes. Entering a tool releases the place (`tool_enter`), leaving the tool
re-acquires it with preference over fresh siblings (`tool_exit`). The
`Admission` object is owned by the fan_out run; the tool hooks only call
`SiblingInfo.tool_enter()` / `tool_exit()`.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

__all__ = (
    "Admission",
    "SiblingInfo",
    "current_sibling",
    "sibling_scope",
    "task_route_key",
)


class Admission(Protocol):
    """Gate on ACTIVE siblings, owned by one fan_out run."""

    async def acquire(self, sibling: SiblingInfo, *, returning: bool) -> None:
        """Wait for an active place; `returning` siblings (back from a tool) go first."""

    def release(self, sibling: SiblingInfo) -> None:
        """Give the place back (sibling finished, failed, or entered a tool)."""

    def context_changed(self, sibling: SiblingInfo) -> None:
        """`sibling.context_tokens` moved (a call completed): its booking follows."""


@dataclass(slots=True, kw_only=True, eq=False)
class SiblingInfo:
    """One running sibling of a fan_out. Mutable: turn and tool counters move."""

    group: str
    """The fan_out run this sibling belongs to (stable across a resume when checkpointed)."""
    index: int
    """Position of the sibling's item in the input list."""
    total: int = 0
    """How many siblings the run has."""
    turn: int = 0
    """LLM calls this sibling has completed (BatchedChatModel increments it)."""
    tools_active: int = 0
    """Tool calls of this sibling running now."""
    context_tokens: int = 0
    """The sibling's own KV working set now: prompt plus completion tokens of its
    last completed LLM call, less `shared_tokens`. BatchedChatModel records it
    (`record_context`, which tells the admission gate)."""
    shared_tokens: int = 0
    """Prompt tokens of the sibling's first call that the server already had
    cached: the prefix it shares with its siblings (KV held once, not per sibling)."""
    tool_name: str | None = None
    """The tool this sibling runs now, or ran last (its latencies are learned per tool)."""
    admission: Admission | None = None
    run_id: str | None = None
    """Unique to one fan_out invocation (a resumed run gets a new one): what coalesced
    tools share within. None: `group` is used."""
    left: Callable[[], int] | None = None
    """How many siblings of the run have not finished yet (the run's counter,
    shared by its siblings). None: unknown (the sibling runs outside a fan_out)."""
    expected_wait: Callable[[str | None], float | None] | None = None
    """The run's learned wait for a call of a tool, by name (`ContextForecast.
    expected_wait`). None: the sibling runs outside a fan_out."""
    attempt: str = field(default_factory=lambda: secrets.token_hex(8))
    """Unique to this execution of the sibling: a sibling run again (its worker or
    node died) is a new attempt (`at_most_once` tools tell the two apart)."""
    calls_seen: dict[str, int] = field(default_factory=dict)
    """How often this attempt made each `at_most_once` call so far (by call key)."""

    def retention_hint(self) -> float | None:
        """Seconds this sibling's KV should be kept after its next call (None: unknown).

        The learned wait of the tool it called last (agents tend to call the
        same tools again), sent to a serving stack that takes a retention hint.
        """
        predict = self.expected_wait
        return predict(self.tool_name) if predict is not None else None

    def record_context(self, tokens: int) -> None:
        """Set `context_tokens` after a completed call, and tell the admission gate."""
        self.context_tokens = tokens
        if self.admission is not None:
            self.admission.context_changed(self)

    @property
    def siblings_left(self) -> int:
        """Siblings of this run not finished yet, this one included (0: unknown).

        The scheduler rounds its decode cap up so that what is left of a run
        runs in equal waves, never in a small last one.
        """
        left = self.left
        return left() if left is not None else 0

    @property
    def sibling_id(self) -> str:
        """`<group>/<index>`: unique within the process."""
        return f"{self.group}/{self.index}"

    @property
    def in_tool(self) -> bool:
        """True while any tool call of this sibling runs."""
        return self.tools_active > 0

    async def tool_enter(self, name: str | None = None) -> None:
        """Mark the sibling as inside a tool; release its active place on the first one.

        Args:
            name: the tool's name (its latencies are learned per tool).
        """
        self.tools_active += 1
        if self.tools_active == 1:
            self.tool_name = name
            if self.admission is not None:
                self.admission.release(self)

    async def tool_exit(self) -> None:
        """Leave a tool; on the last one, wait to become active again (preferred)."""
        self.tools_active -= 1
        if self.tools_active == 0 and self.admission is not None:
            await self.admission.acquire(self, returning=True)

    def tool_abandon(self) -> None:
        """Leave a tool that was cancelled: no waiting for a place (the sibling is ending)."""
        self.tools_active = max(0, self.tools_active - 1)


_SIBLING: ContextVar[SiblingInfo | None] = ContextVar("langgraph_batch_sibling", default=None)


def current_sibling() -> SiblingInfo | None:
    """The sibling the calling code runs in, or None outside a fan_out."""
    return _SIBLING.get()


@contextlib.contextmanager
def sibling_scope(info: SiblingInfo) -> Iterator[SiblingInfo]:
    """Run the body as sibling `info` (sets the context variable, then restores it)."""
    token = _SIBLING.set(info)
    try:
        yield info
    finally:
        _SIBLING.reset(token)


def task_route_key() -> str | None:
    """`"task:<hash>"` of the enclosing LangGraph task, or None (see the module doc).

    The hash (BLAKE2b, 96 bits) covers the thread id and every checkpoint
    namespace segment but the model node's own: the agent run that makes this
    call. None outside a LangGraph run, without `execution_info`, or when the
    model node is not inside a subgraph (a single namespace segment).
    """
    try:
        from langgraph.runtime import get_runtime

        info = get_runtime().execution_info
    except (ImportError, RuntimeError, KeyError, AttributeError):
        return None
    if info is None or not info.checkpoint_ns:
        return None
    segments = info.checkpoint_ns.split("|")
    if len(segments) < 2:
        return None
    owner = "|".join(segments[:-1])
    digest = hashlib.blake2b(f"{info.thread_id or ''}\x00{owner}".encode(), digest_size=12)
    return f"task:{digest.hexdigest()}"
