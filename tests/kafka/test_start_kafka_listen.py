"""``kraftkeeper start --kafka-listen HOST:PORT``: a real node answers Kafka's own
``kafka-metadata-quorum`` on that port, and refuses a non-loopback Kafka listener."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kraftkeeper_operator.kafka.cluster import free_port

from testkit.polling import wait_until
from tests.kafka.test_kafka_listen import b64, parse_status, tool
from tests.kafka.watcher import NOT_YET

pytestmark = pytest.mark.slow

KK = [sys.executable, "-m", "quorum.cli"]


@pytest.fixture
def node(tmp_path: Path, kafka_jars: Path) -> Iterator[tuple[str, int, subprocess.Popen[bytes]]]:
    d = tmp_path / "n1"
    out = subprocess.run(
        [*KK, "format", "--dir", str(d), "--cluster-id", "kafka-listen-test", "--node-id", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    uuid = out.stdout.strip().splitlines()[-1]
    port, kport = free_port(), free_port()
    with open(tmp_path / "node.log", "wb") as log:
        p = subprocess.Popen(
            [
                *KK,
                "start",
                "--dir",
                str(d),
                "--listen",
                f"127.0.0.1:{port}",
                "--voters",
                f"1@127.0.0.1:{port}",
                "--kafka-listen",
                f"127.0.0.1:{kport}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def up() -> bool:
            assert p.poll() is None, (tmp_path / "node.log").read_text()
            with socket.create_connection(("127.0.0.1", kport), timeout=1):
                return True

        wait_until("the node's Kafka listener", up, 60, errors=NOT_YET)
        yield uuid, kport, p
    finally:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_start_with_kafka_listen_answers_kafka_tool(node: tuple[str, int, subprocess.Popen[bytes]]) -> None:
    uuid, kport, _ = node

    def described() -> dict[str, object] | None:
        out = tool(kport, "describe", "--status", check=False)
        return parse_status(out.stdout) if out.returncode == 0 else None

    status = wait_until("kafka-metadata-quorum describe --status", described, 120, errors=NOT_YET)
    assert status["ClusterId"] == "kafka-listen-test" and status["LeaderId"] == "1"
    assert [(v["id"], v["directoryId"]) for v in status["CurrentVoters"]] == [(1, b64(uuid))]  # type: ignore[union-attr]


def test_start_refuses_a_public_kafka_listener(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    subprocess.run(
        [*KK, "format", "--dir", str(d), "--cluster-id", "c", "--node-id", "1"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    port = free_port()
    out = subprocess.run(
        [
            *KK,
            "start",
            "--dir",
            str(d),
            "--listen",
            f"127.0.0.1:{port}",
            "--voters",
            f"1@127.0.0.1:{port}",
            "--kafka-listen",
            f"0.0.0.0:{free_port()}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "INVALID_REQUEST" in out.stderr and "loopback" in out.stderr, out.stderr
