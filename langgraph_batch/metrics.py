"""Prometheus metrics for the scheduler, fan_out and tool coalescing (extra `metrics`).

`enable()` registers langgraph-batch's metrics into `prometheus_client`'s
default registry (or the one you pass), so an app that already exposes
`/metrics` shows them with no more code; `serve(port)` starts a metrics
endpoint of its own (loopback by default) for a worker or a script.

| metric | type | labels |
| --- | --- | --- |
| `lgb_scheduler_queued` | gauge | scheduler |
| `lgb_scheduler_in_flight` | gauge | scheduler |
| `lgb_scheduler_inflight_limit` | gauge | scheduler |
| `lgb_scheduler_decode_cap` | gauge | scheduler (absent while not capping) |
| `lgb_scheduler_dispatched_total` | counter | scheduler (attempts on the wire) |
| `lgb_scheduler_completed_total` | counter | scheduler |
| `lgb_scheduler_retries_total` | counter | scheduler, error_type |
| `lgb_scheduler_failures_total` | counter | scheduler, error_type |
| `lgb_scheduler_batch_size` | histogram | scheduler |
| `lgb_scheduler_tokens_total` | counter | scheduler, kind (prompt, completion, cached) |
| `lgb_scheduler_queue_wait_seconds` | histogram | scheduler |
| `lgb_scheduler_request_duration_seconds` | histogram | scheduler |
| `lgb_fan_out_siblings_started_total` | counter | node |
| `lgb_fan_out_siblings_finished_total` | counter | node |
| `lgb_fan_out_siblings_failed_total` | counter | node |
| `lgb_tool_calls_requested_total` | counter | tool |
| `lgb_tool_calls_executed_total` | counter | tool |

The `scheduler` label is the scheduler's name: a registered name, or the
backend's key (its URL without user info, and a digest of the credentials,
never a secret). Gauges and the tool counters are read at scrape time (free
until scraped) from the open schedulers, summed when one server has schedulers
in several event loops; the rest are observed as events happen (a few microseconds
per call, nothing when metrics are not enabled).

Example:
    ```python
    import langgraph_batch.metrics

    langgraph_batch.metrics.enable()          # into prometheus_client's default registry
    langgraph_batch.metrics.serve(9464)        # and/or an endpoint of its own, on 127.0.0.1
    # curl -s 127.0.0.1:9464/metrics | grep lgb_
    ```
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

from langgraph_batch._extras import missing_extra
from langgraph_batch._observe import sinks
from langgraph_batch.scheduler import Scheduler, SchedulerState, live_schedulers
from langgraph_batch.tools import tool_stats

try:
    import prometheus_client as _prom
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector, CollectorRegistry
except ImportError:  # pragma: no cover - exercised by a subprocess test
    raise missing_extra("metrics", "langgraph_batch.metrics needs prometheus_client") from None

__all__ = ("disable", "enable", "serve")

_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_USERINFO = re.compile(r"//[^/@]*@")


def _label(name: str) -> str:
    """A scheduler name fit for a label: user info in a URL is cut out."""
    return _USERINFO.sub("//", name)


class _Sink:
    """The event-driven metrics: one object per registry, subscribed to `_observe`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        counter, histogram = _prom.Counter, _prom.Histogram
        r = registry
        self.dispatched = counter(
            "lgb_scheduler_dispatched", "Attempts sent to the server.", ["scheduler"], registry=r
        )
        self.completed = counter(
            "lgb_scheduler_completed", "Requests answered.", ["scheduler"], registry=r
        )
        self.retries = counter(
            "lgb_scheduler_retries",
            "Retries, by the error retried.",
            ["scheduler", "error_type"],
            registry=r,
        )
        self.failures = counter(
            "lgb_scheduler_failures",
            "Requests that raised to their caller, by error type.",
            ["scheduler", "error_type"],
            registry=r,
        )
        self.tokens = counter(
            "lgb_scheduler_tokens",
            "Tokens the server reported (cached: prompt tokens served from its prefix cache).",
            ["scheduler", "kind"],
            registry=r,
        )
        self.batch_size = histogram(
            "lgb_scheduler_batch_size",
            "Requests per HTTP batch.",
            ["scheduler"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.queue_wait = histogram(
            "lgb_scheduler_queue_wait_seconds",
            "Time from submit to a slot.",
            ["scheduler"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.duration = histogram(
            "lgb_scheduler_request_duration_seconds",
            "Time from submit to the response, retries included.",
            ["scheduler"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.siblings = {
            event: counter(
                f"lgb_fan_out_siblings_{event}",
                f"fan_out siblings {event}.",
                ["node"],
                registry=r,
            )
            for event in ("started", "finished", "failed")
        }

    def on_dispatch(self, scheduler: str) -> None:
        self.dispatched.labels(_label(scheduler)).inc()

    def on_call(self, call: sinks.CallRecord) -> None:
        name = _label(call.scheduler)
        self.completed.labels(name).inc()
        self.queue_wait.labels(name).observe(call.queue_wait)
        self.duration.labels(name).observe(call.latency)
        usage = call.usage
        if usage is not None:
            self.tokens.labels(name, "prompt").inc(usage.prompt_tokens)
            self.tokens.labels(name, "completion").inc(usage.completion_tokens)
            if usage.cached_tokens:
                self.tokens.labels(name, "cached").inc(usage.cached_tokens)

    def on_retry(self, scheduler: str, error_type: str) -> None:
        self.retries.labels(_label(scheduler), error_type).inc()

    def on_failure(self, scheduler: str, error_type: str) -> None:
        self.failures.labels(_label(scheduler), error_type).inc()

    def on_batch(self, scheduler: str, size: int) -> None:
        self.batch_size.labels(_label(scheduler)).observe(size)

    def on_sibling(self, node: str, event: str) -> None:
        counter = self.siblings.get(event)
        if counter is not None:
            counter.labels(node).inc()


def _serving(scheduler: Scheduler) -> bool:
    """Open, in an event loop that still runs (a finished `asyncio.run` leaves some behind)."""
    if scheduler.state is not SchedulerState.OPENED:
        return False
    loop = scheduler.loop
    return loop is None or not loop.is_closed()


class _ScrapeCollector(Collector):
    """What is read at scrape time: scheduler gauges and the tool counters."""

    def collect(self) -> Iterator[Any]:
        queued = GaugeMetricFamily(
            "lgb_scheduler_queued", "Requests waiting for a slot.", labels=["scheduler"]
        )
        in_flight = GaugeMetricFamily(
            "lgb_scheduler_in_flight", "Requests on the wire.", labels=["scheduler"]
        )
        limit = GaugeMetricFamily(
            "lgb_scheduler_inflight_limit", "The adaptive in-flight limit.", labels=["scheduler"]
        )
        cap = GaugeMetricFamily(
            "lgb_scheduler_decode_cap",
            "Agent requests the learned decode cap lets decode at once.",
            labels=["scheduler"],
        )
        totals: dict[str, list[int]] = {}
        caps: dict[str, int] = {}
        for scheduler in live_schedulers():
            if not _serving(scheduler):
                continue
            # Schedulers of one server in several event loops share a name: summed.
            name = _label(scheduler.name)
            q, f, lim, dcap = scheduler.load()
            row = totals.setdefault(name, [0, 0, 0])
            row[0] += q
            row[1] += f
            row[2] += lim
            if dcap is not None:
                caps[name] = caps.get(name, 0) + dcap
        for name, (q, f, lim) in totals.items():
            queued.add_metric([name], q)
            in_flight.add_metric([name], f)
            limit.add_metric([name], lim)
        for name, dcap in caps.items():
            cap.add_metric([name], dcap)
        yield from (queued, in_flight, limit, cap)
        requested = CounterMetricFamily(
            "lgb_tool_calls_requested", "Tool calls the models asked for.", labels=["tool"]
        )
        executed = CounterMetricFamily(
            "lgb_tool_calls_executed",
            "Tool calls that ran (coalesced calls run once).",
            labels=["tool"],
        )
        for tool, stats in sorted(tool_stats().by_tool.items()):
            requested.add_metric([tool], stats.requested)
            executed.add_metric([tool], stats.executed)
        yield requested
        yield executed


_lock = threading.Lock()
_enabled: dict[int, tuple[CollectorRegistry, _Sink, _ScrapeCollector]] = {}


def enable(registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """Register langgraph-batch's metrics into `registry` (default: prometheus_client's).

    Idempotent per registry: enabling twice registers nothing twice.

    Args:
        registry: where to register; None for `prometheus_client.REGISTRY`.

    Returns:
        The registry the metrics are in.

    Example:
        ```python
        from prometheus_client import CollectorRegistry, generate_latest
        from langgraph_batch import metrics

        reg = metrics.enable(CollectorRegistry())
        print(generate_latest(reg).decode())
        ```
    """
    reg = registry if registry is not None else _prom.REGISTRY
    with _lock:
        if id(reg) in _enabled:
            return reg
        sink = _Sink(reg)
        collector = _ScrapeCollector()
        reg.register(collector)
        _enabled[id(reg)] = (reg, sink, collector)
        sinks.subscribe(sink)
    return reg


def disable(registry: CollectorRegistry | None = None) -> None:
    """Stop observing into `registry` (default: prometheus_client's) and unregister."""
    reg = registry if registry is not None else _prom.REGISTRY
    with _lock:
        entry = _enabled.pop(id(reg), None)
    if entry is None:
        return
    _, sink, collector = entry
    sinks.unsubscribe(sink)
    for metric in (collector, *_sink_metrics(sink)):
        reg.unregister(metric)


def _sink_metrics(sink: _Sink) -> list[Any]:
    return [
        sink.dispatched,
        sink.completed,
        sink.retries,
        sink.failures,
        sink.tokens,
        sink.batch_size,
        sink.queue_wait,
        sink.duration,
        *sink.siblings.values(),
    ]


def serve(
    port: int = 9464, addr: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> tuple[Any, threading.Thread]:
    """Enable the metrics (see `enable`) and serve them over HTTP at `addr:port/metrics`.

    Binds loopback unless told otherwise (`addr="0.0.0.0"` to let a Prometheus on
    another machine scrape it). Port 0 picks a free port (`server.server_port`).

    Returns:
        `(server, thread)` from `prometheus_client.start_http_server`; call
        `server.shutdown()` to stop it.

    Example:
        ```python
        server, _ = langgraph_batch.metrics.serve(0)
        print(f"http://127.0.0.1:{server.server_port}/metrics")
        ```
    """
    reg = enable(registry)
    server, thread = _prom.start_http_server(port, addr=addr, registry=reg)
    return server, thread
