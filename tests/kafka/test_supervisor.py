"""The Kafka controllers' supervisor (``KafkaControllers``, kafka/cluster.py): a controller that
exits on its own is started again after a back-off and its fatal line is kept; one stopped on
purpose never is. A small script stands in for the JVM here (process handling only, no Kafka);
the real case, a replaced leader halting on its stale epoch, is test_watch's second round."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
from kraftkeeper_operator.kafka.cluster import (
    RESTART_BACKOFF_FIRST,
    RESTART_BACKOFF_MAX,
    KafkaControllers,
    fatal_line,
)

from quorum.kafka.mapping import base64_to_uuid
from testkit.polling import wait_until
from tests.kafka.test_watch import describe, whole
from tests.kafka.watcher import NOT_YET, context_of

FATAL = (
    "[2026-11-27 13:40:00,123] ERROR Encountered fatal fault: Unexpected error in raft IO thread "
    "(org.apache.kafka.server.fault.ProcessTerminatingFaultHandler)"
)


def fake_java(tmp_path: Path, crashes: int) -> str:
    """An executable standing in for ``java``: its first ``crashes`` runs in a node's directory
    print Kafka's fatal line and exit 1; later runs stay up."""
    script = tmp_path / "java"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, signal, sys\n"
        "d = os.path.dirname(sys.argv[-1])\n"
        "n = os.path.join(d, 'runs')\n"
        "runs = int(open(n).read()) if os.path.exists(n) else 0\n"
        "open(n, 'w').write(str(runs + 1))\n"
        f"if runs < {crashes}:\n"
        f"    print({FATAL!r}, flush=True)\n"
        "    sys.exit(1)\n"
        "signal.pause()\n"  # runs until the supervisor stops it
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


@pytest.fixture
def fake(tmp_path: Path) -> KafkaControllers:
    return KafkaControllers(tmp_path / "k", tmp_path / "libs", n=1, java=fake_java(tmp_path, crashes=1))


def test_a_controller_that_exits_on_its_own_is_restarted(fake: KafkaControllers) -> None:
    k = fake
    try:
        k.start(1)
        c = k.controllers[1]
        wait_until("the crashed controller started again", lambda: c.starts == 2 and c.running(), 30,
                   context=k.status_lines)
        assert len(k.crashes) == 1
        crash = k.crashes[0]
        assert (crash.node_id, crash.returncode) == (1, 1)
        assert "Encountered fatal fault" in crash.fatal
        assert "exited 1: " in k.status_lines() and "running, started 2x" in k.status_lines()
    finally:
        k.stop_all(kill=True)
    assert not k.controllers[1].running()


def test_back_off_doubles_and_a_stopped_controller_stays_stopped(tmp_path: Path) -> None:
    k = KafkaControllers(tmp_path / "k", tmp_path / "libs", n=1, java=fake_java(tmp_path, crashes=99),
                         supervise=False)  # driven by hand below: no thread, explicit clock
    c = k.controllers[1]
    try:
        k.start(1)
        t = 1000.0
        delays = []
        for _ in range(5):
            proc = c.proc
            assert proc is not None
            proc.wait(timeout=30)
            k.supervise_once(now=t)  # the exit is seen: a restart is scheduled
            assert c.restart_at is not None
            delays.append(c.restart_at - t)
            k.supervise_once(now=c.restart_at - 0.01)
            assert c.proc is proc, "restarted before its back-off"
            t = c.restart_at
            k.supervise_once(now=t)
            assert c.proc is not proc
        assert delays == [RESTART_BACKOFF_FIRST * 2**i if RESTART_BACKOFF_FIRST * 2**i < RESTART_BACKOFF_MAX
                          else RESTART_BACKOFF_MAX for i in range(5)]
        assert len(k.crashes) == 5
        k.stop(1, kill=True)
        starts = c.starts
        k.supervise_once(now=t + 3600)
        assert c.starts == starts and not c.running()
    finally:
        k.stop_all(kill=True)


def test_fatal_line_prefers_the_fatal_fault(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    assert fatal_line(log) == ""  # missing file: nothing to say
    log.write_text("INFO starting\n[x] ERROR something else\n" + FATAL + "\nINFO shutting down\n")
    assert fatal_line(log) == FATAL
    cause = "java.lang.IllegalStateException: Received request or response with leader OptionalInt[1]"
    log.write_text(FATAL + "\n" + cause + "\n\tat org.apache.kafka.raft.KafkaRaftClient.maybeTransition\n")
    assert fatal_line(log) == f"{FATAL} {cause}"
    log.write_text("INFO a\n[x] ERROR first\n[y] ERROR last\nINFO b\n")
    assert fatal_line(log) == "[y] ERROR last"
    log.write_bytes(b"\xff\xfe not utf-8\n")
    assert fatal_line(log) == ""


@pytest.mark.slow
def test_a_replaced_leader_that_halts_is_restarted_and_healed(kafka_jars: Path, tmp_path: Path) -> None:
    """Real Kafka: the leader's disk is replaced while the survivors keep naming it leader (their
    fetch timeout made long, so the race CI lost now and then always goes this way). The new
    controller halts on the stale leadership; the supervisor restarts it until the survivors have
    elected a new leader, and it then fetches as an observer with its new directory id."""
    # 30 s: the replacement's format and start are two JVM starts, which took over 12 s on a
    # loaded 2-core machine, and the survivors must not elect a new leader before it is back.
    k = KafkaControllers(tmp_path / "kafka", kafka_jars, fetch_timeout_ms=30000)
    with k.running():
        d = wait_until("three caught-up voters", lambda: whole(k), 120, errors=NOT_YET, context=context_of(k))
        leader = d["leader_id"]
        new = str(base64_to_uuid(k.replace_disk(leader)))
        crash = wait_until(
            f"controller {leader} halting on its old leadership",
            lambda: next((x for x in k.crashes if x.node_id == leader), None),
            120,
            errors=NOT_YET,
            context=context_of(k),
        )
        assert "inconsistent with current leader" in crash.fatal, crash
        after = wait_until(
            f"controller {leader} fetching as an observer with {new}",
            lambda: (x := describe(k))["leader_id"] != leader
            and any((o["id"], o["uuid"]) == (leader, new) for o in x["observers"]) and x,
            180,
            errors=NOT_YET,
            context=context_of(k),
        )
        assert after["leader_epoch"] > d["leader_epoch"]
        assert k.controllers[leader].running() and k.controllers[leader].starts >= 2
