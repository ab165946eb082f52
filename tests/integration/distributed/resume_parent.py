"""A parent process for the re-attach test: a checkpointed graph with a distributed fan_out.

`python -m tests.integration.distributed.resume_parent first|resume DB REDIS_URL N`
prints the `out` list as JSON when the run finishes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any


async def main(mode: str, db: str, url: str, n: int) -> None:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from tests.integration.distributed._parent import executor, parent_graph

    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        graph = parent_graph(executor(url), checkpointer=saver)
        cfg: Any = {"configurable": {"thread_id": "distributed-resume"}}
        inputs = {"xs": [{"x": i, "sleep": 0.5} for i in range(n)]} if mode == "first" else None
        out = await graph.ainvoke(inputs, cfg)
        sys.stdout.write(json.dumps(out["out"]) + "\n")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
