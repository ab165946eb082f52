"""The parent's side of one `RayExecutor` run: placement, deliveries, the event stream.

`RayRun` places every sibling on a node (`place`: rendezvous hashing with a
bounded load, or the node the user names), sends each node its siblings in
one streaming call to that node's runner, and turns what comes back into
`RemoteEvent`s. A runner or node that dies is found here (`_RAY_ERRORS`); its
unfinished siblings go on one call each (placed again when the node died);
see `langgraph_batch.distributed.ray` for the contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

from langchain_core.runnables import RunnableConfig

from langgraph_batch._extras import missing_extra
from langgraph_batch.distributed._keys import attach_key_of, new_run_id, sibling_group
from langgraph_batch.distributed._ray_node import STARTED
from langgraph_batch.distributed._serde import Serde
from langgraph_batch.distributed.executor import _digest, _error
from langgraph_batch.errors import DeadLetteredError, DistributedError, DistributedTimeoutError
from langgraph_batch.nodes import RemoteEvent

__all__ = ("RayRun", "place")

logger = logging.getLogger("langgraph_batch.distributed.ray")

_CLEANUP_TIMEOUT_S = 5.0
_MAX_REFUSED = 20
_RAY_ERRORS: tuple[type[BaseException], ...] = ()
"""A runner or its node died (set by `_ray()`, once Ray is imported)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise missing_extra("ray", "fan_out(executor=RayExecutor(...)) needs Ray") from None
    from ray.exceptions import (
        ActorDiedError,
        ActorUnavailableError,
        ActorUnschedulableError,
        RayActorError,
    )

    global _RAY_ERRORS
    # ActorUnschedulableError: a runner pinned to a node that died before it started.
    _RAY_ERRORS = (ActorDiedError, ActorUnavailableError, ActorUnschedulableError, RayActorError)
    return ray


def _rank(key: str, node: str) -> bytes:
    return hashlib.sha256(f"{key}|{node}".encode()).digest()


def place(keys: Sequence[str], nodes: Sequence[str]) -> list[str]:
    """Assign each key a node: rendezvous hashing with a bounded load.

    Each key goes to the first node of its own stable ranking of `nodes` that
    holds fewer than `ceil(len(keys) / len(nodes))` keys, so the assignment
    depends only on the keys and the node set, and a node leaving moves
    mostly its own keys.

    Example:
        ```python
        place(["0", "1", "2", "3"], ["node-a", "node-b"])  # two keys per node
        ```

    Raises:
        ValueError: `nodes` is empty.
    """
    if not nodes:
        raise ValueError("no live node to place siblings on")
    cap = math.ceil(len(keys) / len(nodes))
    load = dict.fromkeys(nodes, 0)
    out: list[str] = []
    for key in keys:
        for node in sorted(nodes, key=lambda n: _rank(key, n), reverse=True):
            if load[node] < cap:
                load[node] += 1
                out.append(node)
                break
    return out


class _Executor(Protocol):
    """What a run reads of its `RayExecutor`."""

    graph: str
    node_for: Callable[[int, Any], str | None] | None
    key: Callable[[int, Any], str] | None
    max_deliveries: int
    concurrency: int
    timeout: float | None
    ttl_s: float
    _secret: bytes | None

    def live_nodes(self, *, fresh: bool = False) -> dict[str, str]: ...

    def proven_runner(self, node_id: str) -> Any | None: ...

    def prove_runner(self, node_id: str, handle: Any) -> None: ...

    def runner(self, node_id: str) -> Any: ...

    def forget_runner(self, node_id: str, handle: Any) -> None: ...

    def ledger(self) -> Any: ...


def _outcome(serde: Serde, index: int, payload: bytes) -> RemoteEvent:
    try:
        record = serde.loads(payload, what="result")
        kind, value = record["k"], record["v"]
    except DistributedError as exc:
        return _error(exc, index)
    except (KeyError, TypeError) as exc:
        return _error(DistributedError(f"malformed result record: {exc!r}"), index)
    if kind == "ok":
        return RemoteEvent(index=index, kind="finished", value=value)
    return RemoteEvent(index=index, kind="failed", value=dict(value))


