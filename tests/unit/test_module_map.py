"""The module map in docs/development.md names every module, and only modules that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "langgraph_batch"
MAP = ROOT / "docs" / "development.md"

# Listed as packages only: their own pages describe their insides.
APPLICATIONS = {"bench", "emulator"}

_ROW = re.compile(r"^\| `([^`]+)` \|", flags=re.M)


def _map_entries() -> list[str]:
    text = MAP.read_text()
    start = text.index("\n## Module map\n")
    end = text.find("\n## ", start + 1)
    return _ROW.findall(text[start : end if end != -1 else len(text)])


def _required() -> set[str]:
    """Every root module, every subpackage, every module of a library subpackage."""
    needed = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        top = rel.parts[0]
        if len(rel.parts) == 1:
            needed.add(top)
            continue
        needed.add(f"{top}/")
        if top not in APPLICATIONS and path.name != "__init__.py":
            needed.add(rel.as_posix())
    return needed


def test_the_map_reads_rows() -> None:
    entries = _map_entries()
    assert "chat_model/_model.py" in entries
    assert "scheduler/" in entries
    assert "__init__.py" in entries


def test_every_module_is_on_the_map() -> None:
    missing = sorted(_required() - set(_map_entries()))
    assert missing == [], f"add them to the module map in docs/development.md: {missing}"


def test_every_entry_exists_once() -> None:
    entries = _map_entries()
    assert len(entries) == len(set(entries)), "an entry is listed twice"
    gone = [e for e in entries if not (PACKAGE / e).exists()]
    assert gone == [], f"the module map names modules that do not exist: {gone}"
    dirs = [e for e in entries if e.endswith("/")]
    assert all((PACKAGE / d / "__init__.py").is_file() for d in dirs), dirs
