"""The runnable Python blocks of the README and of every `docs/` page run as written.

Which blocks run, and how, is the convention in `tests/integration/_doc_blocks.py`
(`<!-- test: run -->` before a python fence; `<!-- test: continues index.md -->`
for a page that builds on another). The pages run in a fresh process each, as a
user would run them, with `BACKEND_URL` / `MODEL` pointing at one emulator and
`OPENAI_BASE_URL` at a second one serving a cloud-style model name for the
degraded-mode (ChatOpenAI) example.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration._doc_blocks import Block, continues, extract_blocks, python_fences

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
QUICKSTART_MODEL = "Qwen/Qwen2.5-7B-Instruct"
CLOUD_MODEL = "gpt-4.1-mini"

# Python blocks that are illustrations, not run: (page, the block's first code line as written).
NOT_RUN = {
    # Exports spans to an OTLP collector (an exporter package and a collector the tests lack);
    # the next block shows the same spans kept in memory, and runs.
    ("docs/observability.md", "from opentelemetry import trace"),
}

# Pages whose main example must run (page, heading text of a section with a runnable block).
MUST_RUN = (
    ("README.md", "Example"),
    ("docs/index.md", "Quickstart"),
    ("docs/batched-chat-model.md", "BatchedChatModel"),
    ("docs/scheduler.md", "The scheduler: `Scheduler` and `BatchPolicy`"),
    ("docs/fan-out.md", "fan_out"),
    ("docs/tools.md", "Tools: `coalesce`, `BatchToolNode`, `BatchMiddleware`"),
    ("docs/backends.md", "Any LangChain chat model (degraded mode)"),
    ("docs/router.md", "Turning the key off, or sending it elsewhere"),
    ("docs/observability.md", "Prometheus"),
    ("docs/measure-your-own-job.md", "Measure your own job"),
)


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def _blocks(page: Path) -> list[Block]:
    return extract_blocks(page.read_text())


def test_every_python_block_runs_or_is_a_listed_illustration() -> None:
    not_run: set[tuple[str, str]] = set()
    for page in _pages():
        lines = page.read_text().splitlines()
        for line, runs in python_fences(page.read_text()):
            if not runs:
                not_run.add((_name(page), lines[line].strip()))
    assert not_run == NOT_RUN


def test_marked_blocks_cover_the_main_examples() -> None:
    for page, section in MUST_RUN:
        sections = [b.section for b in _blocks(REPO / page)]
        assert section in sections, (page, section, sections)
    for page in (README, DOCS / "index.md"):
        blocks = _blocks(page)
        quick = blocks[0]  # first: nothing defined before it
        assert quick.setup == ""  # runs as written, no hidden setup
        assert continues(page.read_text()) == []
        assert "create_react_agent" not in quick.code  # deprecated in LangGraph 1.x
        assert "from langchain.agents import create_agent" in quick.code
        assert "BACKEND_URL" in quick.code


def test_continued_pages_exist() -> None:
    for page in _pages():
        for other in continues(page.read_text()):
            assert (page.parent / other).is_file(), (page, other)


def test_extract_blocks_convention() -> None:
    text = "\n".join(
        [
            "# A",
            "<!-- test: continues index.md -->",
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
    assert (block.setup_line, block.line, block.check_line) == (4, 7, 10)
    assert continues(text) == ["index.md"]
    assert python_fences(text) == [(6, True), (12, False)]
    with pytest.raises(ValueError, match="must precede"):
        extract_blocks("<!-- test: run -->\n```bash\nls\n```")


@pytest.mark.timeout(300)
def test_doc_blocks_run_against_the_emulator(start_emulator: Callable[..., str]) -> None:
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
    pages = [p for p in _pages() if _blocks(p)]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration._doc_blocks", *map(_name, pages)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    for page in pages:
        for block in _blocks(page):
            assert f"{_name(page)} block at line {block.line} ok" in proc.stdout, output
    # The quickstarts printed their results, in input order.
    papers = [line.split(" -> ")[0] for line in proc.stdout.splitlines() if " -> " in line]
    assert papers[:3] == ["arXiv:2502.13965", "arXiv:2507.07400", "arXiv:2309.06180"], output
