from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.cluster import LocalCluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path, 3).up()
    try:
        yield c
    finally:
        c.stop()
