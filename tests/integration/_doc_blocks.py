"""Extract the runnable Python blocks of Markdown pages and run them (the test's subprocess side).

The pages are the README and every page of `docs/`. The convention, written
for their authors (also in `docs/development.md`):

- A fenced ```` ```python ```` block directly preceded by `<!-- test: run -->`
  runs in the test. Blocks without the marker are illustrations and are not
  run (`test_doc_blocks.py` lists the few that are allowed).
- A page's runnable blocks run in page order, in ONE namespace, in a process
  of their own whose environment points `BACKEND_URL` / `MODEL` at an
  emulator (and `OPENAI_BASE_URL` / `OPENAI_API_KEY` at a second one, for the
  cloud example). A later block may use what an earlier one defined, as a
  reader working through the page would. Top-level `await` is allowed (as in
  a notebook or `python -m asyncio`); all blocks of a page share one event
  loop.
- A page that builds on another page's example says so with
  `<!-- test: continues other.md -->` (a path relative to the page): the
  other page's blocks run first, in the same namespace and loop.
- The marker may carry hidden setup code after `test: run` (for a reference
  snippet that assumes, say, a `read_file` tool the prose only mentions), and
  the block may be followed by `<!-- test: check ... -->` with hidden
  assertions. The quickstarts take no hidden setup: they run as written.

Run as `python -m tests.integration._doc_blocks README.md docs/index.md ...`:
each page runs in a forked child of one interpreter that has already
imported the heavy libraries (a fresh process per page, without paying the
imports again). It prints `<page> block at line N ok` per block, and on a
failure a traceback that points at the page's own line numbers; it goes on
with the other pages and exits non-zero if any failed.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import os
import re
import sys
import textwrap
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ("Block", "continues", "extract_blocks", "main", "python_fences")

_RUN = re.compile(r"^<!--\s*test:\s*run\b(?P<setup>.*?)-->\s*$", re.S)
_CHECK = re.compile(r"^<!--\s*test:\s*check\b(?P<check>.*?)-->\s*$", re.S)
_CONTINUES = re.compile(r"^<!--\s*test:\s*continues\s+(?P<page>\S+)\s*-->\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    """One runnable block of a page."""

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
    """Hidden code of a marker comment and the page line its first line is on."""
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
    fenced = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if line.startswith("#") and not fenced:
            section = line.lstrip("#").strip()
        if not line.startswith("<!-- test: run"):
            i += 1
            continue
        comment, after = _comment(lines, i)
        marker = _RUN.match(comment)
        if marker is None or after >= len(lines) or lines[after].strip() != "```python":
            raise ValueError(f"line {i + 1}: `<!-- test: run -->` must precede ```python")
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
                raise ValueError(f"line {end + 2}: malformed `<!-- test: check -->`")
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


def python_fences(text: str) -> list[tuple[int, bool]]:
    """Every ```` ```python ```` fence of a page: (1-based line, whether it runs)."""
    lines = text.splitlines()
    out: list[tuple[int, bool]] = []
    for i, line in enumerate(lines):
        if line.strip() != "```python":
            continue
        runs = False
        if i > 0 and lines[i - 1].rstrip().endswith("-->"):
            j = i - 1
            while j > 0 and not lines[j].startswith("<!--"):
                j -= 1  # up to the start of a multi-line marker
            runs = lines[j].startswith("<!-- test: run")
        out.append((i + 1, runs))
    return out


def continues(text: str) -> list[str]:
    """The pages a page continues (`<!-- test: continues other.md -->`), in order."""
    return [m.group("page") for line in text.splitlines() if (m := _CONTINUES.match(line))]


def _run_piece(
    source: str, line: int, filename: str, ns: dict[str, Any], loop: asyncio.AbstractEventLoop
) -> None:
    if not source.strip():
        return
    # Pad so that tracebacks name the page's own line numbers.
    padded = "\n" * (line - 1) + source
    code = compile(padded, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & inspect.CO_COROUTINE:
        loop.run_until_complete(eval(code, ns))  # the page's own code
    else:
        exec(code, ns)  # the page's own code


def _run_blocks(
    path: Path, label: str, ns: dict[str, Any], loop: asyncio.AbstractEventLoop, seen: set[Path]
) -> None:
    """Run `path`'s blocks (after the pages it continues) in `ns`; `label` names the page run."""
    path = path.resolve()
    if path in seen:
        raise ValueError(f"{path}: `test: continues` goes round in a circle")
    seen = seen | {path}
    text = path.read_text()
    for other in continues(text):
        _run_blocks(path.parent / other, label, ns, loop, seen)
    name = os.path.relpath(path)
    for block in extract_blocks(text):
        where = f"{name} block at line {block.line}"
        prefix = "" if name == label else f"{label}: "
        print(f"{prefix}{where} ({block.section}): running", flush=True)
        _run_piece(block.setup, block.setup_line, f"{name} (hidden setup)", ns, loop)
        _run_piece(block.code, block.line, name, ns, loop)
        _run_piece(block.check, block.check_line, f"{name} (hidden check)", ns, loop)
        print(f"{prefix}{where} ok", flush=True)


def run_page(path: Path) -> int:
    """Run one page's blocks in a fresh namespace and event loop; 0 when all passed."""
    label = os.path.relpath(path.resolve())
    ns: dict[str, Any] = {"__name__": "__docs__"}
    loop = asyncio.new_event_loop()
    try:
        _run_blocks(path, label, ns, loop, set())
    except BaseException:
        traceback.print_exc()
        print(f"{label} FAILED", flush=True)
        return 1
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


def _preimport() -> None:
    """Import what every page imports once, before the pages' processes fork."""
    for module in ("langgraph_batch", "langgraph.graph", "langchain.agents", "langchain_openai"):
        with contextlib.suppress(ImportError):
            __import__(module)


def main(argv: list[str] | None = None) -> int:
    """Run every page named in `argv` (default README.md), each in a process of its own."""
    args = sys.argv[1:] if argv is None else argv
    paths = [Path(a) for a in (args or ["README.md"])]
    _preimport()
    failed: list[str] = []
    for path in paths:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the page's own process
            code = 1
            try:
                code = run_page(path)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            failed.append(str(path))
    if failed:
        print("pages that failed: " + ", ".join(failed), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
