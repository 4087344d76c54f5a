"""``kraftkeeper operator watch``: the recovery controller against an existing Apache Kafka 4.x
controller quorum (KIP-853 dynamic quorum), until SIGTERM / SIGINT.

It starts and stops no process. Each pass describes the quorum through Kafka's admin protocol
(:class:`kafka.backend.KafkaQuorum`) and lets the same :class:`RecoveryController` as local and
Kubernetes mode decide: a controller that came back with a new directory id (an observer carrying a
voter's id) is swapped into the voter set one change at a time, only with a live majority, after
it stayed caught up for the stabilisation time. Steps go to the same event log (``--events DIR``,
``cluster`` = ``--name`` or the Kafka cluster id; UUIDs in canonical form).

Order: RemoveThenAdd by default. Kafka keeps one directory id per voter id and answers
AddRaftVoter for a second one with DUPLICATE_VOTER (KIP-853's final design, unlike KIP-856), so
AddThenRemove cannot work against Kafka 4.x; it is accepted for a future Kafka, and then each
recovery fails with that reason and touches nothing. The price of RemoveThenAdd: between the two
steps a 3-voter quorum runs on 2 voters and tolerates no further failure; the controller only
takes that step when both remaining voters are live.

Restart safety: progress (which directory id was the old one, the phase) and the controllers'
listeners are written to ``DIR/_watch-state.json`` (``--state``; the leading ``_`` keeps the report
job from reading it as events) before and after every change, fsynced (the file progress store,
progressfile.py; a damaged file is refused, naming it). A watcher killed between
RemoveRaftVoter and AddRaftVoter resumes with AddRaftVoter. A directory id retired by a completed
recovery is never re-added, even when a controller comes back with that old disk.

``--metrics-port PORT`` serves ``/metrics`` (Prometheus), ``/status`` (the last controller status,
JSON) and ``/healthz`` on 127.0.0.1 (``--metrics-host`` to change).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from kraftkeeper_reports.events import DISK_REPLACEMENT_DETECTED, RecoveryEvent, parse_ts_ms
from kraftkeeper_reports.vocabulary import (
    ADD_VOTER_COMMITTED,
    RECOVERY_COMPLETED,
    RECOVERY_FAILED,
    REMOVE_VOTER_COMMITTED,
)

from quorum.cliparse import ArgumentParser
from quorum.types import KraftError

from .. import failpoints
from ..controller import RecoveryController
from ..core.options import add_policy_arguments, policy_from_args
from ..core.progress import Known, Progress
from ..core.recovery import Order, Phase, PolicyError, Recovery, RecoveryPolicy
from ..progressfile import FileProgressStore
from ..statusserver import StatusServer
from ..telemetry import EventLogSink, EventSink, OperatorMetrics
from .backend import KafkaQuorum, parse_bootstrap
from .clientconf import ClientConfigError, ClientSettings

log = logging.getLogger("kraftkeeper.operator.watch")

STATE_FILE = "_watch-state.json"
# Failpoint for crash tests: one mechanism for every mode (failpoints.py, run by the controller).
# The older ``KRAFTKEEPER_WATCH_FAILPOINT=crash-before:<event type>`` still works: it is
# ``KRAFTKEEPER_FAILPOINT=before-event:<event type>``, used to kill the watcher exactly between
# RemoveRaftVoter and AddRaftVoter.
FAILPOINT_ENV = failpoints.WATCH_ENV
FAILPOINT_EXIT = failpoints.EXIT_CODE


class _EngineTagged:
    """Names the engine and the voter-change order in each detection event's ``detail``
    (``engine``: ``kafka``, ``order``: the policy's), so the report compares Kafka recoveries by
    this watcher with other engines and with Kafka's own auto-join side by side."""

    def __init__(self, sink: EventSink, order: str) -> None:
        self.sink, self.order = sink, order

    def emit(self, event: RecoveryEvent) -> None:
        if event.type == DISK_REPLACEMENT_DETECTED:
            tags = {"engine": "kafka", "order": self.order}
            event = dataclasses.replace(event, detail={**event.detail, **tags})
        self.sink.emit(event)


def _sink(events: Path, name: str) -> EventSink:
    return EventLogSink(events, name)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="kraftkeeper operator watch",
        description=__doc__.split("\n\n")[0],
        epilog="The default order is RemoveThenAdd: Kafka 4.x keeps one directory id per voter id and "
        "refuses AddRaftVoter for a second one (DUPLICATE_VOTER), so AddThenRemove cannot work against it. "
        f"Progress is kept in DIR/{STATE_FILE} and, failing that, read back from the event log.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--kafka-bootstrap-controllers", metavar="HOST:PORT[,HOST:PORT...]")
    where.add_argument(
        "--kafka-bootstrap-servers",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="brokers, when the controllers cannot be reached directly (they forward to the controller)",
    )
    p.add_argument("--events", required=True, metavar="DIR", help="recovery event log directory")
    p.add_argument("--name", default=None, help="cluster name in the event log (default: Kafka's cluster id)")
    p.add_argument(
        "--kafka-client-config",
        default=None,
        metavar="FILE",
        help="Kafka client properties (security.protocol, ssl.*, sasl.*), as --command-config",
    )
    add_policy_arguments(p, order=Order.REMOVE_THEN_ADD, unclean=False)
    p.add_argument("--interval", type=float, default=0.5, help="seconds between controller passes")
    p.add_argument("--metrics-port", type=int, default=None, help="serve /metrics, /status, /healthz here")
    p.add_argument("--metrics-host", default="127.0.0.1")
    p.add_argument("--state", default=None, metavar="FILE", help=f"progress file (default DIR/{STATE_FILE})")
    return p


