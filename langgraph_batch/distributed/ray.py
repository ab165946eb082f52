"""`RayExecutor`: distributed fan_out on a Ray cluster, the same contract as `RedisExecutor`.

`fan_out(agent, ..., executor=RayExecutor(graph="myapp.graphs:agent", address="auto"))`
connects the parent to a Ray cluster and runs the siblings there:

- **one async actor per node** (`NodeRunner`, hard node affinity, no CPU
  reserved) imports the graph by its import path, as `langgraph-batch worker`
  does, and runs that node's siblings in one event loop, so one scheduler per
  node batches them and books their KV locally (`SiblingAdmission`);
- **placement by key**: `node_for(index, input)` may name a node (its node id
  or IP address; e.g. the node of the vLLM replica the sibling talks to);
  otherwise a stable rendezvous hash of `key(index, input)` (default: the
  index) picks the node, with a bounded load (no node gets more than its share
  of a run, rounded up), so adding or losing a node moves few siblings;
- **results in order, failures isolated**: each node gets its siblings of a
  run in one streaming actor call that yields batches of "started" notices
  and outcomes (the strict `Serde` payloads of the Redis mode) as they come;
  an exception in the graph is that sibling's `SiblingError`;
- **faults**: a sibling whose actor or node died is placed again on a live
  node; one that killed its actor is then run alone (one at a time per node,
  so a poison sibling never takes innocent ones down again) and
  dead-lettered (`DeadLetteredError`) after `max_deliveries` deliveries. A
  sibling lost with its node is not charged a delivery;
- **checkpoints**: with a `thread_id`, every outcome is also kept in a detached
  ledger actor under a key derived from the graph, thread and checkpoint
  namespace (HMAC with `secret`); running the thread again collects the
  finished siblings instead of running them again (same inputs only);
- **cancellation**: closing the run cancels every sibling's actor call (Ray
  raises `CancelledError` inside the sibling's coroutine).

Execution is at least once, results exactly once (the parent keeps the
first outcome of each sibling): a sibling whose node died mid-run runs again
from its input. Its calls of `at_most_once` tools are recorded in the ledger
actor (`RayOnceStore`), so the second attempt gets back what the first
finished and a typed `ToolAlreadyRanError` for a call the first died in,
never a second execution. Ray is imported only when a run starts: `pip install
'langgraph-batch[ray]'`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig

from langgraph_batch.distributed._ray_node import Ledger, NodeRunner, RayOnceStore
from langgraph_batch.distributed._ray_run import RayRun, _ray, place
from langgraph_batch.distributed._serde import DEFAULT_MAX_PAYLOAD_BYTES, Serde
from langgraph_batch.distributed.executor import _check_graph_path, _error
from langgraph_batch.errors import DistributedError
from langgraph_batch.nodes import RemoteEvent

__all__ = ("RayExecutor", "place")

logger = logging.getLogger(__name__)

_LEDGER = "lgb-ledger"
_CLEANUP_TIMEOUT_S = 5.0
_NODES_TTL_S = 2.0


class RayExecutor:
    """Run a fan_out's siblings in async Ray actors, one per node (see the module docs).

    Example:
        ```python
        from langgraph_batch import fan_out
        from langgraph_batch.distributed import RayExecutor

        node = fan_out(
            agent,
            items="docs",
            into="reviews",
            make_input=lambda doc, i: {"messages": [("user", doc)]},
            result=lambda final: final["messages"][-1].content,
            executor=RayExecutor(graph="myapp.graphs:agent", address="auto"),
        )
        ```

    !!! version-added "Added in version 0.2.0"
    """

    def __init__(
        self,
        *,
        graph: str,
        address: str | None = "auto",
        namespace: str = "langgraph-batch",
        node_for: Callable[[int, Any], str | None] | None = None,
        key: Callable[[int, Any], str] | None = None,
        concurrency: int = 64,
        max_active: int | None = None,
        max_deliveries: int = 4,
        timeout: float | None = None,
        ttl_s: float = 24 * 3600.0,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        allowed_types: Iterable[type | tuple[str, str]] = (),
        secret: str | bytes | None = None,
        app_dir: str | None = ".",
        runtime_env: Mapping[str, Any] | None = None,
    ) -> None:
        """Create an executor (it connects to Ray when a fan_out runs).

        Args:
            graph: The sibling graph's import path, `"package.module:attr"`,
                importable on every node.
            address: The cluster (`"auto"`: the one this machine belongs to,
                `"ray://host:10001"`, `"127.0.0.1:6379"`); reused when this
                process is already connected.
            namespace: The Ray namespace of the node runners and the ledger.
            node_for: `(index, input) -> node id or IP address` of the node a
                sibling should run on (e.g. beside its vLLM replica), or None
                to hash it; a name that is not a live node is hashed too.
            key: `(index, input) -> placement key` for the hash (default: the index).
            concurrency: Siblings run at once per node (more wait in the actor).
            max_active: Per node, at most this many ACTIVE (not inside a tool).
            max_deliveries: A sibling that died with its actor this many
                times is dead-lettered (`DeadLetteredError`).
            timeout: Give up on siblings without an outcome after this many
                seconds (`DistributedTimeoutError`); None: wait.
            ttl_s: How long the ledger keeps a checkpointed run's outcomes.
            max_payload_bytes: Cap on one encoded input or result.
            allowed_types: Classes (or `(module, name)`) to rebuild besides the
                graph's state types.
            secret: Keys the ledger key of a thread (HMAC).
            app_dir: Prepended to `sys.path` on the nodes before importing the
                graph (made absolute against this process's working directory).
            runtime_env: A Ray runtime environment for the node runners.

        Raises:
            ValueError: For a malformed `graph` or an option out of range.
        """
        self.graph = _check_graph_path(graph)
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
        if max_deliveries < 1:
            raise ValueError(f"max_deliveries must be >= 1, got {max_deliveries!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        self.address = address
        self.namespace = namespace
        self.node_for = node_for
        self.key = key
        self.concurrency = concurrency
        self.max_active = max_active
        self.max_deliveries = max_deliveries
        self.timeout = timeout
        self.ttl_s = ttl_s
        self.max_payload_bytes = max_payload_bytes
        self.allowed_types = tuple(allowed_types)
        self._secret = secret.encode() if isinstance(secret, str) else secret
        self.app_dir = app_dir
        self.runtime_env = dict(runtime_env or {})
        Serde(max_bytes=max_payload_bytes)  # validates the cap now
        self._tag = hashlib.sha256(self.graph.encode()).hexdigest()[:12]
        self._lock = threading.Lock()
        self._classes: dict[str, Any] = {}
        self._handles: dict[str, Any] = {}
        self._generation: dict[str, int] = {}
        self._proven: dict[str, Any] = {}
        self._nodes: tuple[float, dict[str, str]] | None = None

    def __repr__(self) -> str:
        return f"RayExecutor(graph={self.graph!r}, namespace={self.namespace!r})"

    # -- the cluster ---------------------------------------------------------------------

    def _connect(self) -> Any:
        ray = _ray()
        if not ray.is_initialized():
            ray.init(
                address=self.address,
                namespace=self.namespace,
                log_to_driver=False,
                configure_logging=False,
            )
        return ray

    def live_nodes(self, *, fresh: bool = False) -> dict[str, str]:
        """`{node id: IP address}` of the cluster's live nodes (blocking; connects).

        Args:
            fresh: Ask the cluster now; otherwise an answer up to 2 s old may be
                reused (placing a run; a sibling that lost its runner asks fresh).
        """
        now = time.monotonic()
        if not fresh and self._nodes is not None and now - self._nodes[0] < _NODES_TTL_S:
            return dict(self._nodes[1])
        ray = self._connect()
        nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
        self._nodes = (now, nodes)
        return dict(nodes)

    def proven_runner(self, node_id: str) -> Any | None:
        """The cached runner of `node_id` once it has answered (non-blocking), else None."""
        with self._lock:
            handle = self._handles.get(node_id)
            return handle if handle is not None and self._proven.get(node_id) is handle else None

    def prove_runner(self, node_id: str, handle: Any) -> None:
        """Remember that `handle` answered (later runs skip asking it again)."""
        with self._lock:
            if self._handles.get(node_id) is handle:
                self._proven[node_id] = handle

    def _remote(self, name: str, cls: type) -> Any:
        ray = self._connect()
        if name not in self._classes:
            self._classes[name] = ray.remote(cls)
        return self._classes[name]

    def forget_runner(self, node_id: str, handle: Any) -> None:
        """Drop the cached handle of a node runner that died (the next one gets a new name).

        Ray may keep answering a dead actor's name for a while, so a new runner
        never reuses the name of one that died.
        """
        with self._lock:
            self._nodes = None
            if self._proven.get(node_id) is handle:
                del self._proven[node_id]
            if self._handles.get(node_id) is handle:
                del self._handles[node_id]
                self._generation[node_id] = self._generation.get(node_id, 0) + 1

    def runner(self, node_id: str) -> Any:
        """The node runner actor of `node_id` (created when missing; blocking)."""
        with self._lock:
            if node_id not in self._handles:
                self._handles[node_id] = self._new_runner(node_id)
            return self._handles[node_id]

    def _new_runner(self, node_id: str) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        cls = self._remote("runner", NodeRunner)
        options: dict[str, Any] = {
            "name": f"lgb-node-{self._tag}-{node_id[:16]}-{self._generation.get(node_id, 0)}",
            "namespace": self.namespace,
            "get_if_exists": True,
            "num_cpus": 0,
            "max_restarts": 0,
            "max_concurrency": self.concurrency + 4,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
        }
        if self.runtime_env:
            options["runtime_env"] = self.runtime_env
        return cls.options(**options).remote(
            self.graph,
            max_active=self.max_active,
            max_payload_bytes=self.max_payload_bytes,
            allowed_types=self.allowed_types,
            app_dir=None if self.app_dir is None else os.path.abspath(self.app_dir),
            once_store=RayOnceStore(self.ledger()),
        )

    def ledger(self) -> Any:
        """The namespace's detached ledger actor (created when missing; blocking)."""
        cls = self._remote("ledger", Ledger)
        return cls.options(
            name=_LEDGER,
            namespace=self.namespace,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            max_restarts=-1,
        ).remote()

    # -- SiblingExecutor -----------------------------------------------------------------

    async def run(
        self,
        subgraph: Any,
        inputs: Sequence[tuple[int, Any]],
        *,
        total: int,
        config: RunnableConfig,
    ) -> AsyncIterator[RemoteEvent]:
        """Run the siblings on the cluster, yield their events (`SiblingExecutor`)."""
        serde = Serde.for_graph(
            subgraph, extra=self.allowed_types, max_bytes=self.max_payload_bytes
        )
        payloads: dict[int, bytes] = {}
        values: dict[int, Any] = {}
        for index, value in inputs:
            try:
                payloads[index] = serde.dumps(value, what="input")
                values[index] = value
            except (DistributedError, TypeError) as exc:
                yield _error(exc, index)
        if not payloads:
            return
        run = RayRun(self, serde, payloads, values, total, config)
        finished = False
        try:
            async for event in run.stream():
                yield event
            finished = True
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_CLEANUP_TIMEOUT_S):
                    await asyncio.shield(run.close(finished))
