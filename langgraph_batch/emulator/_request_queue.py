"""The engine's waiting queue, by scheduling policy, as vLLM's `request_queue.py`.

vLLM v1 keeps waiting requests in `create_request_queue(policy)`: a FIFO
deque for `fcfs` and a heap ordered by `(priority, arrival)` for `priority`
(`vllm/v1/core/sched/request_queue.py`). A preempted request goes back to
the front of the FIFO queue (`prepend_request`); under `priority` it simply
re-enters the heap with its own key. An aborted request is not searched for:
it stays in the structure and is dropped lazily when it reaches the head,
while `len()` counts only requests still waiting.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Literal

from langgraph_batch.emulator.request import Request, RequestStatus

__all__ = ("WaitingQueue",)


class WaitingQueue:
    """Requests waiting for the scheduler, in the order the policy takes them.

    Example:
        ```python
        q = WaitingQueue("fcfs")
        assert q.peek() is None and len(q) == 0
        ```
    """

    __slots__ = ("_count", "_fcfs", "_heap", "policy")

    def __init__(self, policy: Literal["fcfs", "priority"]) -> None:
        self.policy = policy
        self._fcfs: deque[Request] = deque()
        self._heap: list[tuple[int, float, int, Request]] = []
        self._count = 0

    def __len__(self) -> int:
        """Requests still waiting (aborted ones excluded)."""
        return self._count

    def push(self, req: Request, *, front: bool = False) -> None:
        """Queue `req` (marked WAITING); `front` puts a preempted one first under fcfs."""
        req.status = RequestStatus.WAITING
        self._count += 1
        if self.policy == "priority":
            heapq.heappush(self._heap, (req.priority, req.arrival, req.seq, req))
        elif front:
            self._fcfs.appendleft(req)
        else:
            self._fcfs.append(req)

    def peek(self) -> Request | None:
        """The next request to admit, dropping aborted ones from the head."""
        if self.policy == "priority":
            heap = self._heap
            while heap and heap[0][3].status is not RequestStatus.WAITING:
                heapq.heappop(heap)
            return heap[0][3] if heap else None
        q = self._fcfs
        while q and q[0].status is not RequestStatus.WAITING:
            q.popleft()
        return q[0] if q else None

    def pop(self) -> None:
        """Remove the request `peek` returned (it was admitted)."""
        if self.policy == "priority":
            heapq.heappop(self._heap)
        else:
            self._fcfs.popleft()
        self._count -= 1

    def withdraw(self) -> None:
        """Uncount one waiting request that was aborted (it leaves lazily)."""
        self._count -= 1
