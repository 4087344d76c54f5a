"""Local mode: `kraftkeeper operator local` supervising real node processes, and
`kraftkeeper cluster replace-disk`. Bad input first (no engine needed), then the real thing."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from kraftkeeper_operator.local.cluster import ClusterLayout
from kraftkeeper_operator.local.operator import local_main

from quorum.storage.meta import load_meta
from testkit.polling import ANY_ERROR, wait_until
from tests.operator.helpers import FULL
from tests.operator.operator_nodes import (
    STALE_NODE_CONFIG,
    LocalCluster,
    engine_missing,
    make_stale_longer_log,
)


def read_events(d: Path) -> list[dict[str, object]]:
    out = []
    for f in sorted((d / "events").rglob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--nodes", "0"], "--nodes 0"),
        (["--nodes", "12"], "--nodes 12"),
        (["--base-port", "80"], "--base-port 80"),
        (["--stabilization-seconds", "700"], "timeoutSeconds"),
        (["--order", "Sideways"], "--order"),
    ],
)
def test_local_rejects_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    with pytest.raises(SystemExit) if needle == "--order" else _nothing():
        rc = local_main(["--dir", str(tmp_path / "c"), *args])
        assert rc == 2
    err = capsys.readouterr().err
    assert "INVALID_REQUEST" in err and needle in err
    assert not (tmp_path / "c" / "node-1").exists()


def test_local_refuses_to_change_the_node_count_of_an_existing_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ClusterLayout.load_or_create(tmp_path, 3, 20000)
    assert local_main(["--dir", str(tmp_path), "--nodes", "5"]) == 2
    assert "created with 3 nodes" in capsys.readouterr().err
    assert json.loads((tmp_path / "cluster.json").read_text())["nodes"] == 3


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


# ---------------------------------------------------------------------------------------------
# Real node processes

needs_engine = pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))


@needs_engine
@pytest.mark.slow
def test_local_mode_recovers_a_replaced_disk_automatically(tmp_path: Path) -> None:
    d = tmp_path / "demo"
    c = LocalCluster(d, 3, extra=["--stabilization-seconds", "1", "--live-window-seconds", "3"])
    try:
        first = wait_until(
            "a leader and 3 voters",
            lambda: (
                (x := c.describe())
                and x["leader_id"] > 0
                and len(x["voters"]) == 3
                and all(v["uuid"] for v in x["voters"])
                and x
            ),
            90, errors=ANY_ERROR,
        )
        assert c.kk("kv", "put", "--bootstrap", c.bootstrap(), "k1", "v1").returncode == 0
        victim = int(first["leader_id"])  # the leader's disk is the awkward one
        old = next(v["uuid"] for v in first["voters"] if v["id"] == victim)
        out = c.kk("cluster", "replace-disk", "--dir", str(d), "--node", str(victim))
        assert out.returncode == 0, out.stderr
        new = out.stdout.strip().splitlines()[-1]
        assert new != old
        meta = load_meta(d / f"node-{victim}")
        assert meta.storage_uuid == new and meta.initial_bootstrap is False  # a replacement disk

        def swapped() -> dict[str, object] | None:
            x = c.describe()
            if not x or x["pending_voter_change"] is not None:
                return None
            keys = {(v["id"], v["uuid"]) for v in x["voters"]}
            return x if (victim, new) in keys and (victim, old) not in keys and len(keys) == 3 else None

        wait_until("voters swapped (leader, old) -> (leader, new)", swapped, 120, errors=ANY_ERROR)
        st = wait_until(
            "status shows the recovery completed",
            lambda: [r for r in c.status()["recoveries"] if r["phase"] == "Completed"],
            30, errors=ANY_ERROR,
        )
        # /status takes no credential: it names no storage UUID (the state file, 0600, does)
        assert st[0]["replicaId"] == victim and "newUuid" not in st[0]
        assert old not in json.dumps(c.status()) and new not in json.dumps(c.status())
        saved = json.loads((d / "operator-state.json").read_text())["recoveries"]
        assert [(r["oldUuid"], r["newUuid"]) for r in saved if r["phase"] == "Completed"] == [(old, new)]
        events = read_events(d)
        rid = next(e["recovery_id"] for e in events if e["type"] == "disk_replacement_detected")
        seq = [e["type"] for e in events if e["recovery_id"] == rid and e["type"] in FULL]
        assert seq == FULL, seq
        assert all(
            e["cluster"] == "demo" and e["replica_id"] == victim for e in events if e["recovery_id"] == rid
        )
        assert 'kraftkeeper_operator_recoveries_total{quorum="demo",result="completed"} 1.0' in c.metrics()
        got = c.kk("kv", "get", "--bootstrap", c.bootstrap(), "k1")
        assert got.returncode == 0 and got.stdout.strip() == "v1"  # nothing committed was lost
    finally:
        rc = c.stop()
    assert rc == 0, c.tail()
    for i in (1, 2, 3):  # graceful shutdown stopped every node
        assert not (d / "control" / f"node-{i}.pid").exists()


@needs_engine
@pytest.mark.slow
def test_supervisor_restarts_a_node_that_dies(tmp_path: Path) -> None:
    d = tmp_path / "c"
    c = LocalCluster(d, 3, extra=["--no-recovery"])
    try:
        pidfile = d / "control" / "node-2.pid"
        pid = wait_until(
            "node 2 started", lambda: pidfile.exists() and int(pidfile.read_text()), 60, errors=ANY_ERROR,
        )
        os.kill(pid, signal.SIGKILL)
        newpid = wait_until(
            "node 2 restarted",
            lambda: pidfile.exists() and (p := int(pidfile.read_text())) != pid and p,
            60, errors=ANY_ERROR,
        )
        assert newpid != pid
        wait_until("a leader", lambda: (x := c.describe()) and x["leader_id"] > 0, 90, errors=ANY_ERROR)
    finally:
        assert c.stop() == 0, c.tail()


@needs_engine
@pytest.mark.slow
def test_unclean_recovery_after_losing_a_majority_when_allowed(tmp_path: Path) -> None:
    """Nodes 2 and 3 go away for good (held stopped through the replace-disk handshake files);
    after --unclean-after-seconds the supervisor makes node 1 the sole voter (KIP-704 style)."""
    d = tmp_path / "u"
    c = LocalCluster(d, 3, extra=["--live-window-seconds", "2", "--unclean-after-seconds", "3"])
    try:
        wait_until(
            "a leader and 3 known voters",
            lambda: (x := c.describe()) and x["leader_id"] > 0 and all(v["uuid"] for v in x["voters"]) and x,
            90, errors=ANY_ERROR,
        )
        assert c.kk("kv", "put", "--bootstrap", c.bootstrap(), "k1", "v1").returncode == 0
        wait_until(
            "k1 on every voter",
            lambda: (
                (x := c.describe()) and all(v["log_end_offset"] >= x["high_watermark"] for v in x["voters"])
            ),
            30, errors=ANY_ERROR,
        )
        for node in (2, 3):  # the supervisor keeps a held node stopped while the holder lives
            (d / "control" / f"node-{node}.hold").write_text(f"{os.getpid()}\n")
        for node in (2, 3):
            wait_until(
                f"node {node} stopped",
                lambda n=node: (d / "control" / f"node-{n}.stopped").exists(),
                60, errors=ANY_ERROR,
            )

        def sole_voter() -> dict[str, object] | None:
            x = c.describe()
            if not x or x["leader_recovery_state"] != "RECOVERED":
                return None
            return x if [v["id"] for v in x["voters"]] == [1] else None

        wait_until("node 1 sole voter, RECOVERED", sole_voter, 120, errors=ANY_ERROR)
        got = c.kk("kv", "get", "--bootstrap", c.bootstrap(), "k1")
        assert got.returncode == 0 and got.stdout.strip() == "v1"  # the survivor had it
        assert c.kk("kv", "put", "--bootstrap", c.bootstrap(), "k2", "v2").returncode == 0  # writable again
        events = [e for e in read_events(d) if e["type"] == "unclean_recovery"]
        assert len(events) == 1
        assert events[0]["replica_id"] == 1 and "no live majority" in events[0]["detail"]["reason"]
    finally:
        for node in (2, 3):
            (d / "control" / f"node-{node}.hold").unlink(missing_ok=True)
        assert c.stop() == 0, c.tail()


@needs_engine
@pytest.mark.slow
def test_unclean_survivor_is_the_newer_epoch_not_the_longer_stale_log(tmp_path: Path) -> None:
    """Five nodes; the longest log (a cut-off former leader's writes that never
    committed) is the stale one, and a shorter log holds a write committed at a newer epoch. With
    only those two left, a supervisor allowed to recover uncleanly makes the newer-epoch replica
    the sole voter (Raft's election order), so the committed write survives and the stale ones
    are gone. The supervisor is restarted in between: the voter set comes from its state file."""
    cfg = tmp_path / "node.json"
    cfg.write_text(json.dumps(STALE_NODE_CONFIG))
    d = tmp_path / "s"
    # Plaintext: the stale writes are sent by hand, without a client (operator_nodes._put_nowait).
    c = LocalCluster(d, 5, extra=["--no-recovery", "--node-config", str(cfg)], insecure=True)
    holds: list[Path] = []
    try:
        stale, fresh = make_stale_longer_log(c, holds)
        assert c.stop() == 0, c.tail()
        c = LocalCluster(
            d,
            5,
            extra=["--node-config", str(cfg), "--unclean-after-seconds", "1"],
            base_port=c.base,
            insecure=True,
        )
        events = wait_until(
            "an unclean recovery",
            lambda: [e for e in read_events(d) if e["type"] == "unclean_recovery"],
            120, errors=ANY_ERROR,
        )
        assert len(events) == 1 and events[0]["replica_id"] == fresh, (events, stale, fresh)
        detail = events[0]["detail"]
        assert isinstance(detail, dict)
        cands = detail["candidates"]
        assert sorted(cands) == sorted([str(stale), str(fresh)])
        assert cands[str(stale)][1] > cands[str(fresh)][1]  # the longer log lost ...
        assert cands[str(stale)][0] < cands[str(fresh)][0]  # ... because its last epoch is older
        wait_until(
            "the committed write readable after the recovery",
            lambda: c.kk("kv", "get", "--bootstrap", c.bootstrap(), "fresh").stdout.strip() == "yes",
            120, errors=ANY_ERROR,
        )
        got = c.kk("kv", "get", "--bootstrap", c.bootstrap(), "stale-0")
        assert got.returncode != 0 and "NOT_FOUND" in got.stderr, got
    finally:
        for h in holds:
            h.unlink(missing_ok=True)
        assert c.stop() == 0, c.tail()


@needs_engine
@pytest.mark.slow
def test_local_mode_remove_then_add_order(tmp_path: Path) -> None:
    """RemoveThenAdd either completes (remove strictly before add) or, if the engine refuses to
    remove an id's only UUID (ours asks for a reassignment instead), fails once with the engine's
    reason and leaves the voter set as it was: never a retry storm, never a lost voter."""
    d = tmp_path / "rta"
    c = LocalCluster(
        d, 3, extra=["--order", "RemoveThenAdd", "--stabilization-seconds", "1", "--live-window-seconds", "3"]
    )
    try:
        first = wait_until(
            "a leader and 3 known voters",
            lambda: (x := c.describe()) and x["leader_id"] > 0 and all(v["uuid"] for v in x["voters"]) and x,
            90, errors=ANY_ERROR,
        )
        victim = next(v["id"] for v in first["voters"] if v["id"] != first["leader_id"])
        old = next(v["uuid"] for v in first["voters"] if v["id"] == victim)
        out = c.kk("cluster", "replace-disk", "--dir", str(d), "--node", str(victim))
        assert out.returncode == 0, out.stderr
        new = out.stdout.strip().splitlines()[-1]
        done = wait_until(
            "recovery finished",
            lambda: [
                r
                for r in c.status()["recoveries"]
                if r["phase"] in ("Completed", "Failed") and r["replicaId"] == victim
            ],
            120, errors=ANY_ERROR,
        )[0]
        seq = [e["type"] for e in read_events(d) if e["new_uuid"] == new]
        keys = {(v["id"], v["uuid"]) for v in (c.describe() or {"voters": []})["voters"]}
        if done["phase"] == "Completed":
            assert seq.index("remove_voter_committed") < seq.index("add_voter_started")
            assert (victim, new) in keys and (victim, old) not in keys
        else:
            assert "RemoveVoter" in done["reason"] and seq.count("remove_voter_started") == 1
            assert seq[-1] == "recovery_failed" and (victim, old) in keys and len(keys) == 3
    finally:
        assert c.stop() == 0, c.tail()


@needs_engine
@pytest.mark.slow
def test_two_disks_replaced_in_a_five_node_cluster_recover_one_after_the_other(tmp_path: Path) -> None:
    d = tmp_path / "five"
    c = LocalCluster(d, 5, extra=["--stabilization-seconds", "1", "--live-window-seconds", "3"])
    try:
        first = wait_until(
            "a leader and 5 known voters",
            lambda: (
                (x := c.describe())
                and x["leader_id"] > 0
                and len(x["voters"]) == 5
                and all(v["uuid"] for v in x["voters"])
                and x
            ),
            120, errors=ANY_ERROR,
        )
        assert c.kk("kv", "put", "--bootstrap", c.bootstrap(), "k1", "v1").returncode == 0
        victims = [v["id"] for v in first["voters"] if v["id"] != first["leader_id"]][:2]
        news = {}
        for node in victims:  # the second while the first recovery is still running
            out = c.kk("cluster", "replace-disk", "--dir", str(d), "--node", str(node))
            assert out.returncode == 0, out.stderr
            news[node] = out.stdout.strip().splitlines()[-1]

        def both_done() -> dict[str, object] | None:
            x = c.describe()
            if not x or x["pending_voter_change"] is not None:
                return None
            keys = {(v["id"], v["uuid"]) for v in x["voters"]}
            return x if all((n, u) in keys for n, u in news.items()) and len(keys) == 5 else None

        wait_until("both replaced disks are voters again", both_done, 180, errors=ANY_ERROR)
        events = read_events(d)
        changes = [
            (e["type"], e["replica_id"]) for e in events if e["type"].endswith(("_started", "_committed"))
        ]
        # One change at a time: every start is followed by its own commit before the next start.
        for (a, ida), (b, idb) in zip(changes[::2], changes[1::2], strict=True):
            assert a.endswith("_started") and b == a.replace("_started", "_committed") and ida == idb
        got = c.kk("kv", "get", "--bootstrap", c.bootstrap(), "k1")
        assert got.returncode == 0 and got.stdout.strip() == "v1"
    finally:
        assert c.stop() == 0, c.tail()
