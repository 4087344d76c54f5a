"""The hostile-peer suite, TLS half: three real node processes with mutual TLS, and
the attacks of the plaintext half repeated with every kind of wrong credential: none, another cluster's
certificate from the same CA, a certificate of another CA, an expired certificate of the right
CA, replica 3's certificate claiming to be replica 2, and a valid certificate of a replica
that is not a voter (7). Every test ends with the nodes serving, the committed keys intact and
the voter set unchanged."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from quorum.core import messages as m
from quorum.runtime import wire
from quorum.security.pki import peer_hostname
from quorum.security.tlsctx import client_context
from tests.engine.cluster import poll
from tests.hostile.fakes import (
    NODE_DEFAULT_TIMEOUTS,
    FakeLeader,
    Prober,
    assert_intact,
    assert_kept_leadership,
    assert_open_endpoints_reveal_no_uuid,
    buffered_body_bytes,
    fetch_header,
    frame,
    hold_large_bodies,
    http_metrics,
    request,
    rpc,
)
from tests.tlsfixtures import CLUSTER, TlsCluster, make_tls_dir

pytestmark = pytest.mark.slow

KEYS = {f"tls-committed-{i}": f"value-{i}".encode() for i in range(5)}


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 7: a valid identity of a replica that is not a voter
    return make_tls_dir(tmp_path_factory.mktemp("tls"), nodes=(1, 2, 3, 7))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tls_dir: Path) -> Iterator[TlsCluster]:
    c = TlsCluster(tmp_path_factory.mktemp("nodes"), tls_dir)
    assert c.config_path is not None
    # the node's own (KRaft's) election and fetch timeouts, as in the plaintext half
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


def _call(c: TlsCluster, cfg: str, fn: Any) -> Any:
    return c.call_as(cfg, fn)


def _state(c: TlsCluster, timeout: float = 60) -> dict[str, Any]:
    return c.state(timeout)


def _intact(c: TlsCluster, before: dict[str, Any], *, same_leader: bool = True) -> None:
    assert_intact(
        before,
        _state(c),
        [c.endpoint(i) for i in c.procs],
        KEYS,
        lambda k: _call(c, "read.json", lambda q: q.get(k)),
        lambda k, v: _call(c, "rw.json", lambda q: q.put(k, v)),
        same_leader=same_leader,
        ctx=client_context(c.tls / "ca.crt"),
    )


def _ctx(c: TlsCluster, who: str) -> ssl.SSLContext:
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


def _refused(c: TlsCluster, node: int, who: str, msg: Any) -> str:
    """Send ``msg`` to ``node`` as ``who``; the refusal seen ("tls" if the handshake failed)."""
    try:
        status, obj = rpc(
            c.endpoint(node), msg, ctx=_ctx(c, who), server_hostname=peer_hostname(CLUSTER, node)
        )
    except (ssl.SSLError, ConnectionError):
        return "tls"
    assert status in (401, 403), (who, status, obj)
    return str(obj["error_code"])


def test_unauthenticated_and_unauthorized_reassign(cluster: TlsCluster) -> None:
    before = _state(cluster)
    ep = cluster.endpoint(before["leader_id"])
    for body in (b'{"voters": [3]}', b'{"voters": [1000000000000000000000000000000]}'):
        for who in (*BAD_PEERS, "read"):
            try:
                status, obj = request(ep, "POST", "/v1/quorum/reassign", body, ctx=_ctx(cluster, who))
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
            ctx=_ctx(cluster, "none"),
        )
        assert (status, obj["error_code"]) == (401, "UNAUTHENTICATED")
    status, obj = _call_admin_raw(cluster, ep, b'{"voters": [1000000000000000000000000000000]}')
    assert status == 400 and "out of range" in obj["message"]
    _intact(cluster, before)
    assert _state(cluster)["target_voters"] is None


def _call_admin_raw(c: TlsCluster, ep: str, body: bytes) -> tuple[int, Any]:
    ctx = client_context(c.tls / "ca.crt", c.tls / "admin.crt", c.tls / "admin.key")
    return request(ep, "POST", "/v1/quorum/reassign", body, ctx=ctx)


def test_fake_peer_begin_quorum_epoch_and_snapshot(cluster: TlsCluster) -> None:
    before = _state(cluster)
    fake = FakeLeader(CLUSTER)
    with fake.running():
        for i in (1, 2, 3):
            bqe = m.BeginQuorumEpochRequest(1, CLUSTER, 99, 1000, i, None, None, fake.endpoint)
            snap = m.FetchSnapshotRequest(1, CLUSTER, 99, None, 1000, m.OffsetAndEpoch(10**6, 1000), 0, 1024)
            for who in BAD_PEERS:
                assert _refused(cluster, i, who, bqe) in ("tls", "UNAUTHENTICATED", "PERMISSION_DENIED")
                assert _refused(cluster, i, who, snap) in ("tls", "UNAUTHENTICATED", "PERMISSION_DENIED")
            # a valid certificate of a non-voter, speaking for itself: the core refuses it
            own = m.BeginQuorumEpochRequest(1, CLUSTER, 7, 1000, i, None, None, fake.endpoint)
            status, raw = rpc(
                cluster.endpoint(i),
                own,
                ctx=_ctx(cluster, "node-7"),
                server_hostname=peer_hostname(CLUSTER, i),
            )
            if status == 200:
                assert wire.decode(m.BeginQuorumEpochResponse, raw).error_code is not m.ErrorCode.NONE
        _intact(cluster, before)
        assert fake.hits == []


def test_forged_fetch_acks_and_endpoints(cluster: TlsCluster) -> None:
    before = _state(cluster)
    leader, epoch = before["leader_id"], before["leader_epoch"]
    fake = FakeLeader(CLUSTER)
    with fake.running():
        for claimed in (2, 3):
            ack = m.FetchRequest(1, CLUSTER, claimed, None, epoch, 10**6, epoch, 0, 1024, fake.endpoint)
            for who in BAD_PEERS:
                if who == "node-3" and claimed == 3:
                    continue  # replica 3 speaking for itself is not an attack
                assert _refused(cluster, leader, who, ack) in ("tls", "UNAUTHENTICATED", "PERMISSION_DENIED")
        assert (
            _refused(cluster, leader, "node-3", m.FetchRequest(1, CLUSTER, 2, None, epoch, 0, 0, 0, 1024))
            == "PERMISSION_DENIED"
        )
        offset = _call(cluster, "rw.json", lambda q: q.put("tls-acked", b"1"))
        poll(
            lambda: all(v["log_end_offset"] > offset for v in _state(cluster)["voters"]),
            30,
            "real replication",
        )
        assert fake.hits == []
    _intact(cluster, before)


def test_two_thousand_made_up_replicas(cluster: TlsCluster) -> None:
    """Replica 7's valid certificate claiming 2,000 other ids: each refused, describe bounded."""
    before = _state(cluster)
    leader, epoch = before["leader_id"], before["leader_epoch"]
    ctx = _ctx(cluster, "node-7")

    async def flood() -> list[int]:
        conn = aiohttp.TCPConnector(limit=16, ssl=ctx)
        async with aiohttp.ClientSession(connector=conn) as s:

            async def one(i: int) -> int:
                msg = m.FetchRequest(1, CLUSTER, 1000 + i, str(uuid.uuid4()), epoch, 0, 0, 0, 1024)
                async with s.post(
                    f"https://{cluster.endpoint(leader)}/raft/v1/fetch",
                    data=wire.encode(msg),
                    server_hostname=peer_hostname(CLUSTER, leader),
                ) as r:
                    await r.read()
                    return r.status

            return await asyncio.gather(*(one(i) for i in range(2000)))

    assert set(asyncio.run(flood())) == {403}
    d = _state(cluster)
    assert not {o["id"] for o in d["observers"]} & set(range(1000, 3000))
    assert len(json.dumps(d)) < 32 * 1024
    _intact(cluster, before)


