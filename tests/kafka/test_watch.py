"""``kraftkeeper operator watch`` against three real Kafka 4.x controllers: replaced disks healed
with no human step (the leader's too, two in a row), a watcher killed between RemoveRaftVoter and
AddRaftVoter resumes, a lost majority is reported and nothing is attempted, and a directory id
retired by a recovery is never re-added when its old disk comes back."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.kafka.backend import KafkaQuorum
from kraftkeeper_operator.kafka.cluster import KafkaControllers
from kraftkeeper_operator.kafka.watch import FAILPOINT_ENV, FAILPOINT_EXIT

from quorum.kafka.mapping import base64_to_uuid
from testkit.polling import wait_until
from tests.kafka.watcher import NOT_YET, Watcher, context_of

pytestmark = pytest.mark.slow

SUCCESS = [
    "disk_replacement_detected",
    "replica_caught_up",
    "remove_voter_started",
    "remove_voter_committed",
    "add_voter_started",
    "add_voter_committed",
    "recovery_completed",
]


def describe(k: KafkaControllers) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        q = KafkaQuorum(k.bootstrap, timeout=5.0)
        try:
            return await q.describe()
        finally:
            await q.close()

    return asyncio.run(go())


def uuid_of(k: KafkaControllers, i: int) -> str:
    d = k.controllers[i].directory_id()
    assert d is not None
    return str(base64_to_uuid(d))


def whole(k: KafkaControllers) -> dict[str, Any] | None:
    """The describe object once the voters are exactly each controller's current disk, caught up
    (lag -1, no fetch seen by the leader yet, is not)."""
    d = describe(k)
    want = {(i, uuid_of(k, i)) for i in k.controllers}
    got = {(v["id"], v["uuid"]) for v in d["voters"]}
    return d if got == want and all(0 <= v["lag"] <= 100 for v in d["voters"]) else None


def recovery_of(w: Watcher, replica: int, new: str) -> list[dict[str, Any]]:
    """The events of the one recovery that brought (replica, new) in, once it logged its end (the
    quorum may show the new voter a moment before the watcher has the AddRaftVoter answer)."""

    def ended() -> bool:
        return any(
            e["type"] in ("recovery_completed", "recovery_failed")
            and e["replica_id"] == replica
            and e["new_uuid"] == new
            for e in w.events_list()
        )

    wait_until(f"the end of the recovery of ({replica}, {new}) in the event log", ended, 60, errors=NOT_YET)
    evs = w.events_list()
    ids = {e["recovery_id"] for e in evs if e["replica_id"] == replica and e["new_uuid"] == new}
    assert len(ids) == 1, f"expected one recovery of ({replica}, {new}), got {ids}"
    return [e for e in evs if e["recovery_id"] in ids]


def test_watch_heals_the_leader_then_another_controller(
    kafka_controllers: KafkaControllers, tmp_path: Path
) -> None:
    k = kafka_controllers
    d = wait_until("three caught-up voters", lambda: whole(k), 120, errors=NOT_YET)
    w = Watcher(k.bootstrap, tmp_path / "events", "--stabilization-seconds", "1").start()
    try:
        first = d["leader_id"]
        second = next(i for i in k.controllers if i != first)
        for victim in (first, second):
            old = uuid_of(k, victim)
            # The leader's disk is replaced and its controller started again at once, while the
            # survivors still name it leader: Kafka 4.4 halts such a controller (see
            # kafka/cluster.py); the supervisor starts it again, as a kubelet would.
            new = str(base64_to_uuid(k.replace_disk(victim)))
            healed = wait_until(
                f"controller {victim} healed",
                lambda: whole(k),
                180,
                errors=NOT_YET,
                context=context_of(k, w),
            )
            assert (victim, new) in {(v["id"], v["uuid"]) for v in healed["voters"]}
            evs = recovery_of(w, victim, new)
            assert [e["type"] for e in evs] == SUCCESS
            assert {e["old_uuid"] for e in evs} == {old}
            assert {e["cluster"] for e in evs} == {k.cluster_id}
        st = wait_until(
            "the watcher's Running status",
            lambda: (s := w.status())["phase"] == "Running" and s,
            60,
            errors=NOT_YET,
        )
        assert st["cluster"] == k.cluster_id
        metric = f'kraftkeeper_operator_recoveries_total{{quorum="{k.cluster_id}",result="completed"}} 2.0'
        assert metric in w.metrics()
    finally:
        w.stop()


@pytest.mark.parametrize("lose_state", [False, True], ids=["state-file", "state-file-lost"])
def test_watch_killed_between_remove_and_add_resumes(
    kafka_controllers: KafkaControllers, tmp_path: Path, lose_state: bool
) -> None:
    k = kafka_controllers
    d = wait_until("three caught-up voters", lambda: whole(k), 120, errors=NOT_YET)
    events = tmp_path / "events"
    # The failpoint kills the watcher (no clean-up) right after RemoveRaftVoter committed and
    # was recorded, just before it would start AddRaftVoter.
    w = Watcher(k.bootstrap, events, "--stabilization-seconds", "0")
    w.env[FAILPOINT_ENV] = "crash-before:add_voter_started"
    w.start()
    victim = next(i for i in k.controllers if i != d["leader_id"])
    new = str(base64_to_uuid(k.replace_disk(victim)))
    try:
        assert w.proc is not None
        assert w.proc.wait(timeout=180) == FAILPOINT_EXIT
    finally:
        w.stop(kill=True)
    assert w.types()[-1] == "remove_voter_committed", w.types()
    mid = describe(k)
    assert victim not in {v["id"] for v in mid["voters"]}, "RemoveRaftVoter was not committed"
    recs = json.loads((events / "_watch-state.json").read_text())["recoveries"]
    assert [r["phase"] for r in recs if r["replicaId"] == victim] == ["Removed"]

    if lose_state:  # the event log alone says a recovery stopped between its two steps
        (events / "_watch-state.json").unlink()
    w2 = Watcher(k.bootstrap, events, "--stabilization-seconds", "0").start()
    try:
        healed = wait_until(f"controller {victim} added back", lambda: whole(k), 180, errors=NOT_YET)
        assert (victim, new) in {(v["id"], v["uuid"]) for v in healed["voters"]}
        assert [e["type"] for e in recovery_of(w2, victim, new)] == SUCCESS
    finally:
        w2.stop()


def test_watch_majority_down_attempts_nothing(kafka_controllers: KafkaControllers, tmp_path: Path) -> None:
    k = kafka_controllers
    d = wait_until("three caught-up voters", lambda: whole(k), 120, errors=NOT_YET)
    w = Watcher(k.bootstrap, tmp_path / "events", "--stabilization-seconds", "0").start()
    try:
        wait_until(
            "watcher sees a healthy quorum", lambda: w.status().get("phase") == "Running", 60, errors=NOT_YET,
        )
        down = [i for i in k.controllers if i != d["leader_id"]]
        for i in down:
            k.stop(i, kill=True)
        # Wait until the watcher sees the majority gone: for the live window after a kill, a
        # voter's last fetch is still recent and counts it live (the policy's
        # live_window_seconds), so a replacement caught up inside that window could be acted on.
        wait_until(
            "QuorumLost reported", lambda: w.status().get("phase") == "QuorumLost", 120, errors=NOT_YET,
        )
        # One of the lost controllers even comes back on a new disk: still no majority.
        k.replace_disk(down[0])
        st = wait_until(
            "QuorumLost reported",
            lambda: (s := w.status()).get("phase") == "QuorumLost" and s,
            120,
            errors=NOT_YET,
        )
        lost = next(c for c in st["conditions"] if c["type"] == "QuorumLost")
        assert lost["status"] == "True" and lost["message"]
        w.passes_after(5)
        assert w.status()["phase"] == "QuorumLost"
        assert not [t for t in w.types() if t.endswith("_started")], w.types()
        assert f'kraftkeeper_operator_quorum_lost{{quorum="{k.cluster_id}"}} 1.0' in w.metrics()
    finally:
        w.stop()


def test_retired_directory_id_is_never_re_added(kafka_controllers: KafkaControllers, tmp_path: Path) -> None:
    k = kafka_controllers
    d = wait_until("three caught-up voters", lambda: whole(k), 120, errors=NOT_YET)
    w = Watcher(k.bootstrap, tmp_path / "events", "--stabilization-seconds", "0").start()
    try:
        victim = next(i for i in k.controllers if i != d["leader_id"])
        old = uuid_of(k, victim)
        k.stop(victim, kill=True)
        backup = tmp_path / "old-disk"
        shutil.copytree(k.controllers[victim].data_dir, backup)
        new = str(base64_to_uuid(k.wipe_and_format(victim)))
        k.start(victim)
        wait_until(f"controller {victim} healed", lambda: whole(k), 180, errors=NOT_YET)
        assert [e["type"] for e in recovery_of(w, victim, new)] == SUCCESS

        # The watcher restarts and its state file is lost: the event log still names the retired id.
        w.stop()
        (tmp_path / "events" / "_watch-state.json").unlink()
        w = Watcher(k.bootstrap, tmp_path / "events", "--stabilization-seconds", "0").start()
        wait_until(
            "log", lambda: "1 recoveries taken from the event log" in w.log.read_text(), 60, errors=NOT_YET,
        )

        # The old disk comes back (a stale volume re-attached): same id, the retired directory id.
        k.stop(victim, kill=True)
        shutil.rmtree(k.controllers[victim].data_dir)
        shutil.copytree(backup, k.controllers[victim].data_dir)
        assert uuid_of(k, victim) == old
        k.start(victim)

        def old_is_live_observer() -> bool:
            st = describe(k)
            return any(
                o["id"] == victim and o["uuid"] == old and o["lag"] <= 100 and o["last_fetch_timestamp"] > 0
                for o in st["observers"]
            )

        wait_until("the old disk fetching as an observer", old_is_live_observer, 120, errors=NOT_YET)
        w.passes_after(10)
        now = describe(k)
        assert (victim, new) in {(v["id"], v["uuid"]) for v in now["voters"]}
        assert (victim, old) not in {(v["id"], v["uuid"]) for v in now["voters"]}
        assert not [e for e in w.events_list() if e["new_uuid"] == old]
        assert w.types().count("disk_replacement_detected") == 1
    finally:
        w.stop()


def test_watch_through_a_broker_only(kafka_controllers: KafkaControllers, tmp_path: Path) -> None:
    """Only a broker's address is given: the broker forwards DescribeQuorum, RemoveRaftVoter and
    AddRaftVoter to the active controller."""
    k = kafka_controllers
    d = wait_until("three caught-up voters", lambda: whole(k), 120, errors=NOT_YET)
    broker = k.add_broker()
    w = Watcher(
        broker.endpoint, tmp_path / "events", "--stabilization-seconds", "0", flag="--kafka-bootstrap-servers"
    ).start()
    try:
        wait_until(
            "the watcher sees the quorum through the broker",
            lambda: w.status().get("phase") == "Running",
            120,
            errors=NOT_YET,
        )
        victim = next(i for i in k.controllers if i != d["leader_id"])
        new = str(base64_to_uuid(k.replace_disk(victim)))
        healed = wait_until(
            f"controller {victim} healed through the broker", lambda: whole(k), 180, errors=NOT_YET,
        )
        assert (victim, new) in {(v["id"], v["uuid"]) for v in healed["voters"]}
        evs = recovery_of(w, victim, new)
        assert [e["type"] for e in evs] == SUCCESS and {e["cluster"] for e in evs} == {k.cluster_id}
    finally:
        w.stop()


def test_add_then_remove_is_refused_by_kafka_and_changes_nothing(
    kafka_controllers: KafkaControllers, tmp_path: Path
) -> None:
    """Kafka keeps one directory id per voter id: AddThenRemove ends in recovery_failed naming
    DUPLICATE_VOTER, and the voter set is left as it was (the reason RemoveThenAdd is the default)."""
    k = kafka_controllers
    d = wait_until("three caught-up voters", lambda: whole(k), 120, errors=NOT_YET)
    w = Watcher(
        k.bootstrap, tmp_path / "events", "--stabilization-seconds", "0", "--order", "AddThenRemove"
    ).start()
    try:
        victim = next(i for i in k.controllers if i != d["leader_id"])
        old = uuid_of(k, victim)
        new = str(base64_to_uuid(k.replace_disk(victim)))
        evs = recovery_of(w, victim, new)
        assert [e["type"] for e in evs] == [
            "disk_replacement_detected",
            "replica_caught_up",
            "add_voter_started",
            "recovery_failed",
        ]
        assert "DUPLICATE_VOTER" in evs[-1]["detail"]["reason"]
        assert (victim, old) in {(v["id"], v["uuid"]) for v in describe(k)["voters"]}
    finally:
        w.stop()
