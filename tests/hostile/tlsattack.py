"""What the TLS half of the hostile-peer suite shares (tests/hostile/test_tls_*.py): the committed
keys the cluster starts with, the client contexts of every kind of credential (none, another
cluster's certificate, another CA's, an expired one, replica 3's claiming to be replica 2, a
non-voter's), the cluster they attack (:func:`running_tls_cluster`: three TLS nodes with the
node's own timeouts and the committed keys; the package fixture ``tls_cluster`` of
tests/hostile/conftest.py), and the checks every test ends with (the nodes serving, the committed
keys intact, the voter set unchanged)."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from typing import Any

import pytest

from quorum.security.pki import peer_hostname
from quorum.security.tlsctx import client_context
from tests.hostile.fakes import NODE_DEFAULT_TIMEOUTS, assert_intact, request, rpc
from tests.tlsfixtures import CLUSTER, TlsCluster, make_tls_dir

KEYS = {f"tls-committed-{i}": f"value-{i}".encode() for i in range(5)}


def running_tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    """Three TLS nodes (the node's own, KRaft's, election and fetch timeouts, as in the plaintext
    half) holding :data:`KEYS`, stopped when the generator is closed. The TLS directory also
    holds the wrong credentials and a valid identity of replica 7, which is not a voter."""
    tls = make_tls_dir(tmp_path_factory.mktemp("tls"), nodes=(1, 2, 3, 7))
    c = TlsCluster(tmp_path_factory.mktemp("nodes"), tls)
    assert c.config_path is not None
    cfg = json.loads(c.config_path.read_text())
    cfg["raft"].update(NODE_DEFAULT_TIMEOUTS["raft"])
    c.config_path.write_text(json.dumps(cfg))
    c.up()
    try:
        c.state(60)
        for k, v in KEYS.items():
            c.call_as("rw.json", lambda q, k=k, v=v: q.put(k, v))
        yield c
    finally:
        c.stop()


def call(c: TlsCluster, cfg: str, fn: Any) -> Any:
    return c.call_as(cfg, fn)


def state_of(c: TlsCluster, timeout: float = 60) -> dict[str, Any]:
    return c.state(timeout)


def intact(c: TlsCluster, before: dict[str, Any], *, same_leader: bool = True) -> None:
    assert_intact(
        before,
        state_of(c),
        [c.endpoint(i) for i in c.procs],
        KEYS,
        lambda k: call(c, "read.json", lambda q: q.get(k)),
        lambda k, v: call(c, "rw.json", lambda q: q.put(k, v)),
        same_leader=same_leader,
        ctx=client_context(c.tls / "ca.crt"),
    )


def ctx_as(c: TlsCluster, who: str) -> ssl.SSLContext:
    """A client context presenting the named credential."""
    ca = c.tls / "ca.crt"
    d = c.tls
    files = {
        "none": None,
        "foreign": (d / "foreign" / "node-2.crt", d / "foreign" / "node-2.key"),
        "other-ca": (d / "other-ca" / "node-2.crt", d / "other-ca" / "node-2.key"),
        "expired": (d / "expired" / "node-2.crt", d / "expired" / "node-2.key"),
        "node-3": (d / "node-3.crt", d / "node-3.key"),
        "node-7": (d / "node-7.crt", d / "node-7.key"),
        "read": (d / "read.crt", d / "read.key"),
    }[who]
    return client_context(ca) if files is None else client_context(ca, *files)


BAD_PEERS = ("none", "foreign", "other-ca", "expired", "node-3")


def refused(c: TlsCluster, node: int, who: str, msg: Any) -> str:
    """Send ``msg`` to ``node`` as ``who``; the refusal seen ("tls" if the handshake failed)."""
    try:
        status, obj = rpc(
            c.endpoint(node), msg, ctx=ctx_as(c, who), server_hostname=peer_hostname(CLUSTER, node)
        )
    except (ssl.SSLError, ConnectionError):
        return "tls"
    assert status in (401, 403), (who, status, obj)
    return str(obj["error_code"])


def admin_raw(c: TlsCluster, ep: str, body: bytes) -> tuple[int, Any]:
    ctx = client_context(c.tls / "ca.crt", c.tls / "admin.crt", c.tls / "admin.key")
    return request(ep, "POST", "/v1/quorum/reassign", body, ctx=ctx)
