"""Fixtures shared by several test packages.

- ``image_build`` (session): the product image built by scripts/build-image.sh once per test run.
  tests/k8s/test_image.py and tests/kubelet both use the image; building it twice cost a second
  wheel build and ``docker build`` (20-40 s on the 2-core CI machine) for the same sources. Each
  user still decides what a failed build means (a skip there, a failure here) and still stops
  a Docker engine it had to start; :meth:`ImageBuild.engine` starts it again for a later user.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD_IMAGE_SH = REPO / "scripts" / "build-image.sh"
IMAGE = os.environ.get("KK_IMAGE", "kraftkeeper:dev")


@dataclass(frozen=True)
class ImageBuild:
    """The outcome of this run's one ``scripts/build-image.sh build``."""

    image: str
    returncode: int
    stderr: str

    def engine(self) -> subprocess.CompletedProcess[str]:
        """Start the Docker engine if it is not running (a user before this one may have
        stopped the engine it had started): ``scripts/build-image.sh engine``, quick when
        it runs."""
        return subprocess.run(["bash", str(BUILD_IMAGE_SH), "engine"], capture_output=True, text=True,
                              timeout=300)


@pytest.fixture(scope="session")
def image_build() -> ImageBuild:
    proc = subprocess.run(["bash", str(BUILD_IMAGE_SH), "build"], capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "KK_IMAGE": IMAGE})
    return ImageBuild(IMAGE, proc.returncode, proc.stderr)
