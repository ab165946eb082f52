"""The benchmark contenders; each runs in its own process (see `_common.py`).

A contender module is run as `python -m benchmarks.contenders.<name>` with a
job JSON on stdin and prints one result JSON line on stdout. This package must
import nothing beyond the standard library: the `batchagent` contender runs in
its own virtual environment.
"""

from __future__ import annotations