def records_from_event_log(events: Path, cluster: str) -> list[Recovery]:
    """Recoveries of ``cluster`` as the event log tells them, for a watcher without a state file
    (lost, or a new machine): completed ones, so the directory ids they retired stay retired and
    an old disk that comes back is never taken for a new one (KAFKA-19850); and one stopped between
    RemoveRaftVoter and AddRaftVoter (phase Removed), so it is finished: the quorum alone cannot
    tell that the missing voter id should come back. Unreadable lines are skipped, counted."""
    by_id: dict[str, list[dict[str, Any]]] = {}
    bad = 0
    for f in sorted(events.rglob("*.jsonl")):
        for line in f.read_text(errors="replace").splitlines():
            try:
                e = json.loads(line)
                if e.get("cluster") == cluster and e.get("recovery_id"):
                    by_id.setdefault(str(e["recovery_id"]), []).append(e)
            except (ValueError, AttributeError):
                bad += 1
    if bad:
        log.warning("%d unreadable lines in the event log under %s were skipped", bad, events)
    out: list[Recovery] = []
    for rid, evs in by_id.items():
        types = {str(e.get("type")) for e in evs}
        try:
            first, last = evs[0], evs[-1]
            start = parse_ts_ms(str(first["ts"])) or 0
            end = parse_ts_ms(str(last["ts"])) or start
            rec = Recovery(
                rid,
                int(first["replica_id"]),
                str(first["old_uuid"]),
                str(first["new_uuid"]),
                Phase.COMPLETED,
                start,
            )
        except (KeyError, TypeError, ValueError):
            continue
        if RECOVERY_COMPLETED in types:
            rec.finished_ms = end
        elif REMOVE_VOTER_COMMITTED in types and not types & {ADD_VOTER_COMMITTED, RECOVERY_FAILED}:
            rec.phase = Phase.REMOVED
            rec.remove_committed_ms = end
        else:
            continue
        out.append(rec)
    return sorted(out, key=lambda r: r.finished_ms or r.detected_ms)


