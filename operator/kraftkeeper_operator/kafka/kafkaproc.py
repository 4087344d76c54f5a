"""One real Apache Kafka controller process on loopback, as :mod:`.cluster` runs them: the jars
``scripts/kafka.sh`` caches, Kafka's own ``kafka-metadata-quorum`` tool, a controller's files
(its ``meta.properties``, its log configuration), why it stopped (:func:`fatal_line`), and the
SASL_SSL settings of a secured quorum (:class:`KafkaSecurity`)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from quorum.kafka.mapping import uuid_to_base64
from quorum.properties import parse_properties
from quorum.types import new_storage_uuid

KAFKA_VERSION = "4.4.0"
# Restart back-off of a controller that exited on its own (kubelet's CrashLoopBackOff, shortened
# for loopback: Kafka's own election timeout here is 1 s).
RESTART_BACKOFF_FIRST = 1.0
RESTART_BACKOFF_MAX = 10.0
RESTART_RESET_AFTER = 30.0  # a run this long clears the back-off

JVM_OPTS = ["-Xmx256m", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]


def cache_dir() -> Path:
    return Path(os.environ.get("KK_CACHE") or Path.home() / ".cache" / "kraftkeeper")


def kafka_libs(version: str = KAFKA_VERSION) -> Path | None:
    """The server jar directory scripts/kafka.sh filled, or None when it is not (completely) there.
    ``KRAFTKEEPER_KAFKA_LIBS`` overrides the cache location."""
    env = os.environ.get("KRAFTKEEPER_KAFKA_LIBS")
    d = Path(env) if env else cache_dir() / f"kafka-{version}" / "libs"
    return d if (d / ".complete").exists() or (env and d.is_dir()) else None


def kafka_tools_libs(version: str = KAFKA_VERSION) -> Path | None:
    """The kafka-tools jar directory (kafka-metadata-quorum), or None."""
    d = cache_dir() / f"kafka-{version}" / "tools-libs"
    return d if (d / ".complete").exists() else None


def metadata_quorum(bootstrap: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Kafka's own ``kafka-metadata-quorum --bootstrap-controller BOOTSTRAP ARGS`` (its
    ``MetadataQuorumCommand`` class, one JVM start), output captured. Pass a value that may start
    with '-' as ``--option=value``. Raises ``FileNotFoundError`` when scripts/kafka.sh has not
    cached the tools jars."""
    libs = kafka_tools_libs()
    if libs is None:
        raise FileNotFoundError("the kafka-tools jars are not cached: run scripts/kafka.sh install")
    return subprocess.run(
        ["java", *JVM_OPTS, "-cp", str(libs / "*"), "org.apache.kafka.tools.MetadataQuorumCommand",
         "--bootstrap-controller", bootstrap, *args],
        capture_output=True, text=True, timeout=timeout,
    )


def random_kafka_uuid() -> str:
    """A random Kafka Uuid in its base64url form (never starting with '-': ``new_storage_uuid``)."""
    return uuid_to_base64(new_storage_uuid())




def read_meta(data_dir: Path) -> dict[str, str]:
    """A Kafka data directory's ``meta.properties`` ({} before it is formatted)."""
    try:
        text = (data_dir / "meta.properties").read_text()
    except FileNotFoundError:
        return {}
    return {k: v.strip() for k, v in parse_properties(text).items()}


_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.raft.name = org.apache.kafka.raft
logger.raft.level = INFO
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
"""


@dataclass
class ControllerProc:
    node_id: int
    port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    # Supervision: ``wanted`` is True from start_proc to stop_proc; a wanted process that exited
    # is restarted at ``restart_at`` (monotonic). ``backoff`` is the next delay.
    wanted: bool = False
    started_at: float = 0.0
    restart_at: float | None = None
    backoff: float = RESTART_BACKOFF_FIRST

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def directory_id(self) -> str | None:
        return read_meta(self.data_dir).get("directory.id")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass(frozen=True)
class Crash:
    """A controller that exited on its own: when, its exit code, and Kafka's last fatal or
    ERROR line from its out.log (empty when it printed none)."""

    node_id: int
    at: float
    returncode: int
    fatal: str


def fatal_line(out_log: Path, max_bytes: int = 65536) -> str:
    """The last line of ``out_log`` that says why Kafka stopped ("fatal fault", else the last
    ERROR line) with the exception line that follows it, if any; read from the end only, the log
    may be large."""
    try:
        with open(out_log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            tail = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for mark in ("fatal fault", " ERROR "):
        found = [i for i, ln in enumerate(tail) if mark in f" {ln} "]
        if found:
            i = found[-1]
            # The exception's own line follows Kafka's log line (its message says why).
            cause = tail[i + 1].strip() if i + 1 < len(tail) and "Exception" in tail[i + 1] else ""
            return f"{tail[i].strip()} {cause}".strip()
    return ""


@dataclass(frozen=True)
class KafkaSecurity:
    """SASL_SSL on the controller listener: a PEM truststore (the CA), a PEM keystore (key and
    certificate chain, for 127.0.0.1) and one PLAIN user that controllers and clients share."""

    ca_pem: Path
    keystore_pem: Path
    username: str
    password: str

    def jaas(self) -> str:
        return (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{self.username}" password="{self.password}" user_{self.username}="{self.password}";'
        )

    def client_properties(self, password: str | None = None) -> str:
        pw = self.password if password is None else password
        return (
            "security.protocol=SASL_SSL\n"
            f"ssl.truststore.type=PEM\nssl.truststore.location={self.ca_pem}\n"
            "sasl.mechanism=PLAIN\n"
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{self.username}" password="{pw}";\n'
        )
