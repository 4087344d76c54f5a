"""The hostile-peer suite, TLS half, attacks from peers: three real node processes with mutual TLS
(the package's ``tls_cluster``), and a fake leader, forged fetches and acknowledgements, two
thousand made-up replicas, disruptive votes and int32 epochs, each sent with every kind of wrong
credential (none, another cluster's certificate from the same CA, a certificate of another CA,
an expired certificate of the right CA, replica 3's certificate claiming to be replica 2, a
valid certificate of a replica that is not a voter). Every test ends with the nodes serving,
the committed keys intact and the voter set unchanged."""

from __future__ import annotations

import asyncio
import json
import uuid

import aiohttp
import pytest

from quorum.core import messages as m
from quorum.runtime import wire
from quorum.security.pki import peer_hostname
from quorum.security.tlsctx import client_context
from testkit.polling import wait_until
from tests.hostile.fakes import (
    FakeLeader,
    request,
    rpc,
)
from tests.hostile.tlsattack import BAD_PEERS, call, ctx_as, intact, refused, state_of
from tests.tlsfixtures import CLUSTER, TlsCluster

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tls_cluster: TlsCluster) -> TlsCluster:
    return tls_cluster


def test_fake_peer_begin_quorum_epoch_and_snapshot(cluster: TlsCluster) -> None:
    before = state_of(cluster)
    fake = FakeLeader(CLUSTER)
    with fake.running():
        for i in (1, 2, 3):
            bqe = m.BeginQuorumEpochRequest(1, CLUSTER, 99, 1000, i, None, None, fake.endpoint)
            snap = m.FetchSnapshotRequest(1, CLUSTER, 99, None, 1000, m.OffsetAndEpoch(10**6, 1000), 0, 1024)
            for who in BAD_PEERS:
                assert refused(cluster, i, who, bqe) in ("tls", "UNAUTHENTICATED", "PERMISSION_DENIED")
                assert refused(cluster, i, who, snap) in ("tls", "UNAUTHENTICATED", "PERMISSION_DENIED")
            # a valid certificate of a non-voter, speaking for itself: the core refuses it
            own = m.BeginQuorumEpochRequest(1, CLUSTER, 7, 1000, i, None, None, fake.endpoint)
            status, raw = rpc(
                cluster.endpoint(i),
                own,
                ctx=ctx_as(cluster, "node-7"),
                server_hostname=peer_hostname(CLUSTER, i),
            )
            if status == 200:
                assert wire.decode(m.BeginQuorumEpochResponse, raw).error_code is not m.ErrorCode.NONE
        intact(cluster, before)
        assert fake.hits == []


def test_forged_fetch_acks_and_endpoints(cluster: TlsCluster) -> None:
    before = state_of(cluster)
    leader, epoch = before["leader_id"], before["leader_epoch"]
    fake = FakeLeader(CLUSTER)
    with fake.running():
        for claimed in (2, 3):
            ack = m.FetchRequest(1, CLUSTER, claimed, None, epoch, 10**6, epoch, 0, 1024, fake.endpoint)
            for who in BAD_PEERS:
                if who == "node-3" and claimed == 3:
                    continue  # replica 3 speaking for itself is not an attack
                assert refused(cluster, leader, who, ack) in ("tls", "UNAUTHENTICATED", "PERMISSION_DENIED")
        assert (
            refused(cluster, leader, "node-3", m.FetchRequest(1, CLUSTER, 2, None, epoch, 0, 0, 0, 1024))
            == "PERMISSION_DENIED"
        )
        offset = call(cluster, "rw.json", lambda q: q.put("tls-acked", b"1"))
        wait_until(
            "real replication",
            lambda: all(v["log_end_offset"] > offset for v in state_of(cluster)["voters"]),
            30,
            errors=(Exception,),
        )
        assert fake.hits == []
    intact(cluster, before)


def test_two_thousand_made_up_replicas(cluster: TlsCluster) -> None:
    """Replica 7's valid certificate claiming 2,000 other ids: each refused, describe bounded."""
    before = state_of(cluster)
    leader, epoch = before["leader_id"], before["leader_epoch"]
    ctx = ctx_as(cluster, "node-7")

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
    d = state_of(cluster)
    assert not {o["id"] for o in d["observers"]} & set(range(1000, 3000))
    assert len(json.dumps(d)) < 32 * 1024
    intact(cluster, before)


def test_disruptive_votes(cluster: TlsCluster) -> None:
    before = state_of(cluster)
    e = before["leader_epoch"]
    for i in (1, 2, 3):
        for pre in (False, True):
            vote = m.VoteRequest(1, CLUSTER, 7, None, e + 5, i, None, e, 10**6, None, pre)
            status, _ = rpc(
                cluster.endpoint(i),
                vote,
                ctx=ctx_as(cluster, "node-7"),
                server_hostname=peer_hostname(CLUSTER, i),
            )
            assert status == 200  # a valid non-voter may ask; the core refuses without bumping
            as_two = m.VoteRequest(1, CLUSTER, 2, None, e + 5, i, None, e, 10**6, None, pre)
            for who in BAD_PEERS:
                if i != 2:
                    assert refused(cluster, i, who, as_two) in (
                        "tls",
                        "UNAUTHENTICATED",
                        "PERMISSION_DENIED",
                    )
    intact(cluster, before)


def test_int32_epoch_votes_then_restart(cluster: TlsCluster) -> None:
    before = state_of(cluster)
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
    wait_until(
        "the restarted follower",
        lambda: request(cluster.endpoint(follower), "GET", "/readyz", ctx=anon)[0] == 200,
        60,
        errors=(Exception,),
    )
    state = json.loads((cluster.data_dir(follower) / "__cluster_metadata-0" / "quorum-state").read_text())
    assert state.get("leader_epoch", 0) < 2**31 - 1
    intact(cluster, before)