def test_disruptive_votes(cluster: TlsCluster) -> None:
    before = _state(cluster)
    e = before["leader_epoch"]
    for i in (1, 2, 3):
        for pre in (False, True):
            vote = m.VoteRequest(1, CLUSTER, 7, None, e + 5, i, None, e, 10**6, None, pre)
            status, _ = rpc(
                cluster.endpoint(i),
                vote,
                ctx=_ctx(cluster, "node-7"),
                server_hostname=peer_hostname(CLUSTER, i),
            )
            assert status == 200  # a valid non-voter may ask; the core refuses without bumping
            as_two = m.VoteRequest(1, CLUSTER, 2, None, e + 5, i, None, e, 10**6, None, pre)
            for who in BAD_PEERS:
                if i != 2:
                    assert _refused(cluster, i, who, as_two) in (
                        "tls",
                        "UNAUTHENTICATED",
                        "PERMISSION_DENIED",
                    )
    _intact(cluster, before)


def test_int32_epoch_votes_then_restart(cluster: TlsCluster) -> None:
    before = _state(cluster)
    leader = before["leader_id"]
    follower = next(i for i in (1, 2, 3) if i != leader)
    other = next(i for i in (1, 2, 3) if i not in (leader, follower))
    ctx = client_context(
        cluster.tls / "ca.crt", cluster.tls / f"node-{other}.crt", cluster.tls / f"node-{other}.key"
    )
    hn = peer_hostname(CLUSTER, follower)
    status, obj = rpc(
        cluster.endpoint(follower),
        m.VoteRequest(1, CLUSTER, other, None, 2**31, follower, None, 0, 0),
        ctx=ctx,
        server_hostname=hn,
    )
    assert status == 400 and "candidate_epoch" in obj["message"]
    rpc(
        cluster.endpoint(follower),
        m.VoteRequest(1, CLUSTER, other, None, 2**31 - 1, follower, None, 10**9, 10**9),
        ctx=ctx,
        server_hostname=hn,
    )
    cluster.kill(follower)
    cluster.start(follower)
    anon = client_context(cluster.tls / "ca.crt")
    poll(
        lambda: request(cluster.endpoint(follower), "GET", "/readyz", ctx=anon)[0] == 200,
        60,
        "the restarted follower",
    )
    state = json.loads((cluster.data_dir(follower) / "__cluster_metadata-0" / "quorum-state").read_text())
    assert state.get("leader_epoch", 0) < 2**31 - 1
    _intact(cluster, before)


