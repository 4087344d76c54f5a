"""Healing a replaced Kafka controller disk: ``kraftkeeper operator watch`` against Kafka's own
auto-join and against the manual ``kafka-metadata-quorum`` path, on identical replacements.

One quorum of three real Kafka 4.x controllers on loopback (jars from scripts/kafka.sh); the rounds
interleave the modes so load changes on the machine hit them alike. One replacement = SIGKILL a
follower controller, wipe its disk, format it with ``--no-initial-controllers`` (new directory id),
start it (with ``controller.quorum.auto.join.enable=true`` in the auto-join mode only; the watcher
runs only during its own modes). Measured: from that restart to the
moment DescribeQuorum shows the whole voter set again, with the new directory id and every voter
caught up (polled every 50 ms through the same protocol client the watcher uses).

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
[--workdir DIR] [--json FILE]``; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kraftkeeper_operator.kafka.backend import KafkaQuorum
from kraftkeeper_operator.kafka.cluster import (
    JVM_OPTS,
    KafkaControllers,
    free_port,
    kafka_libs,
    kafka_tools_libs,
)

MODES = ("watch-0", "watch-default", "auto-join", "manual")


def _describe(k: KafkaControllers) -> dict[str, Any] | None:
    async def go() -> dict[str, Any]:
        q = KafkaQuorum(k.bootstrap, timeout=3.0)
        try:
            return await q.describe()
        finally:
            await q.close()

    try:
        return asyncio.run(go())
    except Exception:
        return None


def _uuid(b64: str) -> str:
    return str(uuid.UUID(bytes=base64.urlsafe_b64decode(b64 + "==")))


def _whole(k: KafkaControllers) -> bool:
    d = _describe(k)
    if d is None:
        return False
    want = {(i, _uuid(c.directory_id() or "")) for i, c in k.controllers.items()}
    return {(v["id"], v["uuid"]) for v in d["voters"]} == want and all(v["lag"] <= 100 for v in d["voters"])


def _poll(cond: Callable[[], bool], within: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(interval)
    raise TimeoutError(f"{what} not reached within {within:g}s")


def _tool(k: KafkaControllers, *args: str) -> None:
    libs = kafka_tools_libs()
    assert libs is not None
    out = subprocess.run(
        [
            "java",
            *JVM_OPTS,
            "-cp",
            str(libs / "*"),
            "org.apache.kafka.tools.MetadataQuorumCommand",
            "--bootstrap-controller",
            k.bootstrap,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0:
        raise RuntimeError(f"kafka-metadata-quorum {' '.join(args)}: {out.stdout}{out.stderr}")


def _manual(k: KafkaControllers, victim: int, old_b64: str) -> None:
    new_b64 = k.controllers[victim].directory_id() or ""

    def observer() -> bool:
        d = _describe(k)
        return d is not None and any(
            o["id"] == victim and o["uuid"] == _uuid(new_b64) and o["lag"] <= 100 for o in d["observers"]
        )

    _poll(observer, 120, "the new controller caught up as an observer")
    cfg = k.controllers[victim].dir / "server.properties"
    _tool(k, "remove-controller", "--controller-id", str(victim), "--controller-directory-id", old_b64)
    _tool(k, "--command-config", str(cfg), "add-controller")


def _start_watcher(k: KafkaControllers, work: Path, mode: str, tag: str) -> subprocess.Popen[bytes]:
    port = free_port()
    stab = "0" if mode == "watch-0" else "10"
    with open(work / f"watch-{tag}.log", "wb") as log:
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
                str(work / f"events-{tag}"),
                "--stabilization-seconds",
                stab,
                "--interval",
                "0.2",
                "--metrics-port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def running() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as r:
                return bool(json.loads(r.read()).get("phase") == "Running")
        except OSError:
            return False

    _poll(running, 60, "the watcher's first healthy pass")
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def replace_once(k: KafkaControllers, work: Path, mode: str, tag: str, n: int) -> float:
    """One identical replacement healed by ``mode``; seconds from the restart to a whole voter set."""
    d = _describe(k)
    assert d is not None
    victims = [i for i in k.controllers if i != d["leader_id"]]
    victim = victims[n % len(victims)]
    old_b64 = k.controllers[victim].directory_id() or ""
    watcher = _start_watcher(k, work, mode, tag) if mode.startswith("watch") else None
    try:
        k.stop(victim, kill=True)
        k.wipe_and_format(victim)
        k.auto_join = mode == "auto-join"  # only the joining controller's setting matters
        t0 = time.monotonic()
        k.start(victim)
        if mode == "manual":
            _manual(k, victim, old_b64)
        _poll(lambda: _whole(k), 300, f"{mode}: whole voter set")
        return time.monotonic() - t0
    finally:
        k.auto_join = False
        if watcher is not None:
            _stop(watcher)


def run(modes: list[str], rounds: int, work: Path, libs: Path) -> dict[str, list[float]]:
    """One quorum; rounds interleave the modes (A B C D, A B C D, ...) so that a change in the
    machine's load during the run affects every mode alike."""
    k = KafkaControllers(work / "kafka", libs)
    times: dict[str, list[float]] = {m: [] for m in modes}
    try:
        k.format_all()
        k.start_all()
        _poll(lambda: _whole(k), 180, "three caught-up voters")
        for r in range(rounds):
            for n, m in enumerate(modes):
                t = replace_once(k, work, m, f"{m}-{r}", r * len(modes) + n)
                times[m].append(t)
                print(f"{m} round {r + 1}: {t:.2f} s", file=sys.stderr, flush=True)
                _poll(lambda: _whole(k), 120, "a settled quorum")
    finally:
        k.stop_all(kill=True)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kafka_recovery", description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {', '.join(MODES)}")
    ap.add_argument("--rounds", type=int, default=2, help="replacements per mode")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    a = ap.parse_args(argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or a.rounds < 1:
        sys.stderr.write(
            f"INVALID_REQUEST: --modes {bad} unknown (known: {', '.join(MODES)}) or --rounds < 1\n"
        )
        return 2
    libs = kafka_libs()
    if libs is None or kafka_tools_libs() is None:
        sys.stderr.write("UNAVAILABLE: Kafka jars missing: run scripts/kafka.sh install\n")
        return 1
    work = a.workdir or Path(tempfile.mkdtemp(prefix="kk-kafka-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        results = run(modes, a.rounds, work, libs)
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"\nReplaced Kafka controller restart -> whole voter set (s), {a.rounds} rounds, load {load:.1f}\n")
    print("| mode | median | min | max |")
    print("| --- | --- | --- | --- |")
    for m, ts in results.items():
        print(f"| {m} | {statistics.median(ts):.2f} | {min(ts):.2f} | {max(ts):.2f} |")
    if a.json is not None:
        a.json.write_text(json.dumps({"rounds": a.rounds, "seconds": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
