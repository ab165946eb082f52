"""Every Redis key the distributed mode uses, in one place.

Keys start with `{lgb:` so one ACL key pattern (`~{lgb:*`) covers them, and
the keys of one run share the hash tag `{lgb:<run_id>}` so its Lua scripts
touch one slot:

```
{lgb:<run_id>}:meta      hash    graph, total, inputs (digest), lease, deliveries, state, sentinel
{lgb:<run_id>}:jobs      stream  one entry per sibling (job id, serialised input); group "w"
{lgb:<run_id>}:results   hash    job id -> serialised outcome (HSETNX: the first wins)
{lgb:<run_id>}:events    stream  started / done / dead notices, in order, for the parent
{lgb:<run_id>}:dead      hash    job id -> deliveries, for dead-lettered jobs
{lgb:<run_id>}:queued    set     job ids published (a re-submission skips them)
{lgb:<run_id>}:sf        set     the single-flight keys of the run (for cleanup)
{lgb:<run_id>}:sf:<h>:lock / :res   one coalesced tool call's lock and result
{lgb:a:<digest>}         string  run id of a (thread, checkpoint namespace): re-attach
{lgb:g:<digest>}:runs    zset    run ids of a graph, scored by expiry (workers poll it)
{lgb:g:<digest>}:wake    stream  a notice per published run (wakes idle workers at once)
{lgb:sem:<digest>}       zset    cluster-wide in-flight leases of one inference endpoint
```

Run ids are 128 random bits (`secrets`), never derived from anything a
client can know. A parent that dies finds its run again through the attach
key, whose name is a digest of the graph, thread id and checkpoint
namespace, keyed with `secret` when one is configured (HMAC), so that
without the secret the attach key of a thread cannot be computed either.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = (
    "ACL_RULES",
    "GROUP",
    "RunKeys",
    "attach_key",
    "attach_key_of",
    "graph_runs_key",
    "graph_wake_key",
    "new_run_id",
    "semaphore_key",
    "sibling_group",
)

ACL_RULES = (
    "~{lgb:* resetchannels -@all +ping +auth +hello "
    "+get +set +del +exists +pexpire +pttl +time "
    "+hset +hsetnx +hget +hmget +hgetall +hexists +hlen "
    "+sadd +smembers +scard "
    "+zadd +zrem +zscore +zcard +zrangebyscore +zremrangebyscore "
    "+xadd +xread +xreadgroup +xack +xclaim +xautoclaim +xpending +xrange +xlen +xgroup|create "
    "+multi +exec +discard +eval +evalsha +script|load +script|exists"
)
"""The least a Redis ACL user needs for parents and workers (commands inside the Lua
scripts included): `ACL SETUSER lgb on >password ` + this."""

GROUP = "w"
"""The consumer group every worker reads a run's jobs stream with."""

_PREFIX = "lgb"


def new_run_id() -> str:
    """128 random bits as 32 hex characters."""
    return secrets.token_hex(16)


def _digest(text: str, secret: bytes | None = None, *, size: int = 32) -> str:
    if secret:
        return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()[:size]
    return hashlib.sha256(text.encode()).hexdigest()[:size]


def sibling_group(run_id: str) -> str:
    """The `SiblingInfo.group` workers give a run's siblings: not the run id itself.

    It appears in request ids sent to the inference server and in logs, so
    it must not reveal the run id (which names the run's keys).
    """
    return _digest(f"group|{run_id}", size=16)


def attach_key(graph: str, thread_id: str, checkpoint_ns: str, secret: bytes | None) -> str:
    """The key holding the run id of one fan_out invocation of a checkpointed thread."""
    return f"{{{_PREFIX}:a:{_digest(f'{graph}|{thread_id}|{checkpoint_ns}', secret)}}}"


def attach_key_of(graph: str, config: Mapping[str, Any], secret: bytes | None) -> str | None:
    """`attach_key` of the fan_out invocation that `config` runs (None: no thread id)."""
    conf = config.get("configurable") or {}
    thread_id, ns = conf.get("thread_id"), conf.get("checkpoint_ns")
    if thread_id is None:
        return None
    return attach_key(graph, str(thread_id), str(ns or ""), secret)


def graph_runs_key(graph: str) -> str:
    """The sorted set of live runs of `graph` (an import path), scored by expiry."""
    return f"{{{_PREFIX}:g:{_digest(graph)}}}:runs"


def graph_wake_key(graph: str) -> str:
    """The stream of run notices of `graph`: idle workers block on it."""
    return f"{{{_PREFIX}:g:{_digest(graph)}}}:wake"


def semaphore_key(endpoint: str) -> str:
    """The lease set of the cluster-wide in-flight cap of one endpoint (a backend key)."""
    return f"{{{_PREFIX}:sem:{_digest(endpoint)}}}"


@dataclass(frozen=True, slots=True)
class RunKeys:
    """The keys of one run."""

    run_id: str

    @property
    def tag(self) -> str:
        """`{lgb:<run_id>}`: the hash tag every key of the run starts with."""
        return f"{{{_PREFIX}:{self.run_id}}}"

    @property
    def meta(self) -> str:
        """Hash: the run's parameters, state and data-loss sentinel."""
        return f"{self.tag}:meta"

    @property
    def jobs(self) -> str:
        """Stream: one entry per job, read by the workers' consumer group."""
        return f"{self.tag}:jobs"

    @property
    def results(self) -> str:
        """Hash: job id -> serialised outcome."""
        return f"{self.tag}:results"

    @property
    def events(self) -> str:
        """Stream: started / done / dead notices for the parent."""
        return f"{self.tag}:events"

    @property
    def dead(self) -> str:
        """Hash: job id -> deliveries of dead-lettered jobs."""
        return f"{self.tag}:dead"

    @property
    def queued(self) -> str:
        """Set: job ids already published (a re-submission skips them)."""
        return f"{self.tag}:queued"

    @property
    def flights(self) -> str:
        """Set: the single-flight keys this run created."""
        return f"{self.tag}:sf"

    def flight(self, key_digest: str) -> tuple[str, str]:
        """The (lock, result stream) keys of one coalesced call."""
        return f"{self.tag}:sf:{key_digest}:lock", f"{self.tag}:sf:{key_digest}:res"

    def all(self) -> tuple[str, ...]:
        """The fixed keys of the run (single-flight keys are listed in `flights`).

        In the order the `publish` script takes them.
        """
        return (
            self.meta,
            self.jobs,
            self.results,
            self.events,
            self.dead,
            self.flights,
            self.queued,
        )
