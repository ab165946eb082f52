"""The research harness (`benchmarks.extension.Research`) installed for one test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.extension import Research, research


@pytest.fixture
def with_research() -> Iterator[Research]:
    with research() as ext:
        yield ext