class Watcher:
    """One watched Kafka quorum: the controller, its state file and its HTTP endpoints."""

    def __init__(
        self,
        api: KafkaQuorum,
        policy: RecoveryPolicy,
        events: Path,
        *,
        name: str | None,
        store: FileProgressStore,
        saved: Progress,
        interval: float = 0.5,
    ) -> None:
        self.api = api
        self.policy = policy
        self.events = events
        self.name = name or saved.known.cluster
        self.store = store
        self.saved = saved
        self.interval = interval
        self.metrics = OperatorMetrics()
        self.ctl: RecoveryController | None = None
        self.last: dict[str, Any] = {"phase": "Starting", "passes": 0}
        self.passes = 0
        self._phase = ""
        api.listeners.update(saved.known.listeners)
        store.known = lambda: Known(listeners=dict(self.api.listeners), cluster=self.name)

    async def _ensure_controller(self) -> RecoveryController | None:
        if self.ctl is not None:
            return self.ctl
        if self.name is None:
            # The event log names the cluster: learn Kafka's cluster id first.
            try:
                await self.api.describe()
            except (KraftError, OSError, TimeoutError) as e:
                self.last = {"phase": "QuorumLost", "passes": self.passes, "error": str(e)}
                return None
            if not self.api.cluster_id:
                self.last = {"phase": "Starting", "passes": self.passes, "error": "cluster id unknown"}
                return None
            self.name = self.api.cluster_id
        records = self.saved.records
        if not records:
            records = await asyncio.to_thread(records_from_event_log, self.events, self.name)
            if records:
                log.info("no state file: %d recoveries taken from the event log", len(records))
        self.ctl = RecoveryController(
            self.api,
            self.policy,
            cluster=self.name,
            sink=_EngineTagged(_sink(self.events, self.name), self.policy.order.value),
            metrics=self.metrics,
            records=records,
            persist=self.store.save,
            desired_ids=None,  # Kafka has no reassignment: voter ids are the user's business
        )
        log.info(
            "watching Kafka cluster %s through %s (order %s, stabilisation %gs)",
            self.name,
            ",".join(f"{h}:{p}" for h, p in self.api.bootstrap),
            self.policy.order.value,
            self.policy.stabilization_seconds,
        )
        return self.ctl

    async def run_once(self) -> None:
        ctl = await self._ensure_controller()
        if ctl is not None:
            try:
                st = await asyncio.wait_for(ctl.reconcile(), timeout=max(120.0, 4 * self.interval))
                self.last = st.to_status()
                if st.view is not None and st.view.leader_id >= 0:
                    self.last["clusterId"] = self.api.cluster_id
            except TimeoutError:
                log.warning("controller pass took too long; retrying")
            except Exception:  # the watcher must outlive any controller bug
                log.exception("controller pass failed")
        self.passes += 1
        self.last["passes"] = self.passes
        self.last["cluster"] = self.name
        phase = str(self.last.get("phase"))
        if phase != self._phase:  # say so once per change, loudly when the quorum is lost
            level = logging.ERROR if phase == "QuorumLost" else logging.INFO
            why = next(
                (
                    c.get("message")
                    for c in self.last.get("conditions", [])
                    if c.get("status") == "True" and c.get("type") in ("QuorumLost", "Degraded")
                ),
                "",
            ) or self.last.get("error", "")
            log.log(level, "quorum %s: %s %s", self.name, phase, why)
            self._phase = phase

    async def run(self, stop: asyncio.Event, metrics_host: str, metrics_port: int | None) -> None:
        server: StatusServer | None = None
        if metrics_port is not None:
            server = StatusServer(self.metrics, lambda: self.last)
            await server.start(metrics_host, metrics_port)
        try:
            while not stop.is_set():
                await self.run_once()
                # Earlier than the interval when a recovery deadline falls due (stabilisation).
                pause = self.ctl.wake_in(self.interval) if self.ctl is not None else self.interval
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), pause)
        finally:
            await self.api.close()
            if server is not None:
                await server.stop()


def watch_main(argv: list[str]) -> int:
    """``kraftkeeper operator watch --kafka-bootstrap-controllers ... --events DIR [...]``."""
    a = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        policy = policy_from_args(a)
        failpoints.check()
        bootstrap = (
            parse_bootstrap(a.kafka_bootstrap_controllers)
            if a.kafka_bootstrap_controllers
            else parse_bootstrap(a.kafka_bootstrap_servers, "--kafka-bootstrap-servers")
        )
        settings = ClientSettings.from_properties(a.kafka_client_config) if a.kafka_client_config else None
        events = Path(a.events)
        events.mkdir(parents=True, exist_ok=True)
        store = FileProgressStore(Path(a.state) if a.state else events / STATE_FILE)
        saved = store.read()  # a damaged file is refused, naming it
        if a.interval <= 0:
            raise ValueError(f"--interval {a.interval:g}: must be > 0")
    except (PolicyError, ClientConfigError, ValueError) as e:
        sys.stderr.write(f"INVALID_REQUEST: {e}\n")
        return 2
    except OSError as e:
        sys.stderr.write(f"INVALID_REQUEST: --events {a.events}: {e.strerror or e}\n")
        return 2
    cluster = saved.known.cluster
    if cluster and a.name and cluster != a.name:
        sys.stderr.write(
            f"INVALID_REQUEST: --name {a.name}: {store.path} belongs to cluster {cluster}; "
            "use another --events directory or --state file\n"
        )
        return 2
    if policy.order is Order.ADD_THEN_REMOVE:
        log.warning(
            "--order AddThenRemove: Kafka 4.x refuses a second directory id for a voter id "
            "(DUPLICATE_VOTER), so each recovery will fail without changing voters"
        )
    api = KafkaQuorum(bootstrap, settings)
    watcher = Watcher(api, policy, events, name=a.name, store=store, saved=saved, interval=a.interval)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await watcher.run(stop, a.metrics_host, a.metrics_port)

    try:
        asyncio.run(main())
    except OSError as e:
        sys.stderr.write(f"UNAVAILABLE: {e}\n")
        return 1
    return 0
