"""The `langgraph-batch` command: `demo`, `emulate`, `bench`, `worker`.

Each subcommand lives in its own module and is imported only when used, so
`langgraph-batch emulate` does not import LangGraph. `demo` and `bench` are
applications built on the library (`langgraph_batch.bench`): the library
itself never imports them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

_USAGE = """usage: langgraph-batch <command> [options]

commands:
  demo      W1 batched vs plain LangGraph on the emulator or --backend-url
  emulate   serve the vLLM/SGLang emulator over HTTP
  bench     run the benchmark workloads
  worker    run the siblings of distributed fan_outs (Redis URL, graph import path)

`langgraph-batch <command> --help` shows a command's options.
"""


def _demo(argv: Sequence[str]) -> int:
    # An application built from the benchmark's workload and contenders.
    try:
        from langgraph_batch.bench.demo import main
    except ImportError:
        # Its emulator and the benchmark's tool service are HTTP servers
        # (starlette, uvicorn); its baseline is ChatOpenAI: the `demo` extra.
        from langgraph_batch._extras import missing_extra

        err = missing_extra(
            "demo", "the demo needs starlette and uvicorn (its emulator and tool service)"
        )
        print(f"langgraph-batch demo failed: ImportError: {err}", file=sys.stderr)
        return 1
    return int(main(argv))


def _emulate(argv: Sequence[str]) -> int:
    from langgraph_batch.emulator.cli import main

    return main(argv)


def _bench(argv: Sequence[str]) -> int:
    from langgraph_batch.bench.cli import main

    return int(main(argv))


def _worker(argv: Sequence[str]) -> int:
    from langgraph_batch.distributed.cli import main

    return main(argv)


_COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "bench": _bench,
    "demo": _demo,
    "emulate": _emulate,
    "worker": _worker,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `langgraph-batch` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"}:
        print(_USAGE)
        return 0 if args else 2
    command = _COMMANDS.get(args[0])
    if command is None:
        print(f"unknown command {args[0]!r}\n\n{_USAGE}", file=sys.stderr)
        return 2
    return command(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
