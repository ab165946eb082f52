from __future__ import annotations

import pytest

from tests.fakes.http import Recorder


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()
