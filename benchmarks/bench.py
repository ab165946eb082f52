"""`python -m benchmarks.bench <W1|...|W11|W8o|all> ...`: the full benchmark (`make bench`).

The wheel's `langgraph-batch bench` with the research harness installed
(`benchmarks.extension.Research`): every contender of each workload (the
bounds, batchagent, router contenders), the issues' goals, the charts, and
results in `benchmarks/results` of the checkout. Takes the same options.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from benchmarks.extension import research
from langgraph_batch.bench import cli

__all__ = ("main",)

PROG = "python -m benchmarks.bench"


def main(argv: Sequence[str] | None = None) -> int:
    """Run `langgraph-batch bench` with the research harness; returns the exit code."""
    with research():
        return cli.main(sys.argv[1:] if argv is None else argv, prog=PROG)


if __name__ == "__main__":
    raise SystemExit(main())
