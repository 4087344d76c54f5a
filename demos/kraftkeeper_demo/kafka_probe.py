"""Real Kafka controllers watched and driven from outside, what both the Kafka demo
(:mod:`kraftkeeper_demo.demo_kafka`) and ``bench/kafka_recovery.py`` run: DescribeQuorum over one
kept connection (:class:`Probe`), the healed-quorum check (:func:`whole`: every controller a
caught-up voter with its current directory id), the ``kraftkeeper operator watch`` process
(:func:`start_watcher`, :func:`stop_process`), one disk replacement (:func:`replace_disk`) and
the recorder of Kafka's auto-join as recovery events (:class:`AutoJoinRecorder`).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kraftkeeper_operator.kafka.backend import KafkaQuorum
from kraftkeeper_operator.kafka.cluster import KafkaControllers
from kraftkeeper_operator.kafka.wire import ClientSettings
from kraftkeeper_reports import events as ev
from kraftkeeper_reports.events import EventLogWriter, RecoveryEvent

from kraftkeeper_demo.demo_common import DemoError, say
from quorum.kafka.mapping import base64_to_uuid
from quorum.polling import wait_until
from quorum.timefmt import now_ms

T = TypeVar("T")


MAX_LAG = 100  # records behind the leader still counted as caught up (the watcher's default)


POLL_S = 0.05  # DescribeQuorum from outside every 50 ms


def uuid_of(directory_id: str | None) -> str:
    """A Kafka directory id (base64url) as the canonical UUID our events and describe use."""
    return str(base64_to_uuid(directory_id or ""))


class Probe:
    """DescribeQuorum from outside over one kept connection, for synchronous scripts."""

    def __init__(self, k: KafkaControllers, settings: ClientSettings | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.q = KafkaQuorum(k.bootstrap, settings, timeout=3.0)
        self.last_error = ""

    def describe(self) -> dict[str, Any] | None:
        try:
            return self.loop.run_until_complete(self.q.describe())
        except Exception as e:  # any failure is "no answer now"; callers poll again
            self.last_error = f"{type(e).__name__}: {e}"
            return None

    def close(self) -> None:
        self.loop.run_until_complete(self.q.close())
        self.loop.close()


def wanted(k: KafkaControllers) -> set[tuple[int, str]]:
    """The voter set a healed quorum has: every controller with its current directory id."""
    return {(i, uuid_of(c.directory_id())) for i, c in k.controllers.items()}


def whole(k: KafkaControllers, probe: Probe, d: dict[str, Any] | None = None) -> bool:
    """Every controller a voter with its current directory id, and every voter caught up."""
    d = d if d is not None else probe.describe()
    if d is None:
        return False
    return {(v["id"], v["uuid"]) for v in d["voters"]} == wanted(k) and all(
        0 <= v["lag"] <= MAX_LAG for v in d["voters"]
    )



def start_watcher(
    k: KafkaControllers,
    events: Path,
    log: Path,
    *,
    port: int,
    stabilization: float,
    interval: float = 0.2,
    extra: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """``kraftkeeper operator watch`` against ``k``, returned once its first pass saw a healthy
    quorum (``/status`` phase Running on 127.0.0.1:``port``)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "quorum.cli",
                "operator",
                "watch",
                "--kafka-bootstrap-controllers",
                k.bootstrap,
                "--events",
                str(events),
                "--stabilization-seconds",
                f"{stabilization:g}",
                "--interval",
                f"{interval:g}",
                "--metrics-port",
                str(port),
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def running() -> bool:
        if proc.poll() is not None:
            raise DemoError(f"UNAVAILABLE: operator watch exited with {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as r:
                return bool(json.loads(r.read()).get("phase") == "Running")
        except OSError:
            return False

    try:
        wait_until("the watcher's first healthy pass", running, 90, 0.2)
    except BaseException:
        stop_process(proc)
        raise
    return proc


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# The steps of an auto-join recovery visible from outside, in the order Kafka takes them (it
# removes the old directory id first: it refuses a second directory id for a voter id).
SEEN_ORDER = (
    ev.DISK_REPLACEMENT_DETECTED,
    ev.REPLICA_CAUGHT_UP,
    ev.REMOVE_VOTER_COMMITTED,
    ev.ADD_VOTER_COMMITTED,
)


class AutoJoinRecorder:
    """One recovery by Kafka's auto-join, as recovery events recorded from outside: each step is
    logged when DescribeQuorum first shows it (Kafka writes no such log). Detection: the new
    directory id is listed (observer or voter); caught up: it is within ``MAX_LAG`` of the leader;
    RemoveVoter / AddVoter committed: the old id left / the new id joined the voter set the leader
    reports; completed: the whole voter set, every voter caught up (as the demo's wall clock).
    Only committed steps are visible from outside, so no ``*_started`` events are written."""

    def __init__(self, writer: EventLogWriter, rid: str, replica: int, old: str, new: str) -> None:
        self.writer, self.rid, self.replica, self.old, self.new = writer, rid, replica, old, new
        self.logged: set[str] = set()

    def observe(self, d: dict[str, Any], want: set[tuple[int, str]]) -> bool:
        """Log the steps ``d`` shows for the first time; True once the recovery is complete."""
        voters = {(v["id"], v["uuid"]): v for v in d["voters"]}
        listed = {**{(o["id"], o["uuid"]): o for o in d["observers"]}, **voters}
        me = listed.get((self.replica, self.new))
        steps: list[str] = []
        if me is not None:
            steps.append(ev.DISK_REPLACEMENT_DETECTED)
            if 0 <= me["lag"] <= MAX_LAG:
                steps.append(ev.REPLICA_CAUGHT_UP)
        if ev.DISK_REPLACEMENT_DETECTED in self.logged or steps:
            if (self.replica, self.old) not in voters:
                steps.append(ev.REMOVE_VOTER_COMMITTED)
            if (self.replica, self.new) in voters:
                steps.append(ev.ADD_VOTER_COMMITTED)
        done = set(voters) == want and all(0 <= v["lag"] <= MAX_LAG for v in voters.values())
        if done:  # anything not seen on its own happened within the last poll: logged now
            steps = [*SEEN_ORDER, ev.RECOVERY_COMPLETED]
        now = now_ms()
        for s in steps:
            if s in self.logged:
                continue
            self.logged.add(s)
            detail: dict[str, Any] = {}
            if s == ev.DISK_REPLACEMENT_DETECTED:
                detail = {
                    "engine": "kafka",
                    "order": "auto-join",
                    "recorded_by": "kraftkeeper demo: DescribeQuorum every 50 ms",
                }
            self.writer.emit(
                RecoveryEvent(
                    s,
                    self.rid,
                    self.replica,
                    self.old,
                    self.new,
                    d["leader_id"] if d["leader_id"] >= 0 else None,
                    d["leader_epoch"] if d["leader_id"] >= 0 else None,
                    detail,
                ),
                now,
            )
        return done


def replace_disk(
    k: KafkaControllers,
    probe: Probe,
    n: int,
    what: str,
    note: Callable[[str], None] = say,
    victim: int | None = None,
) -> tuple[int, str, str]:
    """Replacement ``n``: kill controller ``victim`` (default: a follower, they take turns), wipe
    and re-format its disk, start it; returns (controller id, old UUID, new UUID). ``note`` tells
    what is replaced, and whether it was the leader."""
    d = wait_until("a leader", probe.describe, 60, POLL_S)
    if victim is None:
        followers = sorted(i for i in k.controllers if i != d["leader_id"])
        victim = followers[n % len(followers)]
    old = uuid_of(k.controllers[victim].directory_id())
    role = "the leader" if victim == d["leader_id"] else f"a follower; the leader is {d['leader_id']}"
    note(
        f"{what}: replacing the disk of controller {victim} ({role}, epoch {d['leader_epoch']}), "
        f"old directory id {old[:8]}"
    )
    k.stop(victim, kill=True)
    new = uuid_of(k.wipe_and_format(victim))
    k.start(victim)
    return victim, old, new
