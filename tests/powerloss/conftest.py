"""Fixtures of the power-loss tests: the powerfs binary, and mounts unmounted after the test.

powerfs is built by scripts/powerfs.sh (run here if needed; ``./dev.sh install`` runs it too).
The tests are skipped only where this machine has no FUSE device, and never when ``CI`` is set.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.powerloss.powerfs import PowerFs, build_powerfs, fuse_missing


@pytest.fixture(scope="session")
def powerfs_bin() -> Path:
    why = fuse_missing()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI is set, so the power-loss tests must run")
        pytest.skip(why)
    return build_powerfs()


@pytest.fixture
def mount_powerfs(powerfs_bin: Path, tmp_path: Path) -> Iterator[Callable[[str], PowerFs]]:
    """``mount_powerfs(name)``: a new powerfs mount under the test's directory."""
    mounts: list[PowerFs] = []

    def mount(name: str) -> PowerFs:
        fs = PowerFs(powerfs_bin, tmp_path, name)
        mounts.append(fs)
        return fs.mount()

    yield mount
    for fs in reversed(mounts):
        fs.unmount()
