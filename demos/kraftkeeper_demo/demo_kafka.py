"""``kraftkeeper demo --engine kafka``: our recovery controller next to Kafka's own auto-join, on
three real Apache Kafka 4.x controllers.

1. Fetch the Kafka jars if the cache lacks them (``scripts/kafka.sh install``), make a CA, a
   certificate for 127.0.0.1 and a random SASL PLAIN password, and start three controllers
   (``KafkaControllers``: a KIP-853 dynamic quorum) with SASL_SSL on their controller listener.
2. ``kraftkeeper operator watch`` heals K disk replacements one after another: each kills a
   controller, wipes and re-formats its disk (``--no-initial-controllers``: a new directory id)
   and restarts it. The controllers take turns (:func:`next_victim`): the first replacement is
   the leader's (the case KIP-853 users fear most: the quorum elects a new leader, then heals),
   then each other controller, so K = 3 (the default) replaces every disk once. The watcher's
   events go to ``DIR/events/watch``.
3. The watcher stops; the same K replacements are healed by Kafka's auto-join
   (``controller.quorum.auto.join.enable=true`` on the restarted controller, KIP-853). Kafka logs
   no recovery events, so :class:`AutoJoinRecorder` records them from outside into
   ``DIR/events/auto-join`` as DescribeQuorum shows each step (polled every 50 ms).
4. The Spark report over both; its "Engines and orders compared" section puts ``kafka ·
   RemoveThenAdd`` (the watcher) next to ``kafka · auto-join``.

After each recovery the console prints the report's intervals for it, in the voter-change order
it recorded and under the report's titles (``intervals``, ``demo_common.print_intervals``), and
the demo's own wall clock from the controller's restart to a whole, caught-up voter set, measured
the same way for both healers. The controllers are watched and driven from outside with
:mod:`kraftkeeper_demo.kafka_probe`, which ``bench/kafka_recovery.py`` also runs.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kraftkeeper_operator.kafka.cluster import KafkaControllers, KafkaSecurity, kafka_libs
from kraftkeeper_operator.kafka.wire import ClientSettings
from kraftkeeper_reports import events as ev
from kraftkeeper_reports.events import EventLogWriter
from kraftkeeper_reports.intervals import fmt_ms
from kraftkeeper_reports.job import run_report

from kraftkeeper_demo.demo_common import DemoError, free_base_port, print_intervals, read_events, say
from kraftkeeper_demo.kafka_probe import (
    POLL_S,
    AutoJoinRecorder,
    Probe,
    replace_disk,
    start_watcher,
    stop_process,
    wanted,
    whole,
)
from quorum.polling import wait_until
from quorum.security.pki import init_ca, issue_node, write_private

CLUSTER = "kafka-demo"
KAFKA_SH = Path(__file__).resolve().parents[2] / "scripts" / "kafka.sh"


def ensure_jars() -> Path:
    """The Kafka server jars, fetched with scripts/kafka.sh when the cache lacks them."""
    if shutil.which("java") is None:
        raise DemoError("UNAVAILABLE: --engine kafka needs Java (scripts/install-system.sh installs Java 17)")
    libs = kafka_libs()
    if libs is not None:
        return libs
    if not KAFKA_SH.exists():
        raise DemoError(f"UNAVAILABLE: no Kafka jars in the cache and no {KAFKA_SH} to fetch them")
    say("fetching the Apache Kafka 4.4.0 jars once (scripts/kafka.sh install, Maven; about 90 MB)")
    out = subprocess.run([str(KAFKA_SH), "install"], stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    libs = kafka_libs()
    if out.returncode != 0 or libs is None:
        raise DemoError(f"UNAVAILABLE: scripts/kafka.sh install failed ({out.returncode}); see above")
    return libs


def make_security(d: Path) -> tuple[KafkaSecurity, Path]:
    """A CA and a 127.0.0.1 certificate (our pki), a PEM keystore for Kafka, a random SASL PLAIN
    password; returns the settings and the client properties file (0600) the watcher reads."""
    ca = init_ca(d / "tls", CLUSTER)
    cert, key = issue_node(ca, 1, ["127.0.0.1", "localhost"])
    keystore = d / "tls" / "kafka-keystore.pem"
    write_private(keystore, key.read_bytes() + cert.read_bytes() + ca.cert_file.read_bytes())
    sec = KafkaSecurity(ca.cert_file, keystore, "kraftkeeper-demo", secrets.token_urlsafe(24))
    props = d / "client.properties"
    write_private(props, sec.client_properties().encode())
    return sec, props


def next_victim(leader: int, ids: list[int], replaced: list[int]) -> int:
    """Whose disk the demo replaces next: the leader first, then each controller not yet replaced
    in this turn (lowest id first), so every len(ids) replacements replace every disk once, the
    leader's included. ``replaced``: the controllers replaced so far by this healer, in order."""
    done = set(replaced[len(replaced) - len(replaced) % len(ids):])
    if not done and leader in ids:
        return leader
    return min(i for i in ids if i not in done)


