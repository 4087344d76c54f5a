"""TLS test fixtures shared by tests/security, tests/hostile and the process tests: a cluster
PKI in a directory (the CA, node and client certificates, a readwrite bearer token, client
configs, and the wrong credentials an attacker would present), and a
:class:`~tests.engine.cluster.LocalCluster` whose nodes start with ``--tls-dir``."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from quorum.client import QuorumClient
from quorum.security.clientconfig import load_client_config
from quorum.security.pki import CertificateAuthority, init_ca, issue_client, issue_node
from quorum.security.tokens import TOKENS_FILE, TokenStore
from tests.engine.cluster import LocalCluster, poll

CLUSTER = "tls-cluster"


def issue_wrong_credentials(ca: CertificateAuthority, directory: Path) -> CertificateAuthority:
    """Node certificates for replica 2 that must all be refused by ``ca``'s cluster:
    ``foreign/`` (same CA, another cluster's identity: a CA shared by two clusters),
    ``expired/`` (right CA, validity over) and ``other-ca/`` (another cluster's CA, returned)."""
    foreign = dataclasses.replace(ca, cluster_id="other", directory=directory / "foreign")
    foreign.directory.mkdir()
    issue_node(foreign, 2)
    past = dataclasses.replace(ca, directory=directory / "expired")
    past.directory.mkdir()
    issue_node(past, 2, days=1, now=dt.datetime.now(dt.UTC) - dt.timedelta(days=3))
    other_ca = init_ca(directory / "other-ca", "other")
    issue_node(other_ca, 2)
    return other_ca


def make_tls_dir(directory: Path, nodes: Iterable[int] = (1, 2, 3), cluster_id: str = CLUSTER) -> Path:
    """A ``--tls-dir`` for ``nodes``: ``ca.crt``, ``node-N.crt/.key``, client certificates and
    configs ``admin.json`` and ``read.json``, a readwrite token ``rw.token`` with ``rw.json``
    and ``tokens.json``, plus :func:`issue_wrong_credentials`."""
    ca = init_ca(directory, cluster_id)
    for i in nodes:
        issue_node(ca, i)
    for role in ("admin", "read"):
        issue_client(ca, role, role)
        (directory / f"{role}.json").write_text(
            json.dumps({"ca_file": "ca.crt", "cert_file": f"{role}.crt", "key_file": f"{role}.key"})
        )
    store = TokenStore(path=directory / TOKENS_FILE)
    (directory / "rw.token").write_text(store.add("writer", "readwrite"))
    store.save()
    (directory / "rw.json").write_text(json.dumps({"ca_file": "ca.crt", "token_file": "rw.token"}))
    issue_wrong_credentials(ca, directory)
    return directory


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

        return dict(poll(find, timeout, "a leader over TLS"))
