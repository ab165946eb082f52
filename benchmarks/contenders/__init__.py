"""The research harness's contenders and bounds (the wheel's: `langgraph_batch.bench.contenders`).

- `ideal`: the lower bound on makespan from the emulator's cost model (and
  `resident_bound`, the same for a replayed recording);
- `kv_bound`: the KV-valid bound of long-horizon shapes, whose contexts outgrow the KV cache;
- `batchagent_runner`: the prior-art contender, run in its own virtual
  environment without LangGraph (`benchmarks.extension`).
"""

from __future__ import annotations