def _voters_line(probe: Probe) -> str:
    d = probe.describe()
    return ", ".join(f"{v['id']}:{v['uuid'][:8]}" for v in d["voters"]) if d else "(no answer)"


def _heal(
    probe: Probe, victim: int, new: str, done: Callable[[dict[str, Any]], bool], what: str
) -> tuple[float, float]:
    """Poll until ``done`` holds for a DescribeQuorum answer; returns the seconds from now (just
    after the restart) until the new directory id is first listed, and until ``done``."""
    t0 = time.monotonic()
    listed: float | None = None

    def step() -> bool:
        nonlocal listed
        d = probe.describe()
        if d is None:
            return False
        if listed is None and any(
            (x["id"], x["uuid"]) == (victim, new) for x in d["voters"] + d["observers"]
        ):
            listed = time.monotonic() - t0
        return done(d)

    wait_until(what, step, 300, POLL_S)
    total = time.monotonic() - t0
    return (listed if listed is not None else total), total


def _pick(k: KafkaControllers, probe: Probe, replaced: list[int]) -> int:
    d = wait_until("a leader", probe.describe, 60, POLL_S)
    victim = next_victim(d["leader_id"], sorted(k.controllers), replaced)
    replaced.append(victim)
    return victim


def _watch_round(
    k: KafkaControllers, probe: Probe, events: Path, n: int, total: int, replaced: list[int]
) -> None:
    victim, _old, new = replace_disk(
        k, probe, n, f"operator watch recovery {n + 1}/{total}", victim=_pick(k, probe, replaced)
    )
    say(f"  controller {victim} restarted empty with directory id {new[:8]}; the watcher takes over")
    clock = _heal(
        probe, victim, new, lambda d: whole(k, probe, d), f"controller {victim} healed by the watcher"
    )

    def logged() -> list[dict[str, Any]] | None:
        evs = [e for e in read_events(events) if e.get("new_uuid") == new]
        return evs if any(e.get("type") == ev.RECOVERY_COMPLETED for e in evs) else None

    evs = wait_until("the watcher's event log to record the recovery", logged, 60, 0.1)
    _report(probe, evs, clock)


def _auto_join_round(
    k: KafkaControllers, probe: Probe, writer: EventLogWriter, n: int, total: int, replaced: list[int]
) -> None:
    k.auto_join = True  # only the restarted controller's setting matters
    try:
        victim, old, new = replace_disk(
            k, probe, n, f"auto-join recovery {n + 1}/{total}", victim=_pick(k, probe, replaced)
        )
    finally:
        k.auto_join = False
    say(f"  controller {victim} restarted empty with directory id {new[:8]}; Kafka's auto-join takes over")
    rec = AutoJoinRecorder(writer, f"auto-join-{n + 1}-{new[:8]}", victim, old, new)
    want = wanted(k)
    clock = _heal(
        probe, victim, new, lambda d: rec.observe(d, want), f"controller {victim} healed by auto-join"
    )
    evs = [e for e in read_events(writer.root) if e.get("new_uuid") == new]
    _report(probe, evs, clock, "Kafka's auto-join (steps recorded from outside by DescribeQuorum)")


