"""One engine request and its status, shared by the step loop and the KV cache.

A module of its own so that `kv_cache` (which reads a request's tokens and
blocks) and `engine` (which schedules requests) both import it and neither
imports the other.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from enum import Enum

__all__ = ("Request", "RequestStatus")

_counter = itertools.count()


class RequestStatus(Enum):
    """Where a request is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


class Request:
    """One engine request: a prompt and the tokens it will generate.

    Args:
        request_id: Unique id.
        prompt_ids: Prompt token ids.
        output_ids: The tokens this request will generate (decided up front by
            the scenario; the engine reveals them one step at a time).
        arrival: Arrival time (engine clock).
        priority: Lower runs earlier (vLLM convention; used with the priority policy).
        cache_salt: Mixed into the first block hash.
    """

    __slots__ = (
        "all_ids",
        "arrival",
        "block_hashes",
        "blocks",
        "cache_salt",
        "cached_tokens",
        "finish_reason",
        "finish_time",
        "first_scheduled",
        "first_token_time",
        "listener",
        "num_computed",
        "num_output",
        "num_preemptions",
        "num_registered",
        "priority",
        "prompt_len",
        "request_id",
        "seq",
        "status",
        "target_output",
        "token_times",
    )

    def __init__(
        self,
        *,
        request_id: str,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        arrival: float = 0.0,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_len = len(prompt_ids)
        if self.prompt_len < 1:
            raise ValueError("a request needs at least one prompt token")
        self.all_ids: list[int] = [*prompt_ids, *output_ids]
        self.target_output = max(1, len(output_ids))
        if len(output_ids) < 1:
            self.all_ids.append(3)
        self.arrival = arrival
        self.priority = priority
        self.cache_salt = cache_salt
        self.seq = next(_counter)
        self.status = RequestStatus.WAITING
        self.num_computed = 0
        """Tokens whose KV is computed or taken from the cache (vLLM's
        `Request.num_computed_tokens`); 0 again after a preemption."""
        self.num_output = 0
        self.blocks: list[int] = []
        """KV block ids held, in token order (vLLM's `req_to_blocks[request_id]`)."""
        self.block_hashes: list[int] = []
        """Chained hashes of the full blocks hashed so far, kept across preemptions."""
        self.num_registered = 0
        """Leading blocks already in the prefix cache (vLLM's `num_cached_block`)."""
        self.cached_tokens: int | None = None
        self.num_preemptions = 0
        self.first_scheduled: float | None = None
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.finish_reason = "length" if len(output_ids) < 1 else "stop"
        """What the server reports when the request finishes (`stop`, `length`, ...)."""
        self.token_times: list[float] | None = None
        self.listener: Callable[[Request], None] | None = None

    @property
    def num_known_tokens(self) -> int:
        """Prompt plus tokens generated so far (vLLM's `Request.num_tokens`)."""
        return self.prompt_len + self.num_output

    @property
    def finished(self) -> bool:
        """Finished or aborted."""
        return self.status in (RequestStatus.FINISHED, RequestStatus.ABORTED)

    @property
    def queue_time(self) -> float | None:
        """Arrival to first scheduled (engine seconds)."""
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def ttft(self) -> float | None:
        """Arrival to first token (engine seconds)."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, prompt={self.prompt_len}, "
            f"out={self.num_output}/{self.target_output}, computed={self.num_computed})"
        )
