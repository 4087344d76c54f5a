"""Fixtures of the power-loss tests: the powerfs binary, mounts unmounted after the test, and a
TLS cluster on them (stopped before its disks are unmounted).

powerfs is built by scripts/powerfs.sh (run here if needed; ``./dev.sh install`` runs it too).
The tests are skipped only where this machine has no FUSE device, and never when ``CI`` is set.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.powerloss.cluster import PowerCluster
from tests.powerloss.powerfs import PowerFs, build_powerfs, fuse_missing
from tests.tlsfixtures import make_tls_dir


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


@pytest.fixture
def power_cluster(
    tmp_path: Path, mount_powerfs: Callable[[str], PowerFs]
) -> Iterator[Callable[[dict[str, Any]], PowerCluster]]:
    """``power_cluster(config)``: a formatted 3-node TLS cluster on powerfs disks, not started."""
    clusters: list[PowerCluster] = []

    def make(config: dict[str, Any]) -> PowerCluster:
        tls = make_tls_dir(tmp_path / "tls")
        c = PowerCluster(tmp_path, tls, mount_powerfs, config)
        clusters.append(c)
        for i in c.ports:
            c.format(i)
        return c

    yield make
    for c in clusters:
        c.stop()
