"""TLS test fixtures shared by tests/security, tests/hostile and the process tests: the cluster
PKI of :mod:`testkit.tls` (re-exported here) and a :class:`~tests.engine.cluster.LocalCluster`
whose nodes start with ``--tls-dir``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quorum.client import QuorumClient
from quorum.security.clientconfig import load_client_config
from testkit.polling import wait_until
from testkit.tls import CLUSTER, issue_wrong_credentials, make_tls_dir
from tests.engine.cluster import LocalCluster

__all__ = ["CLUSTER", "TlsCluster", "issue_wrong_credentials", "make_tls_dir"]


class TlsCluster(LocalCluster):
    """LocalCluster whose nodes start with ``--tls-dir`` (cluster id :data:`CLUSTER`)."""

    def __init__(self, root: Path, tls: Path, config: dict[str, Any] | None = None) -> None:
        super().__init__(root, 3, config=config, cluster_id=CLUSTER)
        self.tls = tls

    def start_args(self, i: int) -> list[str]:
        return ["--tls-dir", str(self.tls)]

    def call_as(self, cfg: str, fn: Callable[[QuorumClient], Any]) -> Any:
        """``fn`` with a client of the client config ``cfg`` in the TLS directory."""

        async def go() -> Any:
            config = load_client_config(self.tls / cfg)
            async with QuorumClient(self.bootstrap, timeout=30, client_config=config) as q:
                return await fn(q)

        return asyncio.run(go())

    def state(self, timeout: float = 60) -> dict[str, Any]:
        """The admin's describe once a leader with a committed high watermark is known."""

        def find() -> dict[str, Any] | None:
            d: dict[str, Any] = self.call_as("admin.json", lambda q: q.describe())
            return d if d.get("leader_id", -1) >= 0 and d.get("high_watermark", 0) > 0 else None

        return dict(wait_until("a leader over TLS", find, timeout, errors=(Exception,)))
