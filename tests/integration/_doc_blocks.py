"""Extract the README's runnable Python blocks and run them (the test's subprocess side).

The convention, written for README authors:

- A fenced ```` ```python ```` block directly preceded by `<!-- test: run -->`
  runs in the README test. Blocks without the marker are illustrations and
  are not run.
- Runnable blocks run in README order, in ONE namespace, in a fresh
  interpreter whose environment points `BACKEND_URL` / `MODEL` at an emulator
  (and `OPENAI_BASE_URL` / `OPENAI_API_KEY` at a second one, for the cloud
  example). A later block may use what an earlier one defined, as a reader
  working through the page would. Top-level `await` is allowed (as in a
  notebook or `python -m asyncio`); all blocks share one event loop.
- The marker may carry hidden setup code after `test: run` (for a reference
  snippet that assumes, say, a `read_file` tool the prose only mentions), and
  the block may be followed by `<!-- test: check ... -->` with hidden
  assertions. The Quickstart block takes no hidden setup: it must run as
  written.

Run as `python -m tests.integration._readme README.md`; it prints one
`README block at line N ok` line per block and exits non-zero on the first
failure, with a traceback that points at the README's own line numbers.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ("Block", "extract_blocks", "main")

_RUN = re.compile(r"^<!--\s*test:\s*run\b(?P<setup>.*?)-->\s*$", re.S)
_CHECK = re.compile(r"^<!--\s*test:\s*check\b(?P<check>.*?)-->\s*$", re.S)


@dataclass(frozen=True, slots=True)
class Block:
    """One runnable block of the README."""

    line: int
    """1-based line of the block's first code line."""
    section: str
    """The nearest `#` heading above it."""
    code: str
    setup: str = ""
    setup_line: int = 0
    check: str = ""
    check_line: int = 0


def _comment(lines: list[str], start: int) -> tuple[str, int]:
    """The HTML comment starting at `start` (possibly multi-line) and the index after it."""
    end = start
    while "-->" not in lines[end]:
        end += 1
    return "\n".join(lines[start : end + 1]), end + 1


def _hidden(raw: str, line: int) -> tuple[str, int]:
    """Hidden code of a marker comment and the README line its first line is on."""
    lead = raw[: len(raw) - len(raw.lstrip())]
    return textwrap.dedent(raw).strip(), line + lead.count("\n")


def extract_blocks(text: str) -> list[Block]:
    """The `<!-- test: run -->` blocks of a Markdown text, in order.

    Raises:
        ValueError: A marker not followed by a python fence (a typo would
            otherwise silently drop a block from the test).
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        if not line.startswith("<!-- test: run"):
            i += 1
            continue
        comment, after = _comment(lines, i)
        marker = _RUN.match(comment)
        if marker is None or after >= len(lines) or lines[after].strip() != "```python":
            raise ValueError(f"README line {i + 1}: `<!-- test: run -->` must precede ```python")
        setup, setup_line = _hidden(marker.group("setup"), i + 1)
        start = after + 1
        end = start
        while lines[end].strip() != "```":
            end += 1
        check, check_line = "", 0
        if end + 1 < len(lines) and lines[end + 1].startswith("<!-- test: check"):
            check_comment, _ = _comment(lines, end + 1)
            found = _CHECK.match(check_comment)
            if found is None:
                raise ValueError(f"README line {end + 2}: malformed `<!-- test: check -->`")
            check, check_line = _hidden(found.group("check"), end + 2)
        blocks.append(
            Block(
                line=start + 1,
                section=section,
                code="\n".join(lines[start:end]),
                setup=setup,
                setup_line=setup_line,
                check=check,
                check_line=check_line,
            )
        )
        i = end + 1
    return blocks


def _run_piece(
    source: str, line: int, filename: str, ns: dict[str, Any], loop: asyncio.AbstractEventLoop
) -> None:
    if not source.strip():
        return
    # Pad so that tracebacks name the README's own line numbers.
    padded = "\n" * (line - 1) + source
    code = compile(padded, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & inspect.CO_COROUTINE:
        loop.run_until_complete(eval(code, ns))  # the README's own code
    else:
        exec(code, ns)  # the README's own code


def main(argv: list[str] | None = None) -> int:
    """Run every runnable block of the README named in `argv` (default README.md)."""
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0] if args else "README.md")
    blocks = extract_blocks(path.read_text())
    ns: dict[str, Any] = {"__name__": "__readme__"}
    loop = asyncio.new_event_loop()
    try:
        for block in blocks:
            print(f"README block at line {block.line} ({block.section}): running", flush=True)
            _run_piece(block.setup, block.setup_line, f"{path.name} (hidden setup)", ns, loop)
            _run_piece(block.code, block.line, path.name, ns, loop)
            _run_piece(block.check, block.check_line, f"{path.name} (hidden check)", ns, loop)
            print(f"README block at line {block.line} ok", flush=True)
    finally:
        # Schedulers' runner tasks live on the loop: stop them before closing it.
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
