"""Real Apache Kafka controllers on loopback, for the Kafka tests, the bench and trials.

``KafkaControllers`` formats and runs N controller-only Kafka 4.x processes from the jars that
``scripts/kafka.sh`` caches (``java -cp 'libs/*' kafka.Kafka server.properties``), as a KIP-853
dynamic quorum: ``controller.quorum.bootstrap.servers`` instead of a static voter list, the first
disks formatted with ``--initial-controllers`` (each voter named with its directory id), and a
replaced disk formatted with ``--no-initial-controllers`` so it comes back as an observer with a
new directory id (KIP-853 "controller disk failure"). It only starts and stops processes it
created itself, by PID, and never touches a Kafka it did not start.

Each JVM gets ``-Xmx256m`` and the serial collector: three controllers on a 2-core machine.

Controllers run supervised, as a kubelet runs a pod with ``restartPolicy: Always``: a controller
that exits on its own (not stopped here) is started again after a back-off (1 s, doubling to
10 s, reset once it has run 30 s), and each such exit is kept in ``crashes`` with Kafka's fatal
line from its ``out.log``. Kafka needs this: a controller whose disk was replaced and that comes
back while the survivors still name its old self leader (within one fetch timeout of the kill)
halts with ``IllegalStateException: Received request or response with leader OptionalInt[<its
id>] and epoch N which is inconsistent with current leader OptionalInt.empty and epoch 0``
(KafkaRaftClient.maybeTransition, Kafka 4.4); started again once they elected a new leader, it
joins as an observer. Unsupervised, that quorum never heals.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from quorum.localports import free_port
from quorum.polling import wait_until

from .kafkaproc import (
    _LOG4J2,
    JVM_OPTS,
    KAFKA_VERSION,
    RESTART_BACKOFF_FIRST,
    RESTART_BACKOFF_MAX,
    RESTART_RESET_AFTER,
    ControllerProc,
    Crash,
    KafkaSecurity,
    fatal_line,
    kafka_libs,
    kafka_tools_libs,
    metadata_quorum,
    random_kafka_uuid,
)

log = logging.getLogger(__name__)

__all__ = [
    "KAFKA_VERSION",
    "RESTART_BACKOFF_FIRST",
    "RESTART_BACKOFF_MAX",
    "Crash",
    "KafkaControllers",
    "KafkaSecurity",
    "fatal_line",
    "free_port",
    "kafka_libs",
    "kafka_tools_libs",
    "metadata_quorum",
]


@dataclass
class KafkaControllers:
    """N Kafka controllers under ``root`` (``node-<i>/{server.properties,data,out.log}``)."""

    root: Path
    libs: Path
    n: int = 3
    auto_join: bool = False
    cluster_id: str = field(default_factory=random_kafka_uuid)
    java: str = "java"
    security: KafkaSecurity | None = None
    controllers: dict[int, ControllerProc] = field(default_factory=dict)
    brokers: dict[int, ControllerProc] = field(default_factory=dict)
    supervise: bool = True
    # Kafka's follower fetch timeout (how long survivors keep naming a dead leader) and election
    # timeout; quick on loopback (Kafka's defaults are 2000 and 1000 ms).
    fetch_timeout_ms: int = 2000
    election_timeout_ms: int = 1000
    crashes: list[Crash] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _supervisor: threading.Thread | None = field(default=None, repr=False)
    _closing: threading.Event = field(default_factory=threading.Event, repr=False)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "log4j2.properties").write_text(_LOG4J2)
        for i in range(1, self.n + 1):
            d = self.root / f"node-{i}"
            d.mkdir(exist_ok=True)
            self.controllers[i] = ControllerProc(i, free_port(), d)

    @property
    def bootstrap(self) -> str:
        return ",".join(c.endpoint for c in self.controllers.values())

    def _classpath(self) -> str:
        return str(self.libs / "*")

    def _write_config(self, c: ControllerProc) -> Path:
        cfg = c.dir / "server.properties"
        if c.node_id in self.brokers:
            cfg.write_text(
                "process.roles=broker\n"
                f"node.id={c.node_id}\n"
                f"listeners=PLAINTEXT://{c.endpoint}\nadvertised.listeners=PLAINTEXT://{c.endpoint}\n"
                "inter.broker.listener.name=PLAINTEXT\ncontroller.listener.names=CONTROLLER\n"
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
                f"controller.quorum.bootstrap.servers={self.bootstrap}\n"
                f"log.dirs={c.data_dir}\noffsets.topic.replication.factor=1\n"
                "transaction.state.log.replication.factor=1\n"
            )
            return cfg
        props = {
            "process.roles": "controller",
            "node.id": str(c.node_id),
            "controller.listener.names": "CONTROLLER",
            "listeners": f"CONTROLLER://{c.endpoint}",
            "advertised.listeners": f"CONTROLLER://{c.endpoint}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
            "controller.quorum.bootstrap.servers": self.bootstrap,
            "controller.quorum.auto.join.enable": "true" if self.auto_join else "false",
            "log.dirs": str(c.data_dir),
            "metadata.log.dir": str(c.data_dir),
            # Quick elections on loopback (the fields above).
            "controller.quorum.election.timeout.ms": str(self.election_timeout_ms),
            "controller.quorum.fetch.timeout.ms": str(self.fetch_timeout_ms),
        }
        if self.security is not None:
            sec = self.security
            props.update(
                {
                    "listener.security.protocol.map": "CONTROLLER:SASL_SSL",
                    "sasl.enabled.mechanisms": "PLAIN",
                    "sasl.mechanism.controller.protocol": "PLAIN",
                    "listener.name.controller.plain.sasl.jaas.config": sec.jaas(),
                    "ssl.keystore.type": "PEM",
                    "ssl.keystore.location": str(sec.keystore_pem),
                    "ssl.truststore.type": "PEM",
                    "ssl.truststore.location": str(sec.ca_pem),
                }
            )
        cfg.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return cfg

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            self.java,
            *JVM_OPTS,
            f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
            "-cp",
            self._classpath(),
            main,
            *args,
        ]

    def _storage_format(self, c: ControllerProc, *extra: str) -> None:
        cfg = self._write_config(c)
        out = subprocess.run(
            self._java(
                "kafka.tools.StorageTool",
                "format",
                "--config",
                str(cfg),
                "--cluster-id",
                self.cluster_id,
                *extra,
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if out.returncode != 0:
            raise RuntimeError(f"kafka-storage format of node {c.node_id} failed: {out.stdout}{out.stderr}")

    def format_all(self) -> None:
        """The initial format: every controller a voter of the bootstrap set (id@host:port:dirid)."""
        ids = {i: random_kafka_uuid() for i in self.controllers}
        initial = ",".join(f"{i}@{c.endpoint}:{ids[i]}" for i, c in self.controllers.items())
        for i, c in self.controllers.items():
            shutil.rmtree(c.data_dir, ignore_errors=True)
            self._storage_format(c, "--initial-controllers", initial)
            got = c.directory_id()
            if got != ids[i]:
                raise RuntimeError(f"node {i} formatted with directory id {got}, expected {ids[i]}")

    def add_broker(self, node_id: int = 100) -> ControllerProc:
        """A broker (``process.roles=broker``) on its own port, formatted and started; for the
        "only a broker address is given" path. Listed in ``brokers``, stopped by ``stop_all``."""
        d = self.root / f"broker-{node_id}"
        d.mkdir(exist_ok=True)
        b = ControllerProc(node_id, free_port(), d)
        self.brokers[node_id] = b
        self._storage_format(b, "--no-initial-controllers")
        self.start_proc(b)
        return b

    def start(self, i: int) -> None:
        self.start_proc(self.controllers[i])

    def start_proc(self, c: ControllerProc) -> None:
        with self._lock:
            c.wanted, c.restart_at, c.backoff = True, None, RESTART_BACKOFF_FIRST
            self._spawn(c)
        self._ensure_supervisor()

    def _spawn(self, c: ControllerProc) -> None:
        if c.running():
            return
        self._write_config(c)
        log = open(c.dir / "out.log", "ab")
        try:
            c.proc = subprocess.Popen(
                self._java("kafka.Kafka", str(c.dir / "server.properties")),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        c.starts += 1
        c.started_at = time.monotonic()

    # --- supervision (see the module docstring) ---------------------------------------------

    def _ensure_supervisor(self) -> None:
        with self._lock:
            if not self.supervise or (self._supervisor is not None and self._supervisor.is_alive()):
                return
            self._closing.clear()
            self._supervisor = threading.Thread(target=self._supervise, name="kafka-supervisor", daemon=True)
            self._supervisor.start()

    def _supervise(self) -> None:
        while not self._closing.wait(0.2):
            self.supervise_once()

    def supervise_once(self, now: float | None = None) -> None:
        """One look at every process: record a wanted one that exited and restart it once its
        back-off has passed."""
        with self._lock:
            for c in [*self.controllers.values(), *self.brokers.values()]:
                t = time.monotonic() if now is None else now
                if not c.wanted or c.proc is None or c.proc.poll() is None:
                    if c.proc is not None and t - c.started_at >= RESTART_RESET_AFTER:
                        c.backoff = RESTART_BACKOFF_FIRST
                    continue
                if c.restart_at is None:
                    code = int(c.proc.returncode)
                    crash = Crash(c.node_id, time.time(), code, fatal_line(c.dir / "out.log"))
                    self.crashes.append(crash)
                    c.restart_at = t + c.backoff
                    log.warning(
                        "Kafka node %d exited with code %d (%s); restarting in %.0f s",
                        c.node_id, crash.returncode, crash.fatal or "no ERROR line in out.log", c.backoff,
                    )
                    c.backoff = min(c.backoff * 2, RESTART_BACKOFF_MAX)
                elif t >= c.restart_at:
                    c.restart_at = None
                    c.proc = None
                    self._spawn(c)

    def start_all(self) -> None:
        for i in self.controllers:
            self.start(i)

    def stop(self, i: int, *, kill: bool = False, grace: float = 20.0) -> None:
        """Stop controller ``i`` (SIGTERM, SIGKILL after ``grace``; SIGKILL at once with ``kill``)."""
        self.stop_proc(self.controllers[i], kill=kill, grace=grace)

    def stop_proc(self, c: ControllerProc, *, kill: bool = False, grace: float = 20.0) -> None:
        with self._lock:
            c.wanted, c.restart_at = False, None
            self._stop(c, kill=kill, grace=grace)

    def _stop(self, c: ControllerProc, *, kill: bool, grace: float) -> None:
        p = c.proc
        if p is None or p.poll() is not None:
            c.proc = None
            return
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(timeout=30)
        c.proc = None

    def stop_all(self, *, kill: bool = False) -> None:
        for b in self.brokers.values():
            self.stop_proc(b, kill=kill)
        for i in self.controllers:
            self.stop(i, kill=kill)
        self._closing.set()
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(timeout=5)

    @contextlib.contextmanager
    def running(self) -> Iterator[KafkaControllers]:
        """Format and start every controller, wait until each listens; killed on the way out
        (the fixtures of the Kafka tests)."""
        try:
            self.format_all()
            self.start_all()
            for i in self.controllers:
                self.wait_port(i)
            yield self
        finally:
            self.stop_all(kill=True)

    def wipe_and_format(self, i: int) -> str:
        """A replaced volume: empty data directory formatted with ``--no-initial-controllers``;
        returns the new directory id (base64url). The controller must be stopped."""
        c = self.controllers[i]
        if c.running():
            raise RuntimeError(f"controller {i} is running: stop it before replacing its disk")
        shutil.rmtree(c.data_dir, ignore_errors=True)
        self._storage_format(c, "--no-initial-controllers")
        new = c.directory_id()
        if new is None:
            raise RuntimeError(f"controller {i}: no directory.id after format")
        return new

    def replace_disk(self, i: int, *, start: bool = True) -> str:
        """Stop controller ``i``, wipe and re-format its disk, start it again; the new directory id.
        Held under the supervisor's lock so it never restarts the old process half-way."""
        with self._lock:
            self.stop(i, kill=True)
            new = self.wipe_and_format(i)
            if start:
                self.start(i)
        return new

    def wait_port(self, i: int, timeout: float = 90.0) -> None:
        c = self.controllers[i]

        def listening() -> bool:
            if not c.running() and not (c.wanted and self.supervise):
                raise RuntimeError(f"controller {i} exited: see {c.dir / 'out.log'}")
            with socket.create_connection(("127.0.0.1", c.port), timeout=1):  # OSError: not yet
                return True

        # TimedOut is a TimeoutError, as callers expect.
        wait_until(f"controller {i} to listen on {c.endpoint}", listening, timeout, 0.2, errors=(OSError,))

    def status_lines(self) -> str:
        """One line per process (running or not, starts) and every crash: context for a failed
        wait in a test or the demo."""
        out = []
        for c in [*self.controllers.values(), *self.brokers.values()]:
            state = "running" if c.running() else ("restarting" if c.wanted else "stopped")
            out.append(f"node {c.node_id} on {c.endpoint}: {state}, started {c.starts}x")
        for x in self.crashes:
            out.append(f"node {x.node_id} exited {x.returncode}: {x.fatal or '(no ERROR line)'}")
        return "\n".join(out)

    def log_tail(self, i: int, lines: int = 40) -> str:
        path = self.controllers[i].dir / "out.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