class RayRun:
    """One fan_out invocation on the cluster, from the parent's side."""

    def __init__(
        self,
        ex: _Executor,
        serde: Serde,
        payloads: dict[int, bytes],
        values: dict[int, Any],
        total: int,
        config: RunnableConfig,
    ) -> None:
        self.ex = ex
        self.serde = serde
        self.payloads = payloads
        self.values = values
        self.total = total
        self.attach = attach_key_of(ex.graph, config, ex._secret)
        self.group = sibling_group(new_run_id())
        self.digest = _digest(total, payloads)
        self.events: asyncio.Queue[RemoteEvent] = asyncio.Queue()
        self.known: set[int] = set()
        self.deliveries: dict[int, int] = dict.fromkeys(payloads, 0)
        self.runners: dict[str, asyncio.Future[Any]] = {}
        self.solo: dict[str, asyncio.Semaphore] = {}
        self.ledger: Any = None
        self.pending_puts: list[Any] = []

    async def _runner(self, node: str) -> Any:
        if node not in self.runners:
            self.runners[node] = asyncio.ensure_future(self._live_runner(node))
        return await self.runners[node]

    async def _live_runner(self, node: str) -> Any:
        # A handle may name an actor that just died (its name is freed a moment
        # later): asking it once proves it is alive before siblings are charged.
        proven = self.ex.proven_runner(node)
        if proven is not None:
            return proven
        handle = await asyncio.to_thread(self.ex.runner, node)
        try:
            await handle.ping.remote()
        except Exception:
            self.ex.forget_runner(node, handle)
            raise
        self.ex.prove_runner(node, handle)
        return handle

    async def _placement(self, indices: Sequence[int]) -> dict[int, str]:
        nodes = await asyncio.to_thread(self.ex.live_nodes)
        by_ip: dict[str, str] = {}
        for node_id, ip in sorted(nodes.items()):
            by_ip.setdefault(ip, node_id)
        chosen: dict[int, str] = {}
        hashed: list[int] = []
        for index in indices:
            wanted = (
                None if self.ex.node_for is None else self.ex.node_for(index, self.values[index])
            )
            if wanted in nodes:
                chosen[index] = wanted
            elif wanted is not None and wanted in by_ip:
                chosen[index] = by_ip[wanted]
            else:
                hashed.append(index)
        keyf = self.ex.key or (lambda i, _v: str(i))
        keys = [keyf(i, self.values[i]) for i in hashed]
        chosen.update(zip(hashed, place(keys, sorted(nodes)), strict=True))
        return chosen

    def _record(self, event: RemoteEvent, payload: bytes | None) -> None:
        if event.index in self.known:
            return
        if event.kind != "started":
            self.known.add(event.index)
            if payload is not None and self.ledger is not None and self.attach is not None:
                self.pending_puts.append(
                    self.ledger.put.remote(self.attach, self.digest, event.index, payload)
                )
        self.events.put_nowait(event)

    async def _sibling(self, index: int, node: str) -> None:
        """Run one sibling until it has an outcome, placing it again when its node or actor dies."""
        ray = _ray()
        started = False
        while True:
            self.deliveries[index] += 1
            alone = self.deliveries[index] > 1
            gate = self.solo.setdefault(node, asyncio.Semaphore(1)) if alone else None
            handle = None
            try:
                # The handle is taken inside the gate: a sibling waiting its turn
                # must not hold a runner that the one before it may kill.
                async with gate or contextlib.nullcontext():
                    handle, node = await self._handle(index, node)
                    stream = handle.run_sibling.options(num_returns="streaming").remote(
                        self.group, index, self.total, self.payloads[index]
                    )
                    try:
                        async for ref in stream:
                            data = await ref
                            if data != STARTED:
                                self._record(_outcome(self.serde, index, data), data)
                                return
                            if not started:
                                started = True
                                self._record(RemoteEvent(index=index, kind="started"), None)
                    except asyncio.CancelledError:
                        with contextlib.suppress(Exception):
                            ray.cancel(stream)
                        raise
                raise DistributedError("the node runner ended a sibling without an outcome")
            except _RAY_ERRORS as exc:
                moved = await self._lost_runner(index, node, exc, "actor", handle)
                if moved != node:
                    self.deliveries[index] -= 1  # its node died: not this sibling's doing
                    node = moved
                elif self.deliveries[index] >= self.ex.max_deliveries:
                    n = self.deliveries[index]
                    dead = DeadLetteredError(
                        f"sibling {index} was dead-lettered: every node runner that took it "
                        f"died ({n} deliveries, max_deliveries={self.ex.max_deliveries}); see "
                        "the Ray logs of its node",
                        deliveries=n,
                    )
                    self._record(_error(dead, index), None)
                    return

    async def _handle(self, index: int, node: str) -> tuple[Any, str]:
        """A live runner for the sibling: on `node`, or on another node when `node` died."""
        refused = 0
        while True:
            try:
                return await self._runner(node), node
            except _RAY_ERRORS as exc:
                # No runner there (it is dying, or its node is): not this sibling's
                # doing, so no delivery is charged; retried a while.
                refused += 1
                if refused > _MAX_REFUSED:
                    raise DistributedError(
                        f"sibling {index}: no node runner would take it "
                        f"({refused} tries; last: {type(exc).__name__})"
                    ) from None
                node = await self._lost_runner(index, node, exc, "runner", None)
                await asyncio.sleep(min(2.0, 0.1 * refused))

    async def _lost_runner(
        self, index: int, node: str, exc: BaseException, what: str, handle: Any
    ) -> str:
        """Forget a dead runner; return the node to use next (another one when `node` died)."""
        future = self.runners.get(node)
        if (
            future is not None
            and future.done()
            and (future.exception() is not None or future.result() is handle)
        ):
            del self.runners[node]
        if handle is not None:
            self.ex.forget_runner(node, handle)
        nodes = await asyncio.to_thread(functools.partial(self.ex.live_nodes, fresh=True))
        if node in nodes:
            logger.info(
                "ray run %s: sibling %d lost its %s (%s)",
                self.group,
                index,
                what,
                type(exc).__name__,
            )
            return node
        moved = (await self._placement([index]))[index]
        logger.info("ray run %s: sibling %d lost its node; placed again", self.group, index)
        return moved

    async def stream(self) -> AsyncIterator[RemoteEvent]:
        """Place every sibling, yield events as they come, until each has an outcome."""
        if self.attach is not None:
            self.ledger = await asyncio.to_thread(self.ex.ledger)
            kept: dict[int, bytes] = await self.ledger.open.remote(
                self.attach, self.digest, self.ex.ttl_s
            )
            for index, payload in sorted(kept.items()):
                if index in self.payloads and index not in self.known:
                    self.known.add(index)
                    yield _outcome(self.serde, index, payload)
            if kept:
                logger.info(
                    "ray run %s: re-attached, %d of %d siblings already have an outcome",
                    self.group,
                    len(kept),
                    len(self.payloads),
                )
        todo = [i for i in self.payloads if i not in self.known]
        if not todo:
            return
        placement = await self._placement(todo)
        by_node: dict[str, list[int]] = {}
        for index in todo:
            by_node.setdefault(placement[index], []).append(index)
        tasks = [
            asyncio.create_task(self._node_batch(node, indices), name=f"lgb-ray-{node[:8]}")
            for node, indices in by_node.items()
        ]
        loop = asyncio.get_running_loop()
        deadline = None if self.ex.timeout is None else loop.time() + self.ex.timeout
        try:
            while len(self.known) < len(self.payloads) or not self.events.empty():
                wait_s = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    async with asyncio.timeout(wait_s):
                        event = await self.events.get()
                except TimeoutError:
                    for index in sorted(set(self.payloads) - self.known):
                        msg = f"sibling {index} had no outcome after timeout={self.ex.timeout} s"
                        self.known.add(index)
                        yield _error(
                            DistributedTimeoutError(msg, timeout_s=self.ex.timeout or 0), index
                        )
                    return
                yield event
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=_CLEANUP_TIMEOUT_S)

    async def _node_batch(self, node: str, indices: list[int]) -> None:
        """Run a node's first deliveries as one streaming call; fall back to one call each."""
        ray = _ray()
        started: set[int] = set()
        try:
            # A runner that does not answer (dead, or its node is) costs nobody a delivery.
            handle, node = await self._handle(indices[0], node)
        except DistributedError as exc:
            for index in indices:
                self._record(_error(exc, index), None)
            return
        try:
            stream = handle.run_many.options(num_returns="streaming").remote(
                self.group,
                self.total,
                self.ex.concurrency,
                [(i, self.payloads[i]) for i in indices],
            )
            try:
                async for ref in stream:
                    for index, data in await ref:
                        if data == STARTED:
                            if index not in started:
                                started.add(index)
                                self._record(RemoteEvent(index=index, kind="started"), None)
                        else:
                            self._record(_outcome(self.serde, index, data), data)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    handle.cancel_run.remote(self.group)
                    ray.cancel(stream)
                raise
            return
        except _RAY_ERRORS as exc:
            left = [i for i in indices if i not in self.known]
            moved = await self._lost_runner(left[0] if left else -1, node, exc, "actor", handle)
            if moved == node:
                # Delivered to a runner that died (as Redis counts a delivery: the
                # STARTED notice of the sibling that killed it may never have left).
                for index in left:
                    self.deliveries[index] = 1
            elif left:
                node = ""  # its node died: place them again, nobody charged
        except Exception as exc:  # e.g. Ray itself failing: these siblings' error
            left = [i for i in indices if i not in self.known]
            for index in left:
                self._record(_error(exc, index), None)
            return
        if not left:
            return
        placement = await self._placement(left) if not node else dict.fromkeys(left, node)
        async with asyncio.TaskGroup() as group:
            for index in left:
                group.create_task(self._guarded(index, placement[index]), name=f"lgb-ray-{index}")

    async def _guarded(self, index: int, node: str) -> None:
        try:
            await self._sibling(index, node)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # e.g. Ray itself failing: this sibling's error, not the run's
            self._record(_error(exc, index), None)

    async def close(self, finished: bool) -> None:
        """Flush the ledger; drop it (finished) and what coalesced tools kept for the run."""
        if self.pending_puts:
            await asyncio.gather(*self.pending_puts, return_exceptions=True)
        if finished and self.ledger is not None and self.attach is not None:
            await self.ledger.drop.remote(self.attach)
        for future in self.runners.values():
            if future.done() and not future.cancelled() and future.exception() is None:
                future.result().forget.remote(self.group)  # not awaited: nothing to wait for
        if not finished:
            logger.info(
                "ray run %s: cancelled with %d siblings outstanding",
                self.group,
                len(self.payloads) - len(self.known),
            )
