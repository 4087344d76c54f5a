"""Healing a replaced Kafka controller disk: ``kraftkeeper operator watch`` against Kafka's own
auto-join and against the manual ``kafka-metadata-quorum`` path, on identical replacements.

One quorum of three real Kafka 4.x controllers on loopback (jars from scripts/kafka.sh); the rounds
interleave the modes so load changes on the machine hit them alike. One replacement = SIGKILL a
controller (a follower, or the raft leader: each mode replaces both in every round, as the
tests demand of the watcher; the leader's replacement adds an election), wipe its disk, format
it with ``--no-initial-controllers`` (new directory id), start it (with
``controller.quorum.auto.join.enable=true`` in the auto-join mode only; the watcher runs only
during its own modes). Measured: from that restart to the moment DescribeQuorum shows the whole
voter set again, with the new directory id and every voter caught up (polled every 50 ms through
the same protocol client the watcher uses).

Modes:

* ``watch-0``: ``kraftkeeper operator watch --stabilization-seconds 0`` (RemoveThenAdd);
* ``watch-default``: the watcher with its default stabilisation (10 s: the replica must stay
  caught up that long before the voter set changes);
* ``auto-join``: ``controller.quorum.auto.join.enable=true`` (KIP-853), no watcher;
* ``manual``: a script that, as soon as the new controller is a caught-up observer, runs
  ``kafka-metadata-quorum remove-controller`` then ``add-controller`` (each a JVM start).

Safety is not traded here: the watcher checks a live majority before each step and, in
RemoveThenAdd, removes only a dead directory id; auto-join and the manual path do no such checks.

``python -m bench.kafka_recovery [--modes watch-0,watch-default,auto-join,manual] [--rounds 2]
[--roles follower,leader] [--workdir DIR] [--json FILE]``; prints a Markdown table, one row per
mode and replaced role. The replacement, the watcher and the
"whole voter set" check are ``kraftkeeper_demo.kafka_probe``'s, which ``kraftkeeper demo
--engine kafka`` runs too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kraftkeeper_demo.kafka_probe import (
    MAX_LAG,
    POLL_S,
    Probe,
    replace_disk,
    start_watcher,
    stop_process,
    whole,
)
from kraftkeeper_operator.kafka.cluster import (
    KafkaControllers,
    free_port,
    kafka_libs,
    kafka_tools_libs,
    metadata_quorum,
)

from quorum.kafka.mapping import uuid_to_base64
from testkit.polling import wait_until

MODES = ("watch-0", "watch-default", "auto-join", "manual")
ROLES = ("follower", "leader")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _tool(k: KafkaControllers, *args: str) -> None:
    out = metadata_quorum(k.bootstrap, *args, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"kafka-metadata-quorum {' '.join(args)}: {out.stdout}{out.stderr}")


def _manual(k: KafkaControllers, probe: Probe, victim: int, old: str, new: str) -> None:
    def observer() -> bool:
        d = probe.describe()
        return d is not None and any(
            o["id"] == victim and o["uuid"] == new and 0 <= o["lag"] <= MAX_LAG for o in d["observers"]
        )

    wait_until("the new controller caught up as an observer", observer, 120, POLL_S)
    cfg = k.controllers[victim].dir / "server.properties"
    old_id = uuid_to_base64(old)
    _tool(k, "remove-controller", "--controller-id", str(victim), f"--controller-directory-id={old_id}")
    _tool(k, "--command-config", str(cfg), "add-controller")


def replace_once(
    k: KafkaControllers, probe: Probe, work: Path, mode: str, tag: str, n: int, role: str = "follower"
) -> float:
    """One identical replacement of a controller in ``role`` (the followers take turns), healed by
    ``mode``; seconds from the restart to a whole voter set."""
    watcher = None
    if mode.startswith("watch"):
        watcher = start_watcher(
            k,
            work / f"events-{tag}",
            work / f"watch-{tag}.log",
            port=free_port(),
            stabilization=0.0 if mode == "watch-0" else 10.0,
        )
    try:
        k.auto_join = mode == "auto-join"  # only the joining controller's setting matters
        leader = wait_until("a leader", probe.describe, 60, POLL_S)["leader_id"] if role == "leader" else None
        victim, old, new = replace_disk(k, probe, n, mode, _stderr, victim=leader)
        t0 = time.monotonic()
        if mode == "manual":
            _manual(k, probe, victim, old, new)
        wait_until(f"{mode}: whole voter set", lambda: whole(k, probe), 300, POLL_S)
        return time.monotonic() - t0
    finally:
        k.auto_join = False
        if watcher is not None:
            stop_process(watcher)


def run(
    modes: list[str], rounds: int, work: Path, libs: Path, roles: tuple[str, ...] = ROLES
) -> dict[str, list[float]]:
    """One quorum; rounds interleave the modes and roles (A B C D for a follower, then for the
    leader, and again, ...) so that a change in the machine's load affects every row alike.
    Results are keyed ``"<mode> (<role>)"``."""
    k = KafkaControllers(work / "kafka", libs)
    times: dict[str, list[float]] = {f"{m} ({role})": [] for role in roles for m in modes}
    probe: Probe | None = None
    try:
        k.format_all()
        k.start_all()
        probe = Probe(k)
        p = probe
        wait_until("three caught-up voters", lambda: whole(k, p), 180, POLL_S)
        n = 0
        for r in range(rounds):
            for role in roles:
                for m in modes:
                    t = replace_once(k, p, work, m, f"{m}-{role}-{r}", n, role)
                    n += 1
                    times[f"{m} ({role})"].append(t)
                    _stderr(f"{m}, the {role} replaced, round {r + 1}: {t:.2f} s")
                    wait_until("a settled quorum", lambda: whole(k, p), 120, POLL_S)
    finally:
        if probe is not None:
            probe.close()
        k.stop_all(kill=True)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kafka_recovery", description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)}")
    ap.add_argument("--rounds", type=int, default=2, help="replacements per mode and role")
    ap.add_argument("--roles", default=",".join(ROLES), help="replace a follower, the leader, or both")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    a = ap.parse_args(argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    roles = tuple(r.strip() for r in a.roles.split(",") if r.strip())
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        sys.stderr.write(f"INVALID_REQUEST: --modes {bad} unknown (known: {', '.join(MODES)})\n")
        return 2
    if not roles or any(r not in ROLES for r in roles):
        sys.stderr.write(
            f"INVALID_REQUEST: --roles {a.roles!r}: a comma-separated subset of {', '.join(ROLES)}\n"
        )
        return 2
    if a.rounds < 1:
        sys.stderr.write(f"INVALID_REQUEST: --rounds {a.rounds}: must be at least 1\n")
        return 2
    libs = kafka_libs()
    if libs is None or kafka_tools_libs() is None:
        sys.stderr.write("UNAVAILABLE: Kafka jars missing: run scripts/kafka.sh install\n")
        return 1
    work = a.workdir or Path(tempfile.mkdtemp(prefix="kk-kafka-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        results = run(modes, a.rounds, work, libs, roles)
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"\nReplaced Kafka controller restart -> whole voter set (s), {a.rounds} rounds, load {load:.1f}\n")
    print("| mode (replaced) | median | min | max |")
    print("| --- | --- | --- | --- |")
    for m, ts in results.items():
        print(f"| {m} | {statistics.median(ts):.2f} | {min(ts):.2f} | {max(ts):.2f} |")
    if a.json is not None:
        doc = {"rounds": a.rounds, "roles": list(roles), "seconds": results}
        a.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
