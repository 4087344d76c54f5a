"""The hostile-peer suite, TLS half, attacks from clients and connections: unauthorized admin
calls, decoding attacks with and without a certificate, half-open TLS connections, floods of
large bodies, and what open endpoints and strangers get, against three real node processes with
mutual TLS (the package's ``tls_cluster``). Every test ends with the nodes serving, the committed
keys intact and the voter set unchanged."""

from __future__ import annotations

import json
import socket
import ssl
import time

import psutil
import pytest

from quorum.security.pki import peer_hostname
from quorum.security.tlsctx import client_context
from testkit.polling import wait_until
from tests.hostile.fakes import (
    Prober,
    assert_kept_leadership,
    assert_open_endpoints_reveal_no_uuid,
    buffered_body_bytes,
    fetch_header,
    frame,
    hold_large_bodies,
    http_metrics,
    request,
)
from tests.hostile.tlsattack import BAD_PEERS, KEYS, admin_raw, call, ctx_as, intact, state_of
from tests.tlsfixtures import CLUSTER, TlsCluster

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tls_cluster: TlsCluster) -> TlsCluster:
    return tls_cluster


def test_unauthenticated_and_unauthorized_reassign(cluster: TlsCluster) -> None:
    before = state_of(cluster)
    ep = cluster.endpoint(before["leader_id"])
    for body in (b'{"voters": [3]}', b'{"voters": [1000000000000000000000000000000]}'):
        for who in (*BAD_PEERS, "read"):
            try:
                status, obj = request(ep, "POST", "/v1/quorum/reassign", body, ctx=ctx_as(cluster, who))
            except (ssl.SSLError, ConnectionError):
                assert who in ("other-ca", "expired"), who
                continue
            want = (403, "PERMISSION_DENIED") if who in ("read", "node-3") else (401, "UNAUTHENTICATED")
            assert (status, obj["error_code"]) == want, (who, obj)
        status, obj = request(
            ep,
            "POST",
            "/v1/quorum/reassign",
            body,
            headers={"Authorization": "Bearer not-a-token"},
            ctx=ctx_as(cluster, "none"),
        )
        assert (status, obj["error_code"]) == (401, "UNAUTHENTICATED")
    status, obj = admin_raw(cluster, ep, b'{"voters": [1000000000000000000000000000000]}')
    assert status == 400 and "out of range" in obj["message"]
    intact(cluster, before)
    assert state_of(cluster)["target_voters"] is None


def test_decoding_attacks_with_and_without_a_certificate(cluster: TlsCluster) -> None:
    before = state_of(cluster)
    leader = before["leader_id"]
    follower = next(i for i in (1, 2, 3) if i != leader)
    hdr = fetch_header(CLUSTER, follower, before["leader_epoch"])
    valid = client_context(
        cluster.tls / "ca.crt", cluster.tls / f"node-{follower}.crt", cluster.tls / f"node-{follower}.key"
    )
    hn = peer_hostname(CLUSTER, leader)
    for body, needle in (
        (frame(json.dumps(dict(hdr, max_wait_ms=10**400)).encode()), "max_wait_ms"),
        (frame(b"[" * 5000 + b"]" * 5000), "nested deeper"),
    ):
        status, obj = request(
            cluster.endpoint(leader), "POST", "/raft/v1/fetch", body, ctx=valid, server_hostname=hn
        )
        assert status == 400 and needle in obj["message"], obj
        status, obj = request(
            cluster.endpoint(leader),
            "POST",
            "/raft/v1/fetch",
            body,
            ctx=ctx_as(cluster, "none"),
            server_hostname=hn,
        )
        assert (status, obj["error_code"]) == (401, "UNAUTHENTICATED")
    nested = b'{"voters": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    status, obj = admin_raw(cluster, cluster.endpoint(leader), nested)
    assert status == 400 and "nested deeper" in obj["message"]
    # keys are percent-decoded once: %2541 and A are two keys
    token = (cluster.tls / "rw.token").read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    anon = ctx_as(cluster, "none")
    ep = cluster.endpoint(leader)
    assert request(ep, "PUT", "/v1/kv/A", b"plain", ctx=anon, headers=auth)[0] == 200
    assert request(ep, "PUT", "/v1/kv/%2541", b"percent", ctx=anon, headers=auth)[0] == 200
    assert request(ep, "GET", "/v1/kv/A", ctx=anon, headers=auth)[1] == b"plain"
    assert request(ep, "GET", "/v1/kv/%2541", ctx=anon, headers=auth)[1] == b"percent"
    intact(cluster, before)


