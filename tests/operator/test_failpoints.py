"""Failpoints (failpoints.py) and restart safety around them: the operator stopped right after
AddVoter committed (its event logged, its progress not yet persisted) resumes with RemoveVoter and
logs no step twice; in-process with the event log on disk, and with real processes in local mode
(the operator process exits at the failpoint, is started again, and the recovery Succeeds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator import failpoints
from kraftkeeper_operator.controller import RecoveryController
from kraftkeeper_operator.core.recovery import Phase, Recovery, RecoveryPolicy
from kraftkeeper_operator.local.operator import local_main
from kraftkeeper_operator.telemetry import EventLogSink, FanOut, MemorySink
from kraftkeeper_operator.testing.memory import InMemoryQuorum

from testkit.polling import ANY_ERROR, wait_until
from tests.operator.helpers import FULL, Clock, OperatorCrash
from tests.operator.operator_nodes import LocalCluster, engine_missing

POLICY = RecoveryPolicy(stabilization_seconds=2, max_lag=10, timeout_seconds=300, live_window_seconds=3)


def read_events(d: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(d.rglob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.startswith("{")]
    return out


# ---------------------------------------------------------------------------------------------
# Parsing: bad input is named


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("after-add-voter-comitted", "unknown failpoint 'after-add-voter-comitted'"),
        ("after-add-voter-committed=crash", "unknown action 'crash'"),
        ("before-event:", "needs an event type"),
    ],
)
def test_a_bad_failpoint_is_refused_naming_the_variable(value: str, named: str) -> None:
    with pytest.raises(failpoints.FailpointError) as e:
        failpoints.check({failpoints.ENV: value})
    assert failpoints.ENV in str(e.value) and named in str(e.value)


def test_failpoint_values_parse() -> None:
    got = failpoints.armed(
        {
            failpoints.ENV: "after-add-voter-committed, after-remove-voter-committed=hang",
            failpoints.WATCH_ENV: "crash-before:add_voter_started",
        }
    )
    assert got == {
        "after-add-voter-committed": "exit",
        "after-remove-voter-committed": "hang",
        "before-event:add_voter_started": "exit",
    }
    assert failpoints.armed({}) == {}
    with pytest.raises(failpoints.FailpointError, match=failpoints.WATCH_ENV):
        failpoints.armed({failpoints.WATCH_ENV: "crash-after:x"})


def test_operator_local_refuses_a_bad_failpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(failpoints.ENV, "after-everything")
    assert local_main(["--dir", str(tmp_path / "c"), "--insecure"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("INVALID_REQUEST:") and failpoints.ENV in err and "after-everything" in err
    assert not (tmp_path / "c" / "node-1").exists()  # nothing started


def _hit_in_subprocess(env: dict[str, str], point: str) -> subprocess.CompletedProcess[str]:
    code = f"from kraftkeeper_operator import failpoints; failpoints.hit({point!r}); print('passed')"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow  # starts processes
def test_exit_action_exits_at_the_point_and_once_file_lets_the_next_run_through(tmp_path: Path) -> None:
    env = {failpoints.ENV: "after-add-voter-committed=exit"}
    other = _hit_in_subprocess(env, "after-remove-voter-committed")
    assert other.returncode == 0 and "passed" in other.stdout  # not armed: runs through
    first = _hit_in_subprocess(env, "after-add-voter-committed")
    assert first.returncode == failpoints.EXIT_CODE and "passed" not in first.stdout
    assert "after-add-voter-committed=exit reached" in first.stderr
    marker = tmp_path / "fired"
    env[failpoints.ONCE_ENV] = str(marker)
    again = _hit_in_subprocess(env, "after-add-voter-committed")
    assert again.returncode == failpoints.EXIT_CODE and marker.exists()
    through = _hit_in_subprocess(env, "after-add-voter-committed")
    assert through.returncode == 0 and "passed" in through.stdout


@pytest.mark.slow  # starts processes
def test_hang_action_blocks_until_killed() -> None:
    code = (
        "import sys; from kraftkeeper_operator import failpoints; "
        "failpoints.hit('after-add-voter-committed'); print('passed')"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, failpoints.ENV: "after-add-voter-committed=hang"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stderr is not None
        line = p.stderr.readline()  # the process says where it hangs, then does nothing
        assert "after-add-voter-committed=hang reached: hanging" in line
        assert p.poll() is None
    finally:
        p.kill()
        out, _ = p.communicate(timeout=30)
    assert "passed" not in out and p.returncode != 0


# ---------------------------------------------------------------------------------------------
# Restart between the committed event and the progress persist (in-process, log on disk)


async def test_crash_after_the_committed_event_before_persist_logs_each_step_once(tmp_path: Path) -> None:
    clock = Clock()
    q = InMemoryQuorum(3, clock.ms)
    saved: list[dict[str, Any]] = []
    crash = {"armed": True}

    def controller(records: list[Recovery], mem: MemorySink) -> RecoveryController:
        sink = FanOut(EventLogSink(tmp_path / "events", "t"), mem)  # as the kopf operator's

        async def persist(recs: list[dict[str, Any]]) -> None:
            # The process dies when it is about to persist the commit it has just logged.
            if crash["armed"] and any(r["addCommittedMs"] is not None for r in recs):
                crash["armed"] = False
                raise OperatorCrash()
            saved[:] = recs

        return RecoveryController(
            q, POLICY, cluster="t", sink=sink, clock=clock, records=records, persist=persist
        )

    first = MemorySink()
    ctl = controller([], first)
    old = q.current(3).uuid
    new = q.replace_disk(3, lag=0)
    with pytest.raises(OperatorCrash):
        for _ in range(100):
            clock.t += 1
            q.tick()
            await ctl.reconcile()
    assert first.types()[-1] == "add_voter_committed"
    assert (3, old) in q.voters and (3, new) in q.voters
    assert all(r["addCommittedMs"] is None for r in saved)  # the persist never happened

    second = MemorySink()
    ctl = controller([Recovery.from_dict(d) for d in saved], second)  # the restarted operator
    for _ in range(100):
        clock.t += 1
        q.tick()
        st = await ctl.reconcile()
        if any(r["phase"] == "Completed" for r in st.recoveries):
            break
    assert (3, new) in q.voters and (3, old) not in q.voters
    assert "add_voter_committed" not in second.types()  # already in the log: not repeated
    assert second.types() == ["remove_voter_started", "remove_voter_committed", "recovery_completed"]
    logged = [e["type"] for e in read_events(tmp_path / "events")]
    assert logged == FULL, logged  # each step once, in order


async def test_an_unreadable_event_log_line_does_not_stop_the_resume(tmp_path: Path) -> None:
    clock = Clock()
    q = InMemoryQuorum(3, clock.ms)
    sink = EventLogSink(tmp_path / "events", "t")
    old = q.current(3).uuid
    new = q.replace_disk(3, lag=0)
    # A recovery a previous run left active; today's log holds a damaged line.
    rec = Recovery("r-1", 3, old, new, Phase.CAUGHT_UP, clock.ms() - 1000)
    day = sink.writer.path_for(datetime.now(UTC).isoformat())
    day.parent.mkdir(parents=True, exist_ok=True)
    day.write_text("not json\n")
    ctl = RecoveryController(q, POLICY, cluster="t", sink=sink, clock=clock, records=[rec])
    for _ in range(50):
        clock.t += 1
        q.tick()
        st = await ctl.reconcile()
        if any(r["phase"] == "Completed" for r in st.recoveries):
            break
    types = [e["type"] for e in read_events(tmp_path / "events")]
    assert Counter(types)["add_voter_committed"] == 1 and types[-1] == "recovery_completed"


# ---------------------------------------------------------------------------------------------
# Real processes: ``operator local`` exits at the failpoint, is restarted, and resumes

needs_engine = pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))


@needs_engine
@pytest.mark.slow
def test_local_operator_exits_after_add_voter_committed_and_resumes_with_remove_voter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "fp"
    extra = ["--stabilization-seconds", "1", "--live-window-seconds", "3"]
    monkeypatch.setenv(failpoints.ENV, failpoints.AFTER_ADD_COMMITTED)
    c = LocalCluster(d, 3, extra=extra, insecure=True)
    try:
        first = wait_until("a leader and 3 known voters", c.describe_all_known, 120, errors=ANY_ERROR)
        victim = next(v["id"] for v in first["voters"] if v["id"] != first["leader_id"])
        old = next(v["uuid"] for v in first["voters"] if v["id"] == victim)
        out = c.kk("cluster", "replace-disk", "--dir", str(d), "--node", str(victim))
        assert out.returncode == 0, out.stderr
        new = out.stdout.strip().splitlines()[-1]
        assert c.proc.wait(timeout=180) == failpoints.EXIT_CODE, c.tail()
    finally:
        c.stop()
    assert "after-add-voter-committed=exit reached" in c.tail()
    types = [e["type"] for e in read_events(d / "events") if e["new_uuid"] == new]
    assert types[-1] == "add_voter_committed" and "remove_voter_started" not in types
    state = json.loads((d / "operator-state.json").read_text())
    rec = next(r for r in state["recoveries"] if r["newUuid"] == new)
    assert rec["addCommittedMs"] is None  # died between the logged commit and its persist

    monkeypatch.delenv(failpoints.ENV)
    c = LocalCluster(d, 3, extra=extra, base_port=c.base, insecure=True)  # the restarted operator
    try:
        done = wait_until(
            "the recovery completed after the restart",
            lambda: [
                r for r in c.status()["recoveries"] if r["newUuid"] == new and r["phase"] == "Completed"
            ],
            180,
            errors=ANY_ERROR,
        )[0]
        assert done["oldUuid"] == old
        keys = {(v["id"], v["uuid"]) for v in (c.describe() or {"voters": []})["voters"]}
        assert (victim, new) in keys and (victim, old) not in keys and len(keys) == 3
    finally:
        assert c.stop() == 0, c.tail()
    types = [e["type"] for e in read_events(d / "events") if e["new_uuid"] == new]
    assert types == FULL, types  # resumed with RemoveVoter; no step, committed ones included, twice
