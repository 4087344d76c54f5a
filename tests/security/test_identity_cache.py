"""The cost side of TLS: a node parses a peer certificate's identity once and reuses
it for every request with that certificate, still checking its validity period per request;
it issues no session tickets and negotiates TLS 1.3 with an AEAD suite. Real handshakes over
memory BIOs, real certificates from the cluster PKI."""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path
from typing import Any

import pytest

from quorum.security.pki import identity_from_peercert, peercert_validity
from quorum.security.tlsctx import PeerIdentities, client_context, server_context
from quorum.types import ErrorCode, KraftError
from tests.security.conftest import CLUSTER, Pki


class _Transport:
    """What the middleware reads from an asyncio transport: ``get_extra_info("ssl_object")``."""

    def __init__(self, obj: ssl.SSLObject | None) -> None:
        self.obj = obj

    def get_extra_info(self, name: str) -> Any:
        return self.obj if name == "ssl_object" else None


def _handshake(pki: Pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLObject:
    """A completed TLS handshake between a node's server context and a client; the server's
    side of the connection."""
    sctx = server_context(pki.dir / "ca.crt", *pki.node(1))
    cctx = client_context(pki.dir / "ca.crt", cert, key)
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    server = sctx.wrap_bio(s_in, s_out, server_side=True)
    client = cctx.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    done = {"c": False, "s": False}
    for _ in range(10):
        for side, obj, src, dst in (("c", client, c_out, s_in), ("s", server, s_out, c_in)):
            if not done[side]:
                try:
                    obj.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
            dst.write(src.read())
        if all(done.values()):
            break
    assert all(done.values()), "handshake did not complete"
    # TLS 1.3: the client's certificate is checked once the server has read its Finished
    client.write(b"ping")
    s_in.write(c_out.read())
    assert server.read(10) == b"ping"
    return server


def test_identity_parsed_once_per_certificate(pki: Pki) -> None:
    cache = PeerIdentities()
    conns = [_handshake(pki, *pki.client("readwrite")) for _ in range(2)]
    want = identity_from_peercert(conns[0].getpeercert())
    assert want.role == "readwrite" and want.cluster_id == CLUSTER
    for obj in conns * 3:
        assert cache.of_transport(_Transport(obj)) == want
    # two connections with the same certificate: one entry
    assert len(cache._known) == 1
    node = _handshake(pki, *pki.node(2))
    assert cache.of_transport(_Transport(node)) == identity_from_peercert(node.getpeercert())
    assert len(cache._known) == 2


def test_validity_checked_on_every_request_also_when_cached(pki: Pki) -> None:
    cache = PeerIdentities()
    obj = _handshake(pki, *pki.client("read"))
    nb, na = peercert_validity(obj.getpeercert())
    assert cache.of_transport(_Transport(obj)) is not None  # cached now
    second = dt.timedelta(seconds=1)
    for when, words in ((na + second, "expired"), (nb - second, "not valid before")):
        with pytest.raises(KraftError) as e:
            cache.of_transport(_Transport(obj), now=when)
        assert e.value.code is ErrorCode.UNAUTHENTICATED and words in e.value.message
    # a first sight after expiry is refused as well (nothing cached for it)
    with pytest.raises(KraftError, match="expired"):
        PeerIdentities().of_transport(_Transport(obj), now=na + dt.timedelta(days=1))


def test_no_certificate_or_plaintext_is_no_identity(pki: Pki) -> None:
    cache = PeerIdentities()
    assert cache.of_transport(_Transport(_handshake(pki))) is None
    assert cache.of_transport(_Transport(None)) is None
    assert cache.of_transport(None) is None
    assert cache._known == {}


def test_cache_is_bounded(pki: Pki) -> None:
    cache = PeerIdentities(max_entries=2)
    objs = [_handshake(pki, *pki.node(i)) for i in (1, 2, 3)]
    for obj in objs:
        cache.of_transport(_Transport(obj))
        assert len(cache._known) <= 2
    assert cache.of_transport(_Transport(objs[0])) is not None


def test_server_issues_no_tickets_and_prefers_tls13_aead(pki: Pki) -> None:
    ctx = server_context(pki.dir / "ca.crt", *pki.node(1))
    assert ctx.num_tickets == 0
    assert ctx.minimum_version is ssl.TLSVersion.TLSv1_2
    # TLS 1.2 suites: forward-secret AEAD only
    for c in ctx.get_ciphers():
        if c["protocol"] == "TLSv1.2":
            assert c["kea"] == "kx-ecdhe" and c["aead"], c["name"]
    obj = _handshake(pki, *pki.client("read"))
    version, cipher = obj.version(), obj.cipher()
    assert version == "TLSv1.3" and cipher is not None and ("GCM" in cipher[0] or "CHACHA20" in cipher[0])
