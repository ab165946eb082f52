from __future__ import annotations

import pytest

from tests.unit.backends._fakes import Recorder


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()
