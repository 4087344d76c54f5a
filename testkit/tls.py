"""A cluster PKI in a directory, for tests and benchmarks: the CA, node and client certificates,
a readwrite bearer token, client configs, and the wrong credentials an attacker would present."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterable
from pathlib import Path

from quorum.security.pki import CertificateAuthority, init_ca, issue_client, issue_node
from quorum.security.tokens import TOKENS_FILE, TokenStore

__all__ = ["CLUSTER", "issue_wrong_credentials", "make_tls_dir"]

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
