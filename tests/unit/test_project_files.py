"""LICENSE matches pyproject's license; CHANGELOG follows Keep a Changelog and knows the version."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import langgraph_batch

ROOT = Path(__file__).resolve().parents[2]


def test_license_matches_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "MIT"}
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    holders = {a["name"] for a in project["authors"]}
    assert any(f"Copyright (c) 2026 {h}" in text for h in holders)
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text


def test_changelog_has_unreleased_and_the_current_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "[Keep a Changelog]" in text
    versions = re.findall(r"^## \[([^\]]+)\]", text, flags=re.M)
    assert versions[0] == "Unreleased"
    assert langgraph_batch.__version__ in versions
    for version in versions:  # every heading has its link reference
        assert re.search(rf"^\[{re.escape(version)}\]: https://", text, flags=re.M), version
    for section in re.findall(r"^### (.+)$", text, flags=re.M):
        assert section in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