def test_half_open_tls_connections_are_closed(cluster: TlsCluster) -> None:
    """500 connections that never finish the TLS handshake (or send half a request) are closed
    by the handshake and head deadlines; the node serves meanwhile."""
    before = state_of(cluster)
    leader = before["leader_id"]
    port = cluster.ports[leader]
    socks = []
    try:
        for i in range(500):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            if i % 2:
                s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello cut short
            socks.append(s)
        assert call(cluster, "read.json", lambda q: q.get("tls-committed-0")) == KEYS["tls-committed-0"]
        proc = psutil.Process(cluster.procs[leader].pid)

        def open_count() -> int:
            return sum(
                1
                for conn in proc.net_connections(kind="tcp")
                if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_ESTABLISHED
            )

        wait_until(
            "the half-open TLS connections to be closed",
            lambda: open_count() < 20,
            60,
            0.5,
            errors=(Exception,),
        )
    finally:
        for s in socks:
            s.close()
    intact(cluster, before)


def test_many_large_bodies_over_tls_keep_memory_bounded_and_the_leader_leading(
    cluster: TlsCluster,
) -> None:
    """The 4 MiB-body flood of the plaintext half against a TLS node, by a client with a valid
    readwrite token (authenticated, so its bodies reach the body budget): 100 connections each
    holding a 4 MiB body but its last byte. The node's memory stays bounded (TLS adds up to
    256 KiB of undecrypted input per connection to the plaintext case's buffers). Decrypting
    the flood made single event-loop turns of tens of MiB and cost the leader its leadership
    in every TLS run; with the turns shared (``quorum.runtime.limits.ReadTurns``) a probe sent
    after the flood began is answered while the flood's connections are open, and the leader
    keeps its leadership in the same epoch."""
    before = state_of(cluster)
    leader = before["leader_id"]
    ep = cluster.endpoint(leader)
    token = (cluster.tls / "rw.token").read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    loop_before = http_metrics(ep, ctx_as(cluster, "none"))
    with Prober(ep, "/v1/kv/tls-committed-0", ctx=ctx_as(cluster, "none"), headers=auth) as probe:
        began = time.monotonic()
        socks, growth = hold_large_bodies(
            ep,
            cluster.procs[leader].pid,
            ctx=ctx_as(cluster, "none"),
            headers=f"Authorization: Bearer {token}\r\n",
        )
        try:
            # generous, and within the 30 s body deadline that would end the flood
            wait_until(
                "a probe answered during the flood",
                lambda: probe.answered_since(began),
                25,
                errors=(Exception,),
            )
            # the bodies did get past authentication into the body budget
            assert buffered_body_bytes(ep, ctx_as(cluster, "none")) > 16 * 1024 * 1024
            assert call(cluster, "rw.json", lambda q: q.put("tls-small-during", b"fine")) >= 0
            assert call(cluster, "read.json", lambda q: q.get("tls-committed-1")) == KEYS["tls-committed-1"]
            assert growth < 256 * 1024 * 1024, f"leader grew by {growth >> 20} MiB"
        finally:
            for s in socks:
                s.close()
    loop_after = http_metrics(ep, ctx_as(cluster, "none"))
    assert_kept_leadership(before, state_of(cluster), loop_before, loop_after)
    intact(cluster, before)


def test_open_endpoints_reveal_no_uuid(cluster: TlsCluster) -> None:
    """``/healthz``, ``/readyz`` and ``/metrics`` need no credential over TLS either, and name
    no storage UUID."""
    uuids = set(cluster.uuids.values())
    assert len(uuids) == 3
    for i in cluster.procs:
        assert_open_endpoints_reveal_no_uuid(cluster.endpoint(i), uuids, ctx_as(cluster, "none"))


def test_strangers_hold_no_body_budget(cluster: TlsCluster) -> None:
    """Connections without a certificate announcing large bodies to the open endpoints (which
    once held all 64 MiB of the body budget: every write and peer Fetch got 503 for 30 s), and
    gzip-encoded bodies (once inflated past the budget's count): each is refused unread, the
    budget stays empty, writes go on, the leader keeps leading."""
    before = state_of(cluster)
    ep = cluster.endpoint(before["leader_id"])
    host, _, port = ep.rpartition(":")
    ctx = ctx_as(cluster, "none")
    socks: list[ssl.SSLSocket] = []
    statuses: list[bytes] = []
    try:
        for i in range(240):
            s = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10), server_hostname=host)
            path = ("/healthz", "/readyz", "/metrics")[i % 3]
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n".encode())
            socks.append(s)
        for s in socks[:20]:
            statuses.append(s.recv(64).split(b"\r\n")[0])
        assert all(b" 400 " in st for st in statuses), statuses
        # nothing of the 240 announced bodies is reserved (peers' small Fetches may be in flight)
        assert buffered_body_bytes(ep, ctx) < 1024 * 1024
        assert call(cluster, "rw.json", lambda q: q.put("stranger-during", b"ok")) >= 0
        token = (cluster.tls / "rw.token").read_text().strip()
        for path in ("/healthz", "/v1/kv/gz"):
            status, obj = request(
                ep,
                "PUT" if path.startswith("/v1") else "GET",
                path,
                b"\x1f\x8b" + b"\0" * 4096,
                ctx=ctx,
                headers={"Content-Encoding": "gzip", "Authorization": f"Bearer {token}"},
            )
            assert status == 415, (path, status, obj)
    finally:
        for s in socks:
            s.close()
    intact(cluster, before)
