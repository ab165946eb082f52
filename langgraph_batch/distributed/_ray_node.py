"""What runs inside the Ray cluster for `RayExecutor`: one node runner per node, one ledger.

`NodeRunner` is the body of an async Ray actor placed on one node (hard node
affinity). It imports the sibling graph by its import path, exactly as
`langgraph-batch worker` does (no code travels; inputs and results are the
strict `Serde` payloads the Redis mode sends), and runs many siblings at once
in its one event loop (`run_many`: a run's siblings on this node, in one
streaming call; `run_sibling`: one sibling, for re-runs). Every sibling of
that node therefore shares this process's scheduler (one per backend
endpoint set, from the process registry) and its admission gate: the node's
siblings are batched together and their KV is booked where they run.

`Ledger` is the body of one detached actor per namespace that keeps the
outcomes of checkpointed runs (keyed like the Redis mode's attach key), so a
parent that died and runs its thread again collects the finished siblings
instead of running them again. It keeps bytes only and expires entries.
It also records the calls of `at_most_once` tools for every node
(`RayOnceStore`, the store each node runner installs): a sibling placed again
after its node died finds the calls it made there.

Neither class imports ray: `langgraph_batch.distributed.ray` wraps them with
`ray.remote` when an executor first runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from langgraph_batch.distributed._serde import Serde
from langgraph_batch.distributed._sibling import invoke_sibling
from langgraph_batch.distributed.worker import load_graph
from langgraph_batch.nodes import SiblingAdmission, check_gate_options
from langgraph_batch.tools import MemoryOnceStore, OnceStore, forget_run, set_once_store

__all__ = ("ONCE_TTL_S", "STARTED", "Ledger", "NodeRunner", "RayOnceStore")

logger = logging.getLogger(__name__)

STARTED = b""
"""The first item a sibling's stream yields: the node runner took it (a result is never empty)."""

ONCE_TTL_S = 24 * 3600.0
"""How long the ledger keeps a run's `at_most_once` calls after their last use."""


class NodeRunner:
    """Runs the siblings a `RayExecutor` places on one node (the body of an async actor)."""

    def __init__(
        self,
        graph: str,
        *,
        max_active: int | None,
        max_payload_bytes: int,
        allowed_types: Iterable[type | tuple[str, str]],
        app_dir: str | None,
        once_store: OnceStore | None = None,
    ) -> None:
        if once_store is not None:
            set_once_store(once_store)  # this actor's process serves only this executor
        self.graph_path = graph
        self.graph = load_graph(graph, app_dir=app_dir)
        self.serde = Serde.for_graph(self.graph, extra=allowed_types, max_bytes=max_payload_bytes)
        check_gate_options(max_active=max_active)
        self.admission = SiblingAdmission(max_active=max_active)
        self._running = 0
        self._slots: asyncio.Semaphore | None = None
        self._runs: dict[str, set[asyncio.Task[None]]] = {}

    def ping(self) -> int:
        """The actor's process id (the tests kill it by this)."""
        return os.getpid()

    def running(self) -> int:
        """Siblings running here now (0 once every run it served ended or was cancelled)."""
        return self._running

    def forget(self, group: str) -> None:
        """Drop what coalesced tools kept for the run `group` in this process."""
        forget_run(group)

    async def run_many(
        self, group: str, total: int, concurrency: int, items: list[tuple[int, bytes]]
    ) -> AsyncIterator[list[tuple[int, bytes]]]:
        """Run a run's siblings placed here; yield batches of `(index, STARTED or outcome)`.

        One call per node and run: each streamed item carries every notice that
        came since the last one, so a busy node sends few items. At most
        `concurrency` siblings of all runs run here at once (the first call sets it).
        """
        if self._slots is None:
            self._slots = asyncio.Semaphore(concurrency)
        slots = self._slots
        queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()

        async def one(index: int, payload: bytes) -> None:
            async with slots:
                self._running += 1
                try:
                    queue.put_nowait((index, STARTED))
                    queue.put_nowait((index, await self._invoke(group, index, total, payload)))
                finally:
                    self._running -= 1

        tasks = [asyncio.create_task(one(i, p)) for i, p in items]
        self._runs.setdefault(group, set()).update(tasks)
        left = len(items)
        try:
            while left:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                left -= sum(1 for _, data in batch if data != STARTED)
                yield batch
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._runs.get(group, set()).difference_update(tasks)

    async def cancel_run(self, group: str) -> None:
        """Cancel every sibling of the run `group` running here (its parent was cancelled).

        Cancelling a streaming call does not close the generator behind it, so
        the parent says so explicitly.
        """
        tasks = self._runs.pop(group, set())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def run_sibling(
        self, group: str, index: int, total: int, payload: bytes
    ) -> AsyncIterator[bytes]:
        """Yield `STARTED`, then the sibling's encoded outcome record (`{"k", "v"}`)."""
        self._running += 1
        try:
            yield STARTED
            yield await self._invoke(group, index, total, payload)
        finally:
            self._running -= 1

    async def _invoke(self, group: str, index: int, total: int, payload: bytes) -> bytes:
        # The group is unique to one executor run: coalesced tools share within it on
        # this node and never across runs.
        return await invoke_sibling(
            graph=self.graph,
            graph_path=self.graph_path,
            serde=self.serde,
            admission=self.admission,
            group=group,
            index=index,
            total=total,
            payload=payload,
            host="ray node runner",
        )


