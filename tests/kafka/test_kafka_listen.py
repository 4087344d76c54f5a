"""Kafka's own ``kafka-metadata-quorum`` (the kafka-tools jar) against a KRaftKeeper quorum through
the Kafka-wire listener (``python -m quorum.kafka``, the listener ``kraftkeeper start
--kafka-listen`` runs): its describe outputs parsed and compared with our describe, the
add-controller / remove-controller round trip of a disk replacement, Kafka error codes for our
refusals, and Kafka's answers to API keys and versions we do not serve."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from kafka.protocol.admin import ListGroupsRequest, ListGroupsResponse  # type: ignore[import-untyped]
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse  # type: ignore[import-untyped]
from kraftkeeper_operator.kafka.backend import KafkaQuorum
from kraftkeeper_operator.kafka.cluster import free_port, metadata_quorum

from quorum.kafka.listener import NodeKafkaListener
from quorum.types import ErrorCode, KraftError
from testkit.polling import wait_until
from tests.engine.cluster import LocalCluster
from tests.kafka.watcher import NOT_YET

pytestmark = pytest.mark.slow


def b64(u: str) -> str:
    return base64.urlsafe_b64encode(uuid.UUID(u).bytes).decode().rstrip("=")


class Gateway:
    def __init__(self, bootstrap: str, log: Path) -> None:
        self.port = free_port()
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "quorum.kafka",
                    "--listen",
                    f"127.0.0.1:{self.port}",
                    "--bootstrap",
                    bootstrap,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

        def up() -> bool:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True

        wait_until("the Kafka listener", up, 60, errors=NOT_YET)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def quorum(tmp_path: Path, kafka_jars: Path) -> Iterator[tuple[LocalCluster, Gateway]]:
    (tmp_path / "kk").mkdir()
    c = LocalCluster(tmp_path / "kk", 3).up()
    gw: Gateway | None = None
    try:
        c.leader(60)
        gw = Gateway(c.bootstrap, tmp_path / "gateway.log")
        yield c, gw
    finally:
        if gw is not None:
            gw.stop()
        c.stop()


def tool(port: int, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = metadata_quorum(f"127.0.0.1:{port}", *args)
    if check:
        assert out.returncode == 0, f"kafka-metadata-quorum {' '.join(args)}: {out.stdout}\n{out.stderr}"
    return out


def parse_status(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            v = v.strip()
            out[k.strip()] = json.loads(v) if v.startswith("[") else v
    return out


def parse_replication(text: str) -> list[dict[str, str]]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    head = [h.strip() for h in lines[0].split("\t") if h.strip()]
    return [
        dict(zip(head, [c.strip() for c in ln.split("\t") if c.strip()], strict=True)) for ln in lines[1:]
    ]


def test_kafka_tool_describes_our_quorum(quorum: tuple[LocalCluster, Gateway]) -> None:
    c, gw = quorum
    status = parse_status(tool(gw.port, "describe", "--status").stdout)
    ours = c.describe()
    assert status["ClusterId"] == ours["cluster_id"]
    assert int(status["LeaderId"]) == ours["leader_id"]
    assert int(status["LeaderEpoch"]) == ours["leader_epoch"]
    assert int(status["HighWatermark"]) <= c.describe()["high_watermark"]
    assert {(v["id"], v["directoryId"]) for v in status["CurrentVoters"]} == {
        (v["id"], b64(v["uuid"])) for v in ours["voters"]
    }
    for v in status["CurrentVoters"]:
        want = next(o["endpoint"] for o in ours["voters"] if o["id"] == v["id"])
        assert v["endpoints"] == [f"KRAFTKEEPER://{want}"]
    assert status["CurrentObservers"] == []

    rows = parse_replication(tool(gw.port, "describe", "--replication").stdout)
    ours = c.describe()
    assert {(int(r["NodeId"]), r["DirectoryId"]) for r in rows} == {
        (v["id"], b64(v["uuid"])) for v in ours["voters"]
    }
    assert [r["Status"] for r in rows].count("Leader") == 1
    leader_row = next(r for r in rows if r["Status"] == "Leader")
    assert int(leader_row["NodeId"]) == ours["leader_id"]
    assert all(int(r["LogEndOffset"]) >= 0 and int(r["LastFetchTimestamp"]) > 0 for r in rows)


def kafka_controller_config(tmp: Path, c: LocalCluster, node: int, new_uuid: str) -> Path:
    """What Kafka's add-controller reads: node.id, the controller listener, and the directory id
    from a Kafka-format meta.properties in metadata.log.dir (base64url, as Kafka writes it)."""
    meta = tmp / f"kafka-meta-{node}"
    meta.mkdir()
    (meta / "meta.properties").write_text(
        f"version=1\ncluster.id={c.cluster_id}\nnode.id={node}\ndirectory.id={b64(new_uuid)}\n"
    )
    host, port = c.endpoint(node).rsplit(":", 1)
    cfg = tmp / f"controller-{node}.properties"
    cfg.write_text(
        f"process.roles=controller\nnode.id={node}\ncontroller.listener.names=CONTROLLER\n"
        f"listeners=CONTROLLER://{host}:{port}\nmetadata.log.dir={meta}\n"
    )
    return cfg


def test_kafka_tool_remove_and_add_controller(quorum: tuple[LocalCluster, Gateway], tmp_path: Path) -> None:
    c, gw = quorum
    leader = c.leader()
    node = next(i for i in (1, 2, 3) if i != leader)
    old = next(v["uuid"] for v in c.describe()["voters"] if v["id"] == node)
    new = c.replace_disk(node)

    def observer() -> bool:
        return any(o["id"] == node and o["uuid"] == new and o["lag"] == 0 for o in c.describe()["observers"])

    wait_until("the replaced node caught up as an observer", observer, 60, errors=NOT_YET)
    status = parse_status(tool(gw.port, "describe", "--status").stdout)
    assert {"id": node, "directoryId": b64(new)}.items() <= next(
        o for o in status["CurrentObservers"] if o["id"] == node
    ).items()

    # Adding a second directory id for the id: Kafka's tool sees our refusal as a Kafka error.
    cfg = kafka_controller_config(tmp_path, c, node, new)
    tool(
        gw.port,
        "--command-config",
        str(cfg),
        "remove-controller",
        "--controller-id",
        str(node),
        f"--controller-directory-id={b64(old)}",
    )
    assert node not in {v["id"] for v in c.describe()["voters"]}
    again = tool(
        gw.port,
        "remove-controller",
        "--controller-id",
        str(node),
        f"--controller-directory-id={b64(old)}",
        check=False,
    )
    assert again.returncode != 0 and "VOTER_ALREADY_REMOVED" in again.stdout + again.stderr
    tool(gw.port, "--command-config", str(cfg), "add-controller")
    voters = {(v["id"], v["uuid"]) for v in c.describe()["voters"]}
    assert (node, new) in voters and (node, old) not in voters and len(voters) == 3
    twice = tool(gw.port, "--command-config", str(cfg), "add-controller", check=False)
    assert twice.returncode != 0 and "VOTER_ALREADY_ADDED" in twice.stdout + twice.stderr


def _exchange(port: int, frame: bytes) -> bytes | None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(frame)
        head = b""
        while len(head) < 4:
            chunk = s.recv(4 - len(head))
            if not chunk:
                return None  # closed by the listener
            head += chunk
        (size,) = struct.unpack(">i", head)
        body = b""
        while len(body) < size:
            chunk = s.recv(size - len(body))
            assert chunk, "response cut short"
            body += chunk
        return body


def test_unknown_apis_and_versions_get_kafka_answers(quorum: tuple[LocalCluster, Gateway]) -> None:
    _, gw = quorum
    # ApiVersions in a version we do not know: a v0 answer with UNSUPPORTED_VERSION and our list.
    req = ApiVersionsRequest(client_software_name="t", client_software_version="1")
    req.API_VERSION = 3
    req.with_header(correlation_id=7, client_id="t")
    frame = bytearray(req.encode(header=True, framed=True))
    struct.pack_into(">h", frame, 6, 9)  # claim version 9
    body = _exchange(gw.port, bytes(frame))
    assert body is not None
    resp = ApiVersionsResponse.decode(io.BytesIO(body), version=0, header=True)
    assert resp.header.correlation_id == 7 and resp.error_code == 35
    assert {k.api_key for k in resp.api_keys} == {18, 55, 60, 80, 81}

    # An API we do not serve (ListGroups) gets its own answer with UNSUPPORTED_VERSION.
    lg = ListGroupsRequest()
    lg.API_VERSION = 4
    lg.with_header(correlation_id=8, client_id="t")
    body = _exchange(gw.port, lg.encode(header=True, framed=True))
    assert body is not None
    out = ListGroupsResponse.decode(body, version=4, header=True)
    assert out.header.correlation_id == 8 and out.error_code == 35

    # A key nobody knows cannot be answered in its own format: the connection is closed, and
    # the listener logs why.
    assert _exchange(gw.port, struct.pack(">ihhih", 10, 999, 0, 9, -1)) is None
    wait_until(
        "the listener's log line",
        lambda: "API key 999 v0 is not served" in gw.log.read_text(),
        30,
        errors=NOT_YET,
    )


async def test_node_listener_serves_our_own_kafka_client(quorum: tuple[LocalCluster, Gateway]) -> None:
    """The in-node listener (``start --kafka-listen``) read by the operator's Kafka backend: both
    ends are ours, the quorum is real, and the describe objects agree."""
    c, _ = quorum
    endpoints = [c.endpoint(i) for i in (1, 2, 3)]
    port = free_port()
    listener = await NodeKafkaListener.start(f"127.0.0.1:{port}", endpoints[0], endpoints, tls=False)
    q = KafkaQuorum(f"127.0.0.1:{port}")
    try:
        d = await q.describe()
        ours = await asyncio.to_thread(c.describe)
        assert d["cluster_id"] == ours["cluster_id"] and d["leader_id"] == ours["leader_id"]
        assert {(v["id"], v["uuid"], v["endpoint"]) for v in d["voters"]} == {
            (v["id"], v["uuid"], v["endpoint"]) for v in ours["voters"]
        }
        # Our refusal travels as Kafka's error and comes back as our code.
        v1 = next(v for v in ours["voters"] if v["id"] == 1)
        with pytest.raises(KraftError) as e:
            await q.add_voter(1, v1["uuid"])
        assert e.value.code is ErrorCode.VOTER_ALREADY_ADDED
    finally:
        await q.close()
        await listener.close()
    with pytest.raises(KraftError, match="not available with TLS"):
        await NodeKafkaListener.start(f"127.0.0.1:{port}", endpoints[0], endpoints, tls=True)


def test_listener_caps_connections_frames_and_stalled_reads(quorum: tuple[LocalCluster, Gateway]) -> None:
    """The listener takes no credential, so what a client may hold is capped
    (quorum/kafka/limits.py): frames over the frame cap close the connection unread (ten 16 MiB
    frames once cost the gateway 164 MiB), connections over the cap are closed at once, a frame
    announced and never sent is dropped at the read deadline; the tool's requests still work."""
    c, gw = quorum
    proc = psutil.Process(gw.proc.pid)
    rss = proc.memory_info().rss
    big = []
    for _ in range(10):  # 16 MiB frames: closed after their size, nothing of them buffered
        s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
        s.sendall(struct.pack(">i", 16 * 1024 * 1024) + b"\0" * (1 << 20))
        big.append(s)
    for s in big:
        wait_until("an oversized frame's connection closed", lambda s=s: _closed(s), 30, errors=NOT_YET)
        s.close()
    held = [socket.create_connection(("127.0.0.1", gw.port), timeout=10) for _ in range(40)]
    try:
        for s in held:
            s.sendall(struct.pack(">i", 1000))  # announced, never sent
        # the ones over the cap are closed at once, the rest at the read deadline
        wait_until(
            "capped and stalled connections closed",
            lambda: all(_closed(s) for s in held),
            60,
            errors=NOT_YET,
        )
    finally:
        for s in held:
            s.close()
    assert proc.memory_info().rss - rss < 64 * 1024 * 1024
    req = ApiVersionsRequest(client_software_name="t", client_software_version="1")
    req.API_VERSION = 3
    req.with_header(correlation_id=9, client_id="t")
    body = _exchange(gw.port, req.encode(header=True, framed=True))
    assert body is not None
    assert ApiVersionsResponse.decode(io.BytesIO(body), version=3, header=True).error_code == 0
    assert "request frame of 16777216 bytes" in gw.log.read_text()
    assert c.leader(30) > 0


def _closed(s: socket.socket) -> bool:
    """True once the listener closed ``s`` (EOF or reset); never blocks."""
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True
