"""`langgraph-batch worker URL package.module:graph [options]`: the worker command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence

from langgraph_batch.distributed._serde import DEFAULT_MAX_PAYLOAD_BYTES
from langgraph_batch.distributed.worker import Worker

__all__ = ("main",)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="langgraph-batch worker",
        description="Run the siblings of distributed fan_outs (RedisExecutor) of one graph.",
    )
    p.add_argument("url", help="Redis URL: redis://[user:password@]host:port/db or rediss://...")
    p.add_argument("graph", help="the sibling graph's import path, package.module:attribute")
    p.add_argument("--concurrency", type=int, default=16, help="siblings run at once (16)")
    p.add_argument(
        "--max-active",
        type=int,
        default=None,
        help="of those, at most N active (not inside a tool) at once (default: no cap)",
    )
    p.add_argument(
        "--cluster-inflight",
        type=int,
        default=None,
        help="cap on requests in flight per inference endpoint across all workers "
        "started with the same value (default: no cap)",
    )
    p.add_argument("--cluster-lease", type=float, default=30.0, help="in-flight lease, s (30)")
    p.add_argument(
        "--max-payload-bytes", type=int, default=DEFAULT_MAX_PAYLOAD_BYTES, help="payload cap"
    )
    p.add_argument(
        "--allowed-type",
        action="append",
        default=[],
        metavar="MODULE:CLASS",
        help="a class to rebuild from payloads besides the graph's state types (repeatable)",
    )
    p.add_argument("--name", default=None, help="consumer name (default host:pid:random)")
    p.add_argument("--block", type=float, default=0.5, help="longest blocking read, s (0.5)")
    p.add_argument("--drain", type=float, default=30.0, help="on SIGTERM, finish for up to S s")
    p.add_argument("--socket-timeout", type=float, default=5.0, help="Redis command timeout, s")
    p.add_argument("--app-dir", default=".", help="prepended to sys.path before the import (.)")
    p.add_argument("--log-level", default="info", help="debug, info, warning (info)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics on this port (extra `metrics`; off by default)",
    )
    p.add_argument(
        "--metrics-addr", default="127.0.0.1", help="address the metrics endpoint binds (127.0.0.1)"
    )
    return p


def _allowed(names: Sequence[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for name in names:
        module, sep, cls = name.partition(":")
        if not (sep and module and cls):
            raise SystemExit(f"--allowed-type wants MODULE:CLASS, got {name!r}")
        out.append((module, cls))
    return out


async def _serve(worker: Worker) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await worker.run(stop)


def _serve_metrics(port: int, addr: str) -> None:
    """`--metrics-port`: the worker's schedulers and siblings on a Prometheus endpoint."""
    from langgraph_batch import metrics

    server, _ = metrics.serve(port, addr=addr)
    logging.getLogger(__name__).info("metrics on http://%s:%d/metrics", addr, server.server_port)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `langgraph-batch worker`."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        worker = Worker(
            args.url,
            args.graph,
            concurrency=args.concurrency,
            max_active=args.max_active,
            cluster_inflight=args.cluster_inflight,
            cluster_lease_s=args.cluster_lease,
            max_payload_bytes=args.max_payload_bytes,
            allowed_types=_allowed(args.allowed_type),
            name=args.name,
            block_s=args.block,
            drain_s=args.drain,
            socket_timeout=args.socket_timeout,
            app_dir=args.app_dir,
        )
        if args.metrics_port is not None:
            _serve_metrics(args.metrics_port, args.metrics_addr)
    except (ValueError, TypeError, ImportError, AttributeError, OSError) as exc:
        logging.getLogger(__name__).error("cannot start the worker: %s", exc)
        return 2
    asyncio.run(_serve(worker))
    return 0