def _report(
    probe: Probe, evs: list[dict[str, Any]], clock: tuple[float, float], healer: str = "operator watch"
) -> None:
    say(f"  voters now {_voters_line(probe)}")
    print_intervals(evs, healer)
    listed, whole_s = clock
    say(
        "  (demo wall clock from the controller's restart: listed in DescribeQuorum after "
        f"{fmt_ms(listed * 1000)} (JVM start), whole caught-up voter set after {fmt_ms(whole_s * 1000)}; "
        "measured alike for both healers, DescribeQuorum every 50 ms)"
    )


def _run_quorum(d: Path, recoveries: int, stabilization: float, base: int) -> list[str]:
    libs = ensure_jars()
    sec, props = make_security(d)
    k = KafkaControllers(d / "kafka", libs, security=sec)
    for i, c in k.controllers.items():
        c.port = base + i
    watch_events, aj_events = d / "events" / "watch", d / "events" / "auto-join"
    aj_events.mkdir(parents=True, exist_ok=True)
    say(f"starting 3 Kafka controllers (SASL_SSL) in {d / 'kafka'} on ports {base + 1}-{base + 3}")
    probe: Probe | None = None
    try:
        k.format_all()
        k.start_all()
        probe = Probe(k, ClientSettings.from_properties(props))
        p = probe
        try:
            wait_until("three caught-up voters", lambda: whole(k, p), 180, POLL_S)
        except TimeoutError as e:
            raise DemoError(f"REQUEST_TIMED_OUT: {e} (last: {p.last_error})") from None
        d0 = wait_until("a leader", p.describe, 10, POLL_S)
        say(f"leader is controller {d0['leader_id']} at epoch {d0['leader_epoch']}; voters {_voters_line(p)}")
        say(f"starting `kraftkeeper operator watch` (stabilisation {stabilization:g} s, order RemoveThenAdd)")
        watcher = start_watcher(
            k,
            watch_events,
            d / "watch.log",
            port=base + 4,
            stabilization=stabilization,
            # Passes as often as the auto-join recorder polls, so both detect alike.
            interval=POLL_S,
            extra=("--kafka-client-config", str(props), "--name", CLUSTER),
        )
        try:
            replaced: list[int] = []
            for n in range(recoveries):
                _watch_round(k, p, watch_events, n, recoveries, replaced)
        finally:
            stop_process(watcher)
        say("watcher stopped; the same replacements now with Kafka's own auto-join (KIP-853)")
        writer = EventLogWriter(aj_events, CLUSTER)
        replaced = []
        for n in range(recoveries):
            _auto_join_round(k, p, writer, n, recoveries, replaced)
    except TimeoutError as e:
        raise DemoError(f"REQUEST_TIMED_OUT: {e}") from None
    except RuntimeError as e:  # a controller that would not format or start
        raise DemoError(f"UNAVAILABLE: {e}") from None
    finally:
        if probe is not None:
            probe.close()
        k.stop_all(kill=True)
        say("controllers stopped")
    return [str(watch_events), str(aj_events)]


def run(d: Path, recoveries: int, stabilization: float, base_port: int, master: str | None) -> int:
    """The Kafka demo in the prepared directory ``d``; the process exit code."""
    os.chmod(d, 0o700)  # it holds the SASL password (client.properties, server.properties)
    try:
        base = base_port or free_base_port(4)
        events = _run_quorum(d, recoveries, stabilization, base)
    except DemoError as e:
        sys.stderr.write(f"{e}\n" if ":" in str(e).split(" ")[0] else f"UNAVAILABLE: {e}\n")
        say(f"see {d / 'watch.log'} and {d / 'kafka'}/node-*/out.log")
        return 1
    say("building the Spark report over both event logs (local Spark, first start takes a while)")
    report = run_report(events, str(d / "report"), master)
    say("done")
    print(report)
    return 0
