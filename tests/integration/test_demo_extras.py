"""`langgraph-batch demo` without langchain-openai: it still runs, says so once, names the extra."""

from __future__ import annotations

import subprocess
import sys


def test_demo_without_langchain_openai_names_the_demo_extra() -> None:
    code = (
        "import sys; sys.modules['langchain_openai'] = None\n"
        "from langgraph_batch.cli import main\n"
        "raise SystemExit(main(['demo', '--n', '2', '--time-scale', '50', '--no-progress']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    hint = "pip install 'langgraph-batch[demo]'"
    assert out.count(hint) == 1, out  # once, not again for the warm-up run
    assert "langchain-openai is not installed" in out
    assert "2/2 siblings answered" in out  # the demo still ran, both stacks
    assert "ModuleNotFoundError" not in out
