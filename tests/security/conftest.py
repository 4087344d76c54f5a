"""A cluster PKI made once per test module: CA, node certificates, client certificates, tokens,
and the wrong credentials of ``tests.tlsfixtures`` (``foreign/``, ``expired/``, ``other-ca/``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from quorum.security.pki import CertificateAuthority, init_ca, issue_client, issue_node
from quorum.security.tokens import TOKENS_FILE, TokenStore
from tests.tlsfixtures import issue_wrong_credentials

CLUSTER = "c1"


@dataclass
class Pki:
    dir: Path
    ca: CertificateAuthority
    other_ca: CertificateAuthority
    tokens: TokenStore
    token: dict[str, str]  # role -> bearer token

    def node(self, i: int) -> tuple[Path, Path]:
        return self.dir / f"node-{i}.crt", self.dir / f"node-{i}.key"

    def client(self, name: str) -> tuple[Path, Path]:
        return self.dir / f"{name}.crt", self.dir / f"{name}.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pki]:
    d = tmp_path_factory.mktemp("pki")
    ca = init_ca(d, CLUSTER)
    for i in (1, 2, 3):
        issue_node(ca, i)
    for role in ("admin", "readwrite", "read"):
        issue_client(ca, role, role)
    other_ca = issue_wrong_credentials(ca, d)
    store = TokenStore(path=d / TOKENS_FILE)
    tokens = {role: store.add(f"tok-{role}", role) for role in ("admin", "readwrite", "read")}
    store.save()
    yield Pki(d, ca, other_ca, TokenStore.load(d / TOKENS_FILE), tokens)
