"""Real Apache Kafka 4.x controllers on loopback for the Kafka tests.

The jars come from scripts/kafka.sh (run here if the cache lacks them; ``./dev.sh test`` runs it
too). A test is skipped only where no JVM can be had at all, and never when ``CI`` is set; a
failed download is an error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kraftkeeper_operator.kafka.cluster import KafkaControllers, kafka_libs, kafka_tools_libs

REPO = Path(__file__).resolve().parents[2]


def _libs() -> Path:
    if shutil.which("java") is None:
        why = "no Java runtime on this machine (scripts/install-system.sh installs Java 17)"
        if os.environ.get("CI"):  # Never skipped in CI, where a JVM can always be had
            pytest.fail(f"{why}; CI is set, so the real-Kafka tests must run")
        pytest.skip(why)
    libs = kafka_libs()
    if libs is None or kafka_tools_libs() is None:
        out = subprocess.run(
            [str(REPO / "scripts" / "kafka.sh"), "install"], capture_output=True, text=True, timeout=900
        )
        assert out.returncode == 0, f"scripts/kafka.sh install failed:\n{out.stdout}\n{out.stderr}"
        libs = kafka_libs()
    assert libs is not None, "scripts/kafka.sh install left no complete libs directory"
    return libs


@pytest.fixture(scope="session")
def kafka_jars() -> Path:
    return _libs()


@pytest.fixture
def kafka_controllers(tmp_path: Path, kafka_jars: Path) -> Iterator[KafkaControllers]:
    """Three formatted and started controllers (auto-join off: the watcher heals them)."""
    k = KafkaControllers(tmp_path / "kafka", kafka_jars)
    with k.running():
        yield k
