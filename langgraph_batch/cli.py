"""The `langgraph-batch` command: `demo`, `emulate`, `bench`, `worker`.

Each subcommand lives in its own module and is imported only when used, so
`langgraph-batch emulate` does not import LangGraph and `demo` does not need
the benchmark code.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

_USAGE = """usage: langgraph-batch <command> [options]

commands:
  demo      run a fan-out against the built-in emulator (or --backend-url)
  emulate   serve the vLLM/SGLang emulator over HTTP
  bench     run the benchmark workloads (from a source checkout)
  worker    run the siblings of distributed fan_outs (Redis URL, graph import path)

`langgraph-batch <command> --help` shows a command's options.
"""


def _demo(argv: Sequence[str]) -> int:
    from langgraph_batch.demo import main

    return main(argv)


def _emulate(argv: Sequence[str]) -> int:
    from langgraph_batch.emulator.cli import main

    return main(argv)


def _bench(argv: Sequence[str]) -> int:
    # The benchmark harness lives in the repository's benchmarks/ package, not
    # in the wheel: it is a development tool. Find it next to the package.
    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "__init__.py").exists():
        print(
            "langgraph-batch bench runs from a source checkout: "
            "git clone the repository and run `make bench` there.",
            file=sys.stderr,
        )
        return 2
    sys.path.insert(0, str(root))
    from benchmarks.cli import main

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
