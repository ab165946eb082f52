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

from langgraph_batch._context import SiblingInfo, sibling_scope
from langgraph_batch.distributed._serde import Serde, validate_input
from langgraph_batch.distributed.worker import load_graph
from langgraph_batch.errors import DistributedError, InputValidationError
from langgraph_batch.nodes import SiblingAdmission, SiblingError
from langgraph_batch.tools import forget_run

__all__ = ("STARTED", "Ledger", "NodeRunner")

logger = logging.getLogger(__name__)

STARTED = b""
"""The first item a sibling's stream yields: the node runner took it (a result is never empty)."""

_MAX_TRACEBACK = 8192


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
    ) -> None:
        self.graph_path = graph
        self.graph = load_graph(graph, app_dir=app_dir)
        self.serde = Serde.for_graph(self.graph, extra=allowed_types, max_bytes=max_payload_bytes)
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
        try:
            value = self.serde.loads(payload, what="input")
            problems = validate_input(self.graph, value)
            if problems:
                raise InputValidationError(
                    f"sibling {index}: the input does not fit {self.graph_path}: "
                    + "; ".join(problems),
                    problems=problems,
                )
            # The group is unique to one executor run: coalesced tools share
            # within it on this node and never across runs.
            info = SiblingInfo(
                group=group, index=index, total=total, admission=self.admission, run_id=group
            )
            meta = {"lgb_sibling_group": group, "lgb_sibling_index": index}
            config: Any = {
                "configurable": {"thread_id": f"lgb-{group}-{index}", **meta},
                "metadata": meta,
            }
            with sibling_scope(info):
                await self.admission.acquire(info, returning=False)
                try:
                    final = await self.graph.ainvoke(value, config)
                finally:
                    self.admission.finish(info)
            try:
                return self.serde.dumps({"k": "ok", "v": final}, what="result")
            except (DistributedError, TypeError) as exc:
                return self._error_payload(exc, index)
        except Exception as exc:
            logger.debug("ray node runner: sibling %s of run %s failed", index, group)
            return self._error_payload(exc, index)

    def _error_payload(self, exc: BaseException, index: int) -> bytes:
        record = SiblingError.from_exception(exc, index=index, item=None).to_dict()
        if record.get("traceback") and len(record["traceback"]) > _MAX_TRACEBACK:
            record["traceback"] = "...\n" + record["traceback"][-_MAX_TRACEBACK:]
        try:
            return self.serde.dumps({"k": "error", "v": record}, what="result")
        except (DistributedError, TypeError):
            record = {**record, "traceback": None, "message": record["message"][:1000]}
            return self.serde.dumps({"k": "error", "v": record}, what="result")


class Ledger:
    """Outcomes of checkpointed runs, by attach key (the body of a detached actor)."""

    def __init__(self) -> None:
        self._runs: dict[str, tuple[str, float, dict[int, bytes]]] = {}

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
