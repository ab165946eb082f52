"""The README's runnable Python blocks run as written, against emulator processes.

Which blocks run, and how, is the convention in `tests/integration/_readme.py`
(`<!-- test: run -->` before a python fence). The blocks run in a fresh
interpreter, as a user would run them, with `BACKEND_URL` / `MODEL` pointing
at one emulator and `OPENAI_BASE_URL` at a second one serving a cloud-style
model name for the degraded-mode (ChatOpenAI) example.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration._readme import Block, extract_blocks

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
QUICKSTART_MODEL = "Qwen/Qwen2.5-7B-Instruct"
CLOUD_MODEL = "gpt-4.1-mini"

# Sections whose main example must be covered (heading text, as written).
MUST_RUN = ("Quickstart", "`BatchedChatModel`", "`fan_out`", "Tools:", "Any LangChain chat model")


def _blocks() -> list[Block]:
    return extract_blocks(README.read_text())


def test_marked_blocks_cover_the_main_examples() -> None:
    blocks = _blocks()
    sections = [b.section for b in blocks]
    for wanted in MUST_RUN:
        assert any(s.startswith(wanted) for s in sections), (wanted, sections)
    quick = [b for b in blocks if b.section == "Quickstart"]
    assert len(quick) == 1
    (block,) = quick
    assert blocks[0] is block  # first: nothing defined before it
    assert block.setup == ""  # runs as written, no hidden setup
    assert "create_react_agent" not in block.code  # deprecated in LangGraph 1.x
    assert "from langchain.agents import create_agent" in block.code
    assert "BACKEND_URL" in block.code


def test_extract_blocks_convention() -> None:
    text = "\n".join(
        [
            "# A",
            "<!-- test: run",
            "x = 1",
            "-->",
            "```python",
            "y = x + 1",
            "```",
            "<!-- test: check",
            "assert y == 2",
            "-->",
            "```python",
            "not_run()",
            "```",
        ]
    )
    (block,) = extract_blocks(text)
    assert (block.section, block.setup, block.code, block.check) == (
        "A",
        "x = 1",
        "y = x + 1",
        "assert y == 2",
    )
    assert (block.setup_line, block.line, block.check_line) == (3, 6, 9)
    with pytest.raises(ValueError, match="must precede"):
        extract_blocks("<!-- test: run -->\n```bash\nls\n```")


@pytest.mark.timeout(240)
def test_readme_blocks_run_against_the_emulator(start_emulator: Callable[..., str]) -> None:
    local = start_emulator(model=QUICKSTART_MODEL)
    cloud = start_emulator(model=CLOUD_MODEL)
    env = dict(os.environ)  # already hermetic (tests/conftest.py)
    env.update(
        BACKEND_URL="vllm://" + local.split("://", 1)[1],
        MODEL=QUICKSTART_MODEL,
        OPENAI_BASE_URL=cloud + "/v1",
        OPENAI_API_KEY="not-needed",
        LANGSMITH_TRACING="false",
        PYTHONPATH=str(REPO),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration._readme", str(README)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    blocks = _blocks()
    for block in blocks:
        assert f"README block at line {block.line} ok" in proc.stdout, output
    # The quickstart printed one summary per paper, in input order.
    papers = [line.split(" -> ")[0] for line in proc.stdout.splitlines() if " -> " in line]
    assert papers[:3] == ["arXiv:2502.13965", "arXiv:2507.07400", "arXiv:2309.06180"], output
