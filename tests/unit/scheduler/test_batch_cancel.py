"""A batched call is aborted when every member's caller is cancelled (issue 24, part 2).

A batch is one HTTP request; vLLM aborts it (all members) when the client
disconnects. Found on the real engine: a cancelled non-streaming call that
went out as a batch (even a batch of one) kept generating on the engine until
`max_tokens`. Now the batch task is cancelled (its connection closed) once no
member waits for it; while one still does, the call runs on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from langgraph_batch.backends.base import ChatRequest, ChatResponse
from langgraph_batch.scheduler import BatchPolicy, Scheduler
from tests.fakes.backends import BatchBackend, request


class AbortableBatches(BatchBackend):
    """Records batch calls cancelled while in flight (the HTTP request aborted)."""

    def __init__(self) -> None:
        super().__init__()
        self.aborted: list[list[str]] = []

    async def complete_batch(self, requests: Sequence[ChatRequest]) -> list[ChatResponse]:
        try:
            return await super().complete_batch(requests)
        except asyncio.CancelledError:
            self.aborted.append([r.request_id for r in requests])
            self.changed.set()
            raise


async def started(backend: AbortableBatches, n: int) -> None:
    while len(backend.batches) < n:
        backend.changed.clear()
        await backend.changed.wait()


async def aborted(backend: AbortableBatches) -> None:
    while not backend.aborted:
        backend.changed.clear()
        await backend.changed.wait()


async def test_cancelling_every_member_aborts_the_batched_call() -> None:
    backend = AbortableBatches()
    policy = BatchPolicy(batch_window_s=0.01, max_batch_size=8)
    async with Scheduler(backend, policy=policy) as s:
        tasks = [asyncio.create_task(s.submit(request(f"b{i}", batchable=True))) for i in range(3)]
        await started(backend, 1)
        assert backend.batches == [["b0", "b1", "b2"]]
        for task in tasks[:2]:
            task.cancel()
        await asyncio.gather(*tasks[:2], return_exceptions=True)
        await asyncio.sleep(0)
        assert backend.aborted == []  # b2 still waits: the call runs on
        tasks[2].cancel()
        await asyncio.gather(tasks[2], return_exceptions=True)
        await asyncio.wait_for(aborted(backend), 5)
        assert backend.aborted == [["b0", "b1", "b2"]]
        st = s.stats()
        assert (st.in_flight, st.queued, st.cancelled) == (0, 0, 3)
        # The scheduler goes on: the slots came back.
        backend.gate.set()
        assert (await s.submit(request("next", batchable=True))).request_id == "next"


async def test_a_batch_of_one_is_aborted_with_its_caller() -> None:
    backend = AbortableBatches()
    async with Scheduler(backend, policy=BatchPolicy(batch_window_s=0.001)) as s:
        task = asyncio.create_task(s.submit(request("only", batchable=True)))
        await started(backend, 1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.wait_for(aborted(backend), 5)
        assert backend.aborted == [["only"]]
        assert s.stats().in_flight == 0


async def test_a_member_left_alone_still_gets_its_answer() -> None:
    backend = AbortableBatches()
    policy = BatchPolicy(batch_window_s=0.01, max_batch_size=8)
    async with Scheduler(backend, policy=policy) as s:
        tasks = [asyncio.create_task(s.submit(request(f"b{i}", batchable=True))) for i in range(2)]
        await started(backend, 1)
        tasks[0].cancel()
        await asyncio.gather(tasks[0], return_exceptions=True)
        backend.gate.set()
        assert (await tasks[1]).request_id == "b1"
    assert backend.aborted == []