class RayOnceStore:
    """An `OnceStore` on the namespace's ledger actor, for every node of the cluster.

    Args:
        ledger: The ledger actor's handle (it pickles into the node runners).
    """

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger

    def __repr__(self) -> str:
        return "RayOnceStore()"

    async def claim(self, run: str, key: str, attempt: str) -> tuple[str, str | None]:
        state, record = await self.ledger.once_claim.remote(run, key, attempt)
        return str(state), record

    async def settle(self, run: str, key: str, record: str) -> None:
        await self.ledger.once_settle.remote(run, key, record)

    def forget(self, run: str) -> None:
        self.ledger.once_forget.remote(run)  # fire and forget: records also expire


class Ledger:
    """Outcomes of checkpointed runs, by attach key (the body of a detached actor)."""

    def __init__(self) -> None:
        self._runs: dict[str, tuple[str, float, dict[int, bytes]]] = {}
        self._once: dict[str, tuple[float, MemoryOnceStore]] = {}

    def _once_run(self, run: str) -> MemoryOnceStore:
        now = time.time()
        for key in [k for k, (exp, _) in self._once.items() if exp < now]:
            del self._once[key]
        store = self._once.get(run, (0.0, None))[1] or MemoryOnceStore(max_runs=1)
        self._once[run] = (now + ONCE_TTL_S, store)
        return store

    def once_claim(self, run: str, key: str, attempt: str) -> tuple[str, str | None]:
        """`OnceStore.claim` for every node (the actor runs one call at a time)."""
        return self._once_run(run).take(run, key, attempt)

    def once_settle(self, run: str, key: str, record: str) -> None:
        """`OnceStore.settle` for every node."""
        self._once_run(run).keep(run, key, record)

    def once_forget(self, run: str) -> None:
        """`OnceStore.forget`: the run ended."""
        self._once.pop(run, None)

    def _expire(self) -> None:
        now = time.time()
        for key in [k for k, (_, exp, _) in self._runs.items() if exp < now]:
            del self._runs[key]

    def open(self, key: str, digest: str, ttl_s: float) -> dict[int, bytes]:
        """The outcomes kept for `key` when they are of the same inputs (`digest`), else none."""
        self._expire()
        found = self._runs.get(key)
        if found is None or found[0] != digest:
            self._runs[key] = (digest, time.time() + ttl_s, {})
            return {}
        self._runs[key] = (digest, time.time() + ttl_s, found[2])
        return dict(found[2])

    def put(self, key: str, digest: str, index: int, payload: bytes) -> None:
        """Keep one sibling's outcome (the first one kept wins)."""
        found = self._runs.get(key)
        if found is not None and found[0] == digest:
            found[2].setdefault(index, payload)

    def drop(self, key: str) -> None:
        """Forget a run (it finished: the checkpoint holds its results)."""
        self._runs.pop(key, None)
