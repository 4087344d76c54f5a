"""Kafka's own ``kafka-metadata-quorum remove-controller`` against real nodes started with
``--kafka-listen``, removing a voter that has no replacement: on Kafka that shrinks the quorum,
and so it does here, carried out as a reassignment to the remaining voters (the engine's checks
apply), answered once the voter is gone. The last voter is never removed."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorum.localports import free_ports
from testkit.polling import ANY_ERROR, wait_until
from tests.engine.cluster import LocalCluster
from tests.kafka.test_kafka_listen import b64, parse_status, tool

pytestmark = pytest.mark.slow


class KafkaListenCluster(LocalCluster):
    """Three nodes, each also answering Kafka's protocol on its own loopback port."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, 3)
        self.kafka_ports = dict(zip((1, 2, 3), free_ports(3), strict=True))

    def start_args(self, i: int) -> list[str]:
        return ["--kafka-listen", f"127.0.0.1:{self.kafka_ports[i]}"]


@pytest.fixture
def cluster(tmp_path: Path, kafka_jars: Path) -> Iterator[KafkaListenCluster]:
    c = KafkaListenCluster(tmp_path).up()
    try:
        c.leader(60)
        yield c
    finally:
        c.stop()


def _voters(c: LocalCluster) -> dict[int, str]:
    return {int(v["id"]): str(v["uuid"]) for v in c.describe()["voters"]}


def test_remove_controller_without_replacement_shrinks_the_quorum(cluster: KafkaListenCluster) -> None:
    c = cluster
    leader = c.leader()
    port = c.kafka_ports[leader]
    first, second = (i for i in (1, 2, 3) if i != leader)
    # The bootstrap voters' storage UUIDs are known to the leader only once each has fetched
    # (until then describe says None): the tool needs the real directory id.
    def known() -> dict[int, str] | None:
        v = _voters(c)
        return v if "None" not in v.values() else None

    before = wait_until("every voter's storage UUID known to the leader", known, 60, 0.05, errors=ANY_ERROR)

    def remove(i: int, check: bool = True) -> subprocess.CompletedProcess[str]:
        # "=": a base64url directory id may start with "-", which the tool would read as an option.
        args = ["--controller-id", str(i), f"--controller-directory-id={b64(before[i])}"]
        return tool(port, "remove-controller", *args, check=check)

    # 3 -> 2: a follower with no replacement (its disk never changed) leaves the voters.
    remove(first)
    assert _voters(c) == {i: u for i, u in before.items() if i != first}
    status = parse_status(tool(port, "describe", "--status").stdout)
    assert {v["id"] for v in status["CurrentVoters"]} == {leader, second}
    assert c.call(lambda q: q.put("after-shrink", b"committed")) >= 0  # the quorum still commits

    # 2 -> 1, then the last voter: refused by name, nothing changes.
    remove(second)
    assert _voters(c) == {leader: before[leader]}
    last = remove(leader, check=False)
    assert last.returncode != 0 and "is the last voter" in last.stdout + last.stderr
    assert _voters(c) == {leader: before[leader]}
    assert c.call(lambda q: q.get("after-shrink")) == b"committed"
