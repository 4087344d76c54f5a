"""Fixtures of the hostile-peer suite: the TLS cluster both TLS modules (test_tls_peers.py,
test_tls_clients.py) attack, one for the package: starting three TLS nodes per module would double
that setup."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.hostile.tlsattack import running_tls_cluster
from tests.tlsfixtures import TlsCluster


@pytest.fixture(scope="package")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    yield from running_tls_cluster(tmp_path_factory)
