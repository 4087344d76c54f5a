"""Process-level tests: real ``kraftkeeper start`` processes on loopback, real fsync."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from quorum.client import QuorumClient
from quorum.types import ErrorCode, KraftError
from testkit.polling import ANY_ERROR, wait_until
from tests.engine.cluster import LocalCluster, run_cli
from tests.engine.http import call

pytestmark = pytest.mark.slow


async def _put_many(bootstrap: str, keys: range, value: bytes = b"v", concurrency: int = 32) -> set[str]:
    """Write keys with bounded concurrency; returns the keys whose write was acknowledged."""
    acked: set[str] = set()
    sem = asyncio.Semaphore(concurrency)
    async with QuorumClient(bootstrap, timeout=30) as c:

        async def one(i: int) -> None:
            async with sem:
                try:
                    await c.put(f"k{i}", value + str(i).encode())
                    acked.add(f"k{i}")
                except KraftError:
                    pass

        await asyncio.gather(*(one(i) for i in keys))
    return acked


def test_cli_put_get_delete(cluster: LocalCluster) -> None:
    cluster.leader()
    run_cli("kv", "put", "--bootstrap", cluster.bootstrap, "alpha", "one")
    assert run_cli("kv", "get", "--bootstrap", cluster.bootstrap, "alpha").stdout.strip() == "one"
    run_cli("kv", "delete", "--bootstrap", cluster.bootstrap, "alpha")
    p = run_cli("kv", "get", "--bootstrap", cluster.bootstrap, "alpha", check=False)
    assert p.returncode == 1 and p.stderr.startswith("NOT_FOUND:")


def test_describe_shows_three_voters_with_uuids(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    d = cluster.describe()
    assert d["leader_id"] == leader
    assert sorted((v["id"], v["uuid"]) for v in d["voters"]) == sorted(cluster.uuids.items())
    assert d["observers"] == [] and d["pending_voter_change"] is None
    text = run_cli("quorum", "describe", "--bootstrap", cluster.bootstrap, "--replication").stdout
    assert "ReplicaUuid" in text and cluster.uuids[1] in text
    status = run_cli("quorum", "describe", "--bootstrap", cluster.endpoint(2), "--status").stdout
    assert f"LeaderId:               {leader}" in status


def test_kill_leader_keeps_every_acknowledged_key(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    acked = asyncio.run(_put_many(cluster.bootstrap, range(300)))
    assert len(acked) == 300
    cluster.kill(leader)
    new_leader = wait_until(
        "a new leader",
        lambda: (lambda d: d["leader_id"] if d["leader_id"] not in (-1, leader) else None)(
            cluster.describe()
        ),
        30,
        0.05,
        errors=ANY_ERROR,
    )
    assert new_leader != leader

    async def read_all() -> dict[str, bytes | None]:
        async with QuorumClient(cluster.bootstrap, timeout=30) as c:
            return {k: await c.get(k) for k in sorted(acked)}

    values = asyncio.run(read_all())
    assert all(values[k] == b"v" + k[1:].encode() for k in acked)
    # The old leader comes back and catches up.
    cluster.start(leader)
    hw = cluster.describe()["high_watermark"]
    wait_until(
        "the old leader to catch up",
        lambda: any(v["id"] == leader and v["log_end_offset"] >= hw for v in cluster.describe()["voters"]),
        30,
        0.05,
        errors=ANY_ERROR,
    )


def test_restarted_node_catches_up_through_snapshot(tmp_path: Path) -> None:
    with LocalCluster(
        tmp_path, 3, config={"snapshot": {"max_bytes": 20000}, "log": {"segment_bytes": 16384}}
    ).up() as c:
        lagging = 3 if c.leader() != 3 else 2
        # Writes start once every voter holds the bootstrap voter set (KIP-856): before that,
        # killing a voter would leave the other two refusing writes until it returns.
        wait_until(
            "a first write",
            lambda: c.call(lambda cl: cl.put("warm-up", b"1"), timeout=5) >= 0,
            60,
            0.05,
            errors=ANY_ERROR,
        )
        c.kill(lagging)
        acked = asyncio.run(_put_many(c.bootstrap, range(2000), value=b"x" * 50))
        assert len(acked) == 2000
        # Wait until the others have snapshotted and dropped old segments.
        wait_until(
            "a snapshot on a live node",
            lambda: any(
                p.name.endswith(".checkpoint") for p in c.data_dir(1 if lagging != 1 else 2).rglob("*")
            ),
            30,
            0.05,
            errors=ANY_ERROR,
        )
        c.start(lagging)
        hw = c.describe()["high_watermark"]
        wait_until(
            "the lagging node to catch up",
            lambda: any(v["id"] == lagging and v["log_end_offset"] >= hw for v in c.describe()["voters"]),
            60,
            0.05,
            errors=ANY_ERROR,
        )
        assert any(p.name.endswith(".checkpoint") for p in c.data_dir(lagging).rglob("*"))
        # Kill the others: the snapshot-restored node must still serve all keys with one peer.
        other = next(i for i in (1, 2, 3) if i != lagging)
        c.kill(next(i for i in (1, 2, 3) if i not in (lagging, other)))
        vals = c.call(lambda cl: asyncio.gather(*(cl.get(f"k{i}") for i in range(0, 2000, 97))), timeout=60)
        assert vals == [b"x" * 50 + str(i).encode() for i in range(0, 2000, 97)]


def test_disk_replacement_add_then_remove(cluster: LocalCluster) -> None:
    """KIP-856 "Disk Failure Recovery Scenario" with real processes."""
    leader = cluster.leader()
    victim = 3 if leader != 3 else 2
    acked = asyncio.run(_put_many(cluster.bootstrap, range(1000)))
    assert len(acked) == 1000
    old = cluster.uuids[victim]
    new = cluster.replace_disk(victim)
    assert new != old

    def observer_seen() -> Any:
        d = cluster.describe()
        return [o for o in d["observers"] if o["id"] == victim and o["uuid"] == new]

    wait_until(
        "the replaced node as an observer with its new UUID", observer_seen, 30, 0.05, errors=ANY_ERROR,
    )
    run_cli("quorum", "add-voter", "--bootstrap", cluster.bootstrap, "--id", str(victim), "--uuid", new)
    d = cluster.describe()
    assert (victim, new) in {(v["id"], v["uuid"]) for v in d["voters"]}
    assert (victim, old) in {(v["id"], v["uuid"]) for v in d["voters"]}
    # Second add of the same voter: VOTER_ALREADY_ADDED.
    p = run_cli(
        "quorum",
        "add-voter",
        "--bootstrap",
        cluster.bootstrap,
        "--id",
        str(victim),
        "--uuid",
        new,
        check=False,
    )
    assert p.returncode != 0 and p.stderr.startswith("VOTER_ALREADY_ADDED")
    run_cli("quorum", "remove-voter", "--bootstrap", cluster.bootstrap, "--id", str(victim), "--uuid", old)
    d = cluster.describe()
    expected = {(i, u) for i, u in cluster.uuids.items()}
    assert {(v["id"], v["uuid"]) for v in d["voters"]} == expected
    p = run_cli(
        "quorum",
        "remove-voter",
        "--bootstrap",
        cluster.bootstrap,
        "--id",
        str(victim),
        "--uuid",
        old,
        check=False,
    )
    assert p.returncode != 0 and p.stderr.startswith("VOTER_ALREADY_REMOVED")
    # The new node serves every key once the others are gone but one.
    survivor = next(i for i in (1, 2, 3) if i != victim)
    cluster.kill(next(i for i in (1, 2, 3) if i not in (victim, survivor)))

    async def read_from_quorum() -> list[bytes | None]:
        async with QuorumClient(f"{cluster.endpoint(victim)},{cluster.endpoint(survivor)}", timeout=30) as c:
            return [await c.get(f"k{i}") for i in range(0, 1000, 37)]

    assert asyncio.run(read_from_quorum()) == [b"v" + str(i).encode() for i in range(0, 1000, 37)]


def test_unformatted_directory_refuses_to_start(tmp_path: Path) -> None:
    p = run_cli(
        "start",
        "--dir",
        str(tmp_path / "empty"),
        "--listen",
        "127.0.0.1:1",
        "--voters",
        "1@127.0.0.1:1",
        check=False,
    )
    assert p.returncode != 0 and p.stderr.startswith("NOT_FORMATTED")


def test_format_twice_refused_and_prints_uuid(tmp_path: Path) -> None:
    out = run_cli("format", "--dir", str(tmp_path / "d"), "--cluster-id", "c1", "--node-id", "1").stdout
    uuid = out.strip().splitlines()[-1]
    assert len(uuid) == 36 and uuid == uuid.lower()
    p = run_cli("format", "--dir", str(tmp_path / "d"), "--cluster-id", "c1", "--node-id", "1", check=False)
    assert p.returncode != 0 and p.stderr.split(":")[0].isupper()
    again = (
        run_cli(
            "format",
            "--dir",
            str(tmp_path / "d"),
            "--cluster-id",
            "c1",
            "--node-id",
            "1",
            "--ignore-formatted",
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    assert again == uuid  # an existing identity is never replaced


def test_graceful_shutdown_of_leader_elects_successor(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    cluster.kill(leader, signal.SIGTERM)
    wait_until(
        "a successor leader",
        lambda: cluster.describe()["leader_id"] not in (-1, leader),
        15,
        0.05,
        errors=ANY_ERROR,
    )


def test_corrupt_segment_middle_stops_node_with_clear_error(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    asyncio.run(_put_many(cluster.bootstrap, range(200)))
    victim = 3 if leader != 3 else 2
    cluster.kill(victim)
    seg = sorted(cluster.data_dir(victim).rglob("*.log"))[0]
    saved = seg.read_bytes()
    data = bytearray(saved)
    data[len(data) // 3] ^= 0xFF
    seg.write_bytes(bytes(data))
    p = run_cli(
        "start",
        "--dir",
        str(cluster.data_dir(victim)),
        "--listen",
        cluster.endpoint(victim),
        "--voters",
        cluster.voters,
        check=False,
        timeout=30,
    )
    assert p.returncode != 0 and "CORRUPT" in p.stderr.splitlines()[-1]
    assert seg.read_bytes() == bytes(data)  # nothing dropped on the way
    seg.write_bytes(saved)
    cluster.start(victim)
    hw = cluster.describe()["high_watermark"]
    wait_until(
        "the repaired node to catch up",
        lambda: any(v["id"] == victim and v["log_end_offset"] >= hw for v in cluster.describe()["voters"]),
        30,
        0.05,
        errors=ANY_ERROR,
    )


@pytest.mark.parametrize(
    "method,path,body,code",
    [
        ("POST", "/v1/quorum/voters", b"not json", "INVALID_REQUEST"),
        ("POST", "/v1/quorum/voters", b'{"id": 1, "uuid": "x", "extra": 1}', "INVALID_REQUEST"),
        (
            "POST",
            "/v1/quorum/voters",
            b'{"id": -1, "uuid": "00000000-0000-0000-0000-000000000000"}',
            "INVALID_REQUEST",
        ),
        ("POST", "/v1/quorum/reassign", b'{"voters": [1, 1]}', "INVALID_REQUEST"),
        ("POST", "/raft/v1/fetch", b"\x00\x00", "INVALID_REQUEST"),
        ("POST", "/raft/v1/fetch", b"\x02\x00\x00\x00{}", "INVALID_REQUEST"),
        ("POST", "/raft/v1/nope", b"", "INVALID_REQUEST"),
        ("PUT", "/v1/kv/big", b"x" * (5 * 1024 * 1024), "PAYLOAD_TOO_LARGE"),
    ],
)
def test_bad_input_gets_clear_error_and_node_keeps_serving(
    cluster: LocalCluster, method: str, path: str, body: bytes, code: str
) -> None:
    cluster.leader()
    cluster.call(lambda c: c.put("keep", b"me"))

    async def send(endpoint: str) -> tuple[int, Any]:
        import aiohttp

        async with (
            aiohttp.ClientSession() as s,
            s.request(method, f"http://{endpoint}{path}", data=body) as r,
        ):
            return r.status, await r.json()

    # Send to the leader; should leadership move meanwhile (421), ask again.
    for _ in range(20):
        status, obj = asyncio.run(send(cluster.endpoint(cluster.describe()["leader_id"])))
        if status != 421:
            break
    assert status >= 400 and obj["error_code"] == code and obj["message"]
    assert cluster.call(lambda c: c.get("keep")) == b"me"


def test_wrong_cluster_id_rpc_is_refused(cluster: LocalCluster) -> None:
    from quorum.core import messages as m
    from quorum.runtime import wire

    cluster.leader()
    # node 1 may still be starting when the other two elected a leader
    wait_until(
        "node 1 ready",
        lambda: call(cluster.endpoint(1), "GET", "/readyz")[0] == 200,
        30,
        0.05,
        errors=ANY_ERROR,
    )
    req = m.FetchRequest(1, "other-cluster", 9, None, 0, 0, 0, 0, 1024)

    async def send() -> Any:
        import aiohttp

        async with (
            aiohttp.ClientSession() as s,
            s.post(f"http://{cluster.endpoint(1)}/raft/v1/fetch", data=wire.encode(req)) as r,
        ):
            return wire.decode(m.FetchResponse, await r.read())

    resp = asyncio.run(send())
    assert resp.error_code is ErrorCode.INCONSISTENT_CLUSTER_ID
    assert cluster.call(lambda c: c.put("still", b"ok")) >= 0


def test_metrics_and_health_endpoints(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    cluster.call(lambda c: c.put("m", b"1"))
    status, body = cluster.call(lambda c: c.node_get(cluster.endpoint(leader), "/metrics"))
    text = body.decode()
    assert status == 200
    for name in (
        "kraftkeeper_current_leader",
        "kraftkeeper_current_epoch",
        "kraftkeeper_current_vote",
        "kraftkeeper_high_watermark",
        "kraftkeeper_log_end_offset",
        'kraftkeeper_current_state{state="leader"} 1',
        "kraftkeeper_election_latency_seconds_count",
        "kraftkeeper_commit_latency_seconds_count 1",
        "kraftkeeper_append_records_total",
        "kraftkeeper_rpc_fetch_requests_total",
        "kraftkeeper_poll_idle_ratio",
        "kraftkeeper_number_of_voters 3",
        "kraftkeeper_number_of_possible_voters 0",
        "kraftkeeper_pending_add_voter 0",
        "kraftkeeper_pending_remove_voter 0",
        'kraftkeeper_leader_recovery_state{state="RECOVERED"} 1',
    ):
        assert name in text, name
    for i in cluster.ports:
        status, body = cluster.call(lambda c, i=i: c.node_get(cluster.endpoint(i), "/healthz"))
        health = json.loads(body)
        assert status == 200 and health["status"] == "ok" and health["node_id"] == i
        assert cluster.uuids[i] not in body.decode()  # No storage UUID unauthenticated
        assert cluster.call(lambda c, i=i: c.node_get(cluster.endpoint(i), "/readyz"))[0] == 200


def test_single_node_json_logs(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    from tests.engine.cluster import free_ports

    port = free_ports(1)[0]
    run_cli("format", "--dir", str(tmp_path / "n1"), "--cluster-id", "solo", "--node-id", "1")
    env = dict(os.environ, KRAFTKEEPER_LOG_FORMAT="json")
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quorum.cli",
            "start",
            "--dir",
            str(tmp_path / "n1"),
            "--listen",
            f"127.0.0.1:{port}",
            "--voters",
            f"1@127.0.0.1:{port}",
        ],
        stderr=subprocess.PIPE,
        env=env,
    )
    try:

        async def put_get() -> bytes | None:
            async with QuorumClient(f"127.0.0.1:{port}", timeout=30) as c:
                await c.put("solo", b"yes")
                return await c.get("solo")

        assert asyncio.run(put_get()) == b"yes"
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    assert p.returncode == 0
    lines = [json.loads(line) for line in err.decode().splitlines() if line.strip()]
    assert lines and all({"ts", "level", "logger", "node", "msg"} <= set(x) for x in lines)
    assert any("role leader" in x["msg"] for x in lines)
