"""Stopping a child process: one rule for the emulator, routers and the tool service."""

from __future__ import annotations

import subprocess
from typing import Any


def terminate(proc: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """Ask `proc` to exit (SIGTERM), kill it after `grace_s`, and reap it.

    Idempotent: a process that already exited is only reaped.

    Example:
        >>> import subprocess, sys
        >>> p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        >>> terminate(p, grace_s=1.0)
        >>> p.returncode is not None
        True
    """
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()
