"""`python -m benchmarks.routers`: W4 behind a router (`benchmarks.routers.w4`)."""

from __future__ import annotations

from benchmarks.routers.w4 import main

if __name__ == "__main__":
    main()
