"""Client CPU per request of `OpenAICompatibleBackend.chat` vs requests in flight.

K workers each send requests back to back through one backend, so K requests
are on the wire at any moment, against the emulator (profile `zero`, its own
process) so that only the client's CPU is measured (`time.process_time`).
httpcore's pool does O(requests x connections) bookkeeping on every request
event; a client whose cost per request grows with K shows it. Requests go
through the backend's `ShardedTransport` (pools of `SHARD_CONNECTIONS`);
`conns` is the number of idle keep-alive connections it holds afterwards
(connections were reused, streams included).

Usage:
    python -m benchmarks.http_pool_overhead [--ks 32,128,256,512] [--requests 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections.abc import Sequence

from langgraph_batch.backends.base import ChatRequest
from langgraph_batch.backends.openai_compat import OpenAICompatibleBackend
from langgraph_batch.emulator import EmulatorConfig, EmulatorProcess


async def _measure(
    url: str, model: str, k: int, total: int, *, stream: bool
) -> tuple[float, float, int]:
    """(client CPU µs per request, wall seconds, idle connections) for `total` requests."""
    backend = OpenAICompatibleBackend(url, timeout=120.0)
    request = ChatRequest(
        model=model,
        messages=[{"role": "user", "content": "hello"}],
        params={"max_tokens": 8},
        stream=stream,
    )
    per_worker = max(1, total // k)

    async def worker() -> None:
        for _ in range(per_worker):
            await backend.chat(request)

    try:
        # Warm-up: open the connections (one per in-flight request) outside the timing.
        await asyncio.gather(*(backend.chat(request) for _ in range(k)))
        gc.collect()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(k)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        conns = backend.transport.state().connections_idle
    finally:
        await backend.aclose()
    return cpu / (per_worker * k) * 1e6, wall, conns


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep and print one line per (mode, K)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", default="32,128,256,512", help="requests in flight")
    parser.add_argument("--requests", type=int, default=3000, help="requests per point")
    parser.add_argument("--modes", default="plain,stream", help="plain and/or stream")
    args = parser.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    config = EmulatorConfig(
        port=0, profile="zero", scenario="echo", output_tokens=8, max_num_seqs=4096
    )
    with EmulatorProcess(config) as emu:
        print(f"{'mode':<7}{'K':>6}{'requests':>10}{'cpu_us/req':>12}{'wall_s':>8}{'conns':>7}")
        for mode in args.modes.split(","):
            for k in ks:
                total = max(args.requests, 2 * k)
                us, wall, conns = asyncio.run(
                    _measure(emu.url, config.model, k, total, stream=mode == "stream")
                )
                print(
                    f"{mode:<7}{k:>6}{total // k * k:>10}{us:>12.0f}{wall:>8.2f}{conns:>7}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