def test_decoding_attacks_with_and_without_a_certificate(cluster: TlsCluster) -> None:
    before = _state(cluster)
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
            ctx=_ctx(cluster, "none"),
            server_hostname=hn,
        )
        assert (status, obj["error_code"]) == (401, "UNAUTHENTICATED")
    nested = b'{"voters": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    status, obj = _call_admin_raw(cluster, cluster.endpoint(leader), nested)
    assert status == 400 and "nested deeper" in obj["message"]
    # keys are percent-decoded once: %2541 and A are two keys
    token = (cluster.tls / "rw.token").read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    anon = _ctx(cluster, "none")
    ep = cluster.endpoint(leader)
    assert request(ep, "PUT", "/v1/kv/A", b"plain", ctx=anon, headers=auth)[0] == 200
    assert request(ep, "PUT", "/v1/kv/%2541", b"percent", ctx=anon, headers=auth)[0] == 200
    assert request(ep, "GET", "/v1/kv/A", ctx=anon, headers=auth)[1] == b"plain"
    assert request(ep, "GET", "/v1/kv/%2541", ctx=anon, headers=auth)[1] == b"percent"
    _intact(cluster, before)


def test_half_open_tls_connections_are_closed(cluster: TlsCluster) -> None:
    """500 connections that never finish the TLS handshake (or send half a request) are closed
    by the handshake and head deadlines; the node serves meanwhile."""
    before = _state(cluster)
    leader = before["leader_id"]
    port = cluster.ports[leader]
    socks = []
    try:
        for i in range(500):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            if i % 2:
                s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello cut short
            socks.append(s)
        assert _call(cluster, "read.json", lambda q: q.get("tls-committed-0")) == KEYS["tls-committed-0"]
        proc = psutil.Process(cluster.procs[leader].pid)

        def open_count() -> int:
            return sum(
                1
                for conn in proc.net_connections(kind="tcp")
                if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_ESTABLISHED
            )

        poll(lambda: open_count() < 20, 60, "the half-open TLS connections to be closed", 0.5)
    finally:
        for s in socks:
            s.close()
    _intact(cluster, before)


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
    before = _state(cluster)
    leader = before["leader_id"]
    ep = cluster.endpoint(leader)
    token = (cluster.tls / "rw.token").read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    loop_before = http_metrics(ep, _ctx(cluster, "none"))
    with Prober(ep, "/v1/kv/tls-committed-0", ctx=_ctx(cluster, "none"), headers=auth) as probe:
        began = time.monotonic()
        socks, growth = hold_large_bodies(
            ep,
            cluster.procs[leader].pid,
            ctx=_ctx(cluster, "none"),
            headers=f"Authorization: Bearer {token}\r\n",
        )
        try:
            # generous, and within the 30 s body deadline that would end the flood
            poll(lambda: probe.answered_since(began), 25, "a probe answered during the flood")
            # the bodies did get past authentication into the body budget
            assert buffered_body_bytes(ep, _ctx(cluster, "none")) > 16 * 1024 * 1024
            assert _call(cluster, "rw.json", lambda q: q.put("tls-small-during", b"fine")) >= 0
            assert _call(cluster, "read.json", lambda q: q.get("tls-committed-1")) == KEYS["tls-committed-1"]
            assert growth < 256 * 1024 * 1024, f"leader grew by {growth >> 20} MiB"
        finally:
            for s in socks:
                s.close()
    loop_after = http_metrics(ep, _ctx(cluster, "none"))
    assert_kept_leadership(before, _state(cluster), loop_before, loop_after)
    _intact(cluster, before)


def test_open_endpoints_reveal_no_uuid(cluster: TlsCluster) -> None:
    """``/healthz``, ``/readyz`` and ``/metrics`` need no credential over TLS either, and name
    no storage UUID."""
    uuids = set(cluster.uuids.values())
    assert len(uuids) == 3
    for i in cluster.procs:
        assert_open_endpoints_reveal_no_uuid(cluster.endpoint(i), uuids, _ctx(cluster, "none"))


def test_strangers_hold_no_body_budget(cluster: TlsCluster) -> None:
    """Connections without a certificate announcing large bodies to the open endpoints (which
    once held all 64 MiB of the body budget: every write and peer Fetch got 503 for 30 s), and
    gzip-encoded bodies (once inflated past the budget's count): each is refused unread, the
    budget stays empty, writes go on, the leader keeps leading."""
    before = _state(cluster)
    ep = cluster.endpoint(before["leader_id"])
    host, _, port = ep.rpartition(":")
    ctx = _ctx(cluster, "none")
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
        assert _call(cluster, "rw.json", lambda q: q.put("stranger-during", b"ok")) >= 0
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
    _intact(cluster, before)
