"""The hostile-peer suite, plaintext half: three real node processes on loopback and
an attacker with nothing but HTTP requests, raw sockets and a fake peer. These are the attacks
about decoding, disruption and resources, which must hold even without authentication (the
TLS half, tests/hostile/test_tls_peers.py and test_tls_clients.py, repeats the identity attacks
with certificates). Every test ends with the nodes serving, the committed keys intact and the
voter set unchanged."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from quorum.client import QuorumClient
from quorum.core import messages as m
from quorum.localports import free_ports
from quorum.runtime import wire
from quorum.types import KraftError
from testkit.polling import wait_until
from tests.engine.cluster import LocalCluster, run_cli
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
    wait_stable,
)

pytestmark = pytest.mark.slow

CLUSTER = "hostile-plain"
KEYS = {f"committed-{i}": f"value-{i}".encode() for i in range(5)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("plain"), 3, NODE_DEFAULT_TIMEOUTS, cluster_id=CLUSTER).up()
    try:
        c.leader(60)
        for k, v in KEYS.items():
            c.call(lambda q, k=k, v=v: q.put(k, v))
        yield c
    finally:
        c.stop()


def _state(c: LocalCluster) -> dict[str, Any]:
    return wait_stable(c.describe)


def _intact(c: LocalCluster, before: dict[str, Any], *, same_leader: bool = True) -> None:
    """The end state every attack must leave: serving, data intact, voter set unchanged."""
    assert_intact(
        before,
        _state(c),
        [c.endpoint(i) for i in c.procs],
        KEYS,
        lambda k: c.call(lambda q: q.get(k)),
        lambda k, v: c.call(lambda q: q.put(k, v)),
        same_leader=same_leader,
    )


def test_admin_input_refused_with_the_problem_named(cluster: LocalCluster) -> None:
    before = _state(cluster)
    ep = cluster.endpoint(before["leader_id"])
    for body, needle in (
        (b'{"voters": [1000000000000000000000000000000]}', "out of range"),
        (b'{"voters": [2147483648]}', "out of range"),
        (b'{"voters": ["3"]}', "must be an integer"),
        (b'{"voters": [3], "voters": [1]}', "duplicate key"),
        (b'{"voters": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested deeper"),
        (b"[" * 100_000, "nested deeper"),
        (b'{"voters": [NaN]}', "NaN"),
    ):
        status, obj = request(ep, "POST", "/v1/quorum/reassign", body)
        assert status == 400 and obj["error_code"] == "INVALID_REQUEST", (body[:40], obj)
        assert needle in obj["message"], obj
    status, obj = request(
        ep, "POST", "/v1/quorum/voters", b'{"id": 4294967296, "uuid": "' + str(uuid.uuid4()).encode() + b'"}'
    )
    assert status == 400 and "id" in obj["message"]
    status, obj = request(ep, "DELETE", f"/v1/quorum/voters/{10**30}/{uuid.uuid4()}")
    assert status == 400 and "voter id" in obj["message"]
    # a target that is neither a voter nor a caught-up observer
    status, obj = request(ep, "POST", "/v1/quorum/reassign", b'{"voters": [1, 2, 3, 99]}')
    assert (status, obj["error_code"]) == (409, "REPLICA_NOT_CAUGHT_UP") and "[99]" in obj["message"]
    _intact(cluster, before)
    assert _state(cluster)["target_voters"] is None


def test_fake_leader_begin_quorum_epoch_and_its_snapshot(cluster: LocalCluster) -> None:
    before = _state(cluster)
    fake = FakeLeader(CLUSTER)
    with fake.running():
        for i in (1, 2, 3):
            voter = next(v for v in before["voters"] if v["id"] == i)
            rpc(
                cluster.endpoint(i),
                m.BeginQuorumEpochRequest(1, CLUSTER, 99, 1000, i, voter["uuid"], None, fake.endpoint),
            )
            # the snapshot it names: offered as a Fetch answer would offer it, to every node
            rpc(
                cluster.endpoint(i),
                m.FetchSnapshotRequest(1, CLUSTER, 99, None, 1000, m.OffsetAndEpoch(10**6, 1000), 0, 1024),
            )
        _intact(cluster, before)
        assert all(n["leader_epoch"] < 1000 for n in [_state(cluster)])
        assert fake.hits == [], f"a node contacted the fake leader: {fake.hits}"


def test_forged_fetch_acks_do_not_commit(cluster: LocalCluster) -> None:
    """With both followers down, Fetch "acks" claiming to be them (unknown or made-up UUIDs:
    /healthz no longer shows the real ones) must not let the leader acknowledge a write."""
    before = _state(cluster)
    leader = before["leader_id"]
    followers = [i for i in (1, 2, 3) if i != leader]
    for f in followers:
        cluster.kill(f)
    ep = cluster.endpoint(leader)
    stop = False

    async def forge() -> None:
        async with aiohttp.ClientSession() as s:
            while not stop:
                for f in followers:
                    for fake_uuid in (None, str(uuid.uuid4())):
                        msg = m.FetchRequest(
                            1,
                            CLUSTER,
                            f,
                            fake_uuid,
                            before["leader_epoch"],
                            10**6,
                            before["leader_epoch"],
                            0,
                            1024,
                        )
                        # Back to back: each forged ack waits for its answer, which paces the flood.
                        async with s.post(f"http://{ep}/raft/v1/fetch", data=wire.encode(msg)) as r:
                            await r.read()

    async def attack() -> BaseException | int:
        nonlocal stop
        task = asyncio.create_task(forge())
        try:
            async with QuorumClient(ep, timeout=4) as q:
                return await q.put("forged-ack", b"must-not-be-acked")
        except (KraftError, TimeoutError, aiohttp.ClientError) as e:
            return e
        finally:
            stop = True
            await task

    result = asyncio.run(attack())
    assert not isinstance(result, int), (
        f"the leader acknowledged a write at offset {result} without its voters"
    )
    for f in followers:
        cluster.start(f)
    _intact(cluster, before, same_leader=False)


def test_fetch_claiming_a_voter_with_another_endpoint(cluster: LocalCluster) -> None:
    before = _state(cluster)
    fake = FakeLeader(CLUSTER)
    with fake.running():
        for target in (1, 2, 3):
            for claimed in (1, 2, 3):
                if claimed != target:
                    msg = m.FetchRequest(
                        1, CLUSTER, claimed, None, before["leader_epoch"], 0, 0, 0, 1024, fake.endpoint
                    )
                    rpc(cluster.endpoint(target), msg)
        offset = cluster.call(lambda q: q.put("after-endpoint", b"x"))

        def all_caught_up() -> bool:
            d = _state(cluster)
            return all(v["log_end_offset"] > offset for v in d["voters"])

        wait_until("every voter to replicate from the real leader", all_caught_up, 30, errors=(Exception,))
        assert fake.hits == [], f"a node contacted the advertised fake endpoint: {fake.hits}"
    _intact(cluster, before)


def test_two_thousand_made_up_replicas_keep_describe_bounded(cluster: LocalCluster) -> None:
    before = _state(cluster)
    ep = cluster.endpoint(before["leader_id"])

    async def flood() -> list[int]:
        sem = asyncio.Semaphore(32)

        async with aiohttp.ClientSession() as s:

            async def one(i: int) -> int:
                msg = m.FetchRequest(
                    1,
                    CLUSTER,
                    1000 + i,
                    str(uuid.uuid4()),
                    before["leader_epoch"],
                    0,
                    0,
                    0,
                    1024,
                    f"10.9.{i // 250}.{i % 250}:1",
                )
                async with sem, s.post(f"http://{ep}/raft/v1/fetch", data=wire.encode(msg)) as r:
                    await r.read()
                    return r.status

            return await asyncio.gather(*(one(i) for i in range(2000)))

    statuses = asyncio.run(flood())
    assert set(statuses) <= {200, 400, 403, 503}
    d = _state(cluster)
    # the core tracks at most 64 observers (max_observers); the earlier tests' forged Fetches
    # under the voters' own ids (other UUIDs) may add one row per voter
    assert len(d["observers"]) <= 64 + 3, len(d["observers"])
    assert len(json.dumps(d)) < 32 * 1024
    _intact(cluster, before)


def test_vote_from_a_non_voter_at_a_higher_epoch(cluster: LocalCluster) -> None:
    before = _state(cluster)
    e = before["leader_epoch"]
    for _ in range(3):
        for i in (1, 2, 3):
            for pre in (False, True):
                rpc(
                    cluster.endpoint(i),
                    m.VoteRequest(1, CLUSTER, 7, str(uuid.uuid4()), e + 5, i, None, e, 10**6, None, pre),
                )
    _intact(cluster, before)


def test_vote_at_the_int32_limit_then_restart(cluster: LocalCluster) -> None:
    before = _state(cluster)
    leader = before["leader_id"]
    follower = next(i for i in (1, 2, 3) if i != leader)
    status, obj = rpc(
        cluster.endpoint(follower), m.VoteRequest(1, CLUSTER, 7, None, 2**31, follower, None, 0, 0)
    )
    assert status == 400 and "candidate_epoch" in obj["message"]
    for i in (1, 2, 3):
        for cand in (7, next(j for j in (1, 2, 3) if j != i)):
            rpc(cluster.endpoint(i), m.VoteRequest(1, CLUSTER, cand, None, 2**31 - 1, i, None, 10**9, 10**9))
    _intact(cluster, before)
    cluster.kill(follower)
    cluster.start(follower)
    wait_until(
        "the restarted follower",
        lambda: request(cluster.endpoint(follower), "GET", "/readyz")[0] == 200,
        60,
        errors=(Exception,),
    )
    state = json.loads((cluster.data_dir(follower) / "__cluster_metadata-0" / "quorum-state").read_text())
    assert state.get("leader_epoch", 0) < 2**31 - 1, state
    _intact(cluster, before)


def test_wire_decoding_attacks(cluster: LocalCluster) -> None:
    before = _state(cluster)
    ep = cluster.endpoint(before["leader_id"])
    hdr = fetch_header(CLUSTER, 2, before["leader_epoch"])
    for body, needle in (
        (frame(json.dumps(dict(hdr, max_wait_ms=10**400)).encode()), "max_wait_ms"),
        (frame(b"[" * 5000 + b"]" * 5000), "nested deeper"),
        (frame(json.dumps(dict(hdr, replica_id="2")).encode()), "replica_id"),
        (frame(json.dumps(dict(hdr, fetch_offset=1.0)).encode()), "fetch_offset"),
        (b"\xff\xff\xff\x7f", "header length"),
    ):
        status, obj = request(ep, "POST", "/raft/v1/fetch", body)
        assert status == 400 and obj["error_code"] == "INVALID_REQUEST" and needle in obj["message"], obj
    _intact(cluster, before)


def test_keys_are_percent_decoded_once(cluster: LocalCluster) -> None:
    before = _state(cluster)
    ep = cluster.endpoint(before["leader_id"])
    assert request(ep, "PUT", "/v1/kv/A", b"plain-A")[0] == 200
    assert request(ep, "PUT", "/v1/kv/%2541", b"percent-41")[0] == 200
    assert request(ep, "GET", "/v1/kv/A")[1] == b"plain-A"
    assert request(ep, "GET", "/v1/kv/%41")[1] == b"plain-A"
    assert request(ep, "GET", "/v1/kv/%2541")[1] == b"percent-41"
    status, obj = request(ep, "PUT", "/v1/kv/%ff", b"x")
    assert status == 400 and "UTF-8" in obj["message"]
    _intact(cluster, before)


def _server_connections(pid: int, port: int) -> int:
    return sum(
        1
        for conn in psutil.Process(pid).net_connections(kind="tcp")
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_ESTABLISHED
    )


def test_half_sent_connections_are_closed(cluster: LocalCluster) -> None:
    before = _state(cluster)
    leader = before["leader_id"]
    port = cluster.ports[leader]
    socks = []
    try:
        for _ in range(500):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"PUT /v1/kv/slow HTTP/1.1\r\nHost: x\r\nContent-Le")
            socks.append(s)
        # the node keeps serving new clients while they hang (the cap evicts the oldest)
        assert request(cluster.endpoint(leader), "GET", "/v1/kv/committed-0")[1] == KEYS["committed-0"]
        pid = cluster.procs[leader].pid
        wait_until(
            "the half-sent connections to be closed",
            lambda: _server_connections(pid, port) < 20,
            60,
            0.5,
            errors=(Exception,),
        )
    finally:
        for s in socks:
            s.close()
    _intact(cluster, before)


def test_many_large_bodies_keep_memory_bounded_and_the_leader_leading(cluster: LocalCluster) -> None:
    """100 connections each sending a 4 MiB PUT body but its last byte: before the limits the
    leader reached 720 MiB; the shared body budget bounds it. The flood also must not stall
    the leader: before the loop turns were shared (``quorum.runtime.limits.ReadTurns``) one
    turn read tens of MiB and the followers elected a new leader. Now a probe request sent
    after the flood began is answered while the flood's connections are still open, and the
    leader keeps its leadership in the same epoch."""
    before = _state(cluster)
    leader = before["leader_id"]
    ep = cluster.endpoint(leader)
    loop_before = http_metrics(ep)
    with Prober(ep, "/v1/kv/committed-0") as probe:
        began = time.monotonic()
        socks, growth = hold_large_bodies(ep, cluster.procs[leader].pid)
        try:
            # generous, and within the 30 s body deadline that would end the flood
            wait_until(
                "a probe answered during the flood",
                lambda: probe.answered_since(began),
                25,
                errors=(Exception,),
            )
            assert buffered_body_bytes(ep) > 16 * 1024 * 1024
            # while they hold their bodies, ordinary clients are served
            assert request(ep, "PUT", "/v1/kv/small-during", b"fine")[0] == 200
            assert cluster.call(lambda q: q.put("small-during", b"fine")) >= 0
            assert growth < 200 * 1024 * 1024, f"leader grew by {growth >> 20} MiB"
        finally:
            for s in socks:
                s.close()
    loop_after = http_metrics(ep)
    assert_kept_leadership(before, _state(cluster), loop_before, loop_after)
    _intact(cluster, before)


def test_open_endpoints_reveal_no_uuid(cluster: LocalCluster) -> None:
    """Plaintext trusts the network (docs/operator.md, "Plaintext"): a Fetch ack carrying a
    voter's real (id, UUID) is taken as that voter's. The unauthenticated endpoints must at
    least not hand the UUIDs out."""
    uuids = set(cluster.uuids.values())
    assert len(uuids) == 3
    for i in cluster.procs:
        assert_open_endpoints_reveal_no_uuid(cluster.endpoint(i), uuids)


def test_corrupt_persisted_state_stops_start_up(tmp_path: Path) -> None:
    """Persisted state that cannot be loaded stops start-up with an error naming the file."""
    d = tmp_path / "n1"
    run_cli("format", "--dir", str(d), "--cluster-id", CLUSTER, "--node-id", "1")
    port = free_ports(1)[0]
    args = ("start", "--dir", str(d), "--listen", f"127.0.0.1:{port}", "--voters", f"1@127.0.0.1:{port}")
    qs = d / "__cluster_metadata-0" / "quorum-state"
    qs.parent.mkdir(exist_ok=True)
    qs.write_text('{"leader_epoch": 2147483648}')
    p = run_cli(*args, check=False)
    assert p.returncode != 0 and "quorum-state" in p.stderr, p.stderr[-2000:]
    qs.unlink()
    meta = d / "meta.properties"
    meta.write_text(meta.read_text().replace("node.id=1", "node.id=one"))
    p = run_cli(*args, check=False)
    assert p.returncode != 0 and "meta.properties" in p.stderr, p.stderr[-2000:]
