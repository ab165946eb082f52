"""`python -m langgraph_batch.emulator`: the same as `langgraph-batch emulate`."""

from __future__ import annotations

from langgraph_batch.emulator.cli import main

raise SystemExit(main())
