"""A local cluster directory for ``kraftkeeper operator local``: its layout, its formatting rules
and ``kraftkeeper cluster replace-disk`` (a simulated volume replacement).

Layout under DIR (created if missing)::

    cluster.json          cluster id, node count, base port (fixed at first start)
    node-<i>/             node i's data directory (meta.properties, log, quorum-state)
    node-<i>.log          node i's stdout+stderr, appended across restarts
    events/               the recovery event log (cluster name = DIR's base name)
    operator-state.json   recorded recovery progress and the last voter set a leader reported
                          (the quorum stays the source of truth)
    control/supervisor.pid, control/node-<i>.pid
    control/node-<i>.hold, control/node-<i>.stopped   the replace-disk handshake

Node i listens on 127.0.0.1:PORT+i; the supervisor serves ``/metrics``, ``/status`` and
``/healthz`` on 127.0.0.1:PORT.

Initial versus replacement formatting (invariant): only the first formatting of a brand-new
cluster is *initial*. The supervisor formats every node directory before it starts any node, then
records ``"bootstrapped": true`` in cluster.json (so the rule survives supervisor restarts; a
crash in between simply formats the remaining directories initially on the next start, since no
node has run yet). Every later format - ``cluster replace-disk``, or the supervisor finding a wiped
directory - runs ``kraftkeeper format --no-initial-controllers`` (meta.properties gets
``bootstrap.initial=false``). A replacement disk must never count itself as one of the uuid-less
bootstrap voters: otherwise two replaced disks with empty logs could elect each other and
overwrite committed records (KIP-856 "storage UUID" motivation; the same flag as Kafka's KIP-853
``format --no-initial-controllers``). A cluster.json written before this key existed counts as
bootstrapped when any node directory is formatted. ``cluster replace-disk`` on a cluster that was
never started is refused: there is no disk to replace yet.

replace-disk handshake (so the supervisor never restarts a node whose directory is being wiped):
the command creates ``control/node-N.hold`` holding its pid; the supervisor stops node N (SIGTERM,
SIGKILL after a grace period), writes ``control/node-N.stopped`` and starts nothing for N while the
hold exists; the command then deletes ``node-N/``, formats it again, removes the hold, and the
supervisor starts the node with its new storage UUID. A hold whose owner process is gone is
removed by the supervisor, so a killed command cannot block a node forever. Without a running
supervisor the command does the same steps directly (there is no node process to stop).

"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import uuid as _uuid
from dataclasses import dataclass
from pathlib import Path

from quorum.polling import wait_until
from quorum.storage.atomic import atomic_write

log = logging.getLogger("kraftkeeper.operator.local")

DEFAULT_BASE_PORT = 19400


def kraftkeeper_cmd() -> list[str]:
    """How to run the CLI: the same interpreter, so it works inside a venv without PATH."""
    return [sys.executable, "-m", "quorum.cli"]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_atomic(path: Path, text: str) -> None:
    """``text`` as ``path``'s new content: quorum.storage.atomic's rule (the file fsynced, renamed
    into place, then its directory fsynced, so the rename itself survives a power loss)."""
    atomic_write(path, text.encode())


@dataclass
class ClusterLayout:
    """Paths and identity of a local cluster directory."""

    dir: Path
    cluster_id: str
    nodes: int
    base_port: int
    # True once every node directory got its initial format (see the module docstring).
    bootstrapped: bool = False

    @classmethod
    def _from_json(cls, d: Path) -> ClusterLayout:
        cfg = d / "cluster.json"
        try:
            data = json.loads(cfg.read_text())
            have = cls(d, str(data["cluster_id"]), int(data["nodes"]), int(data["base_port"]))
            flag = data.get("bootstrapped")
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(
                f"{cfg} is damaged ({type(e).__name__}: {e}); it names the cluster: fix it by hand"
            ) from None
        if flag is None:
            # Written before the flag existed: formatted directories mean nodes may have run.
            flag = any((have.data_dir(i) / "meta.properties").exists() for i in range(1, have.nodes + 1))
        have.bootstrapped = bool(flag)
        return have

    def save(self) -> None:
        write_atomic(
            self.dir / "cluster.json",
            json.dumps(
                {
                    "cluster_id": self.cluster_id,
                    "nodes": self.nodes,
                    "base_port": self.base_port,
                    "bootstrapped": self.bootstrapped,
                }
            )
            + "\n",
        )

    @classmethod
    def load_or_create(cls, d: Path, nodes: int | None, base_port: int | None) -> ClusterLayout:
        d.mkdir(parents=True, exist_ok=True)
        cfg = d / "cluster.json"
        if cfg.exists():
            have = cls._from_json(d)
            if nodes is not None and nodes != have.nodes:
                raise ValueError(f"--nodes {nodes}: {d} was created with {have.nodes} nodes")
            if have.base_port == 0 and base_port:
                # Prepared without ports (base_port 0: "choose at the first start"): the block
                # chosen now is recorded for every later start.
                have.base_port = base_port
                have.save()
            if base_port is not None and base_port != have.base_port:
                raise ValueError(f"--base-port {base_port}: {d} was created with base port {have.base_port}")
            return have
        n = 3 if nodes is None else nodes
        if not 1 <= n <= 9:
            raise ValueError(f"--nodes {n}: must be between 1 and 9")
        port = DEFAULT_BASE_PORT if base_port is None else base_port
        if not 1024 <= port <= 65535 - n:
            raise ValueError(f"--base-port {port}: must leave room for {n} node ports below 65536")
        layout = cls(d, _uuid.uuid4().hex[:22], n, port)
        layout.save()
        return layout

    @classmethod
    def load(cls, d: Path) -> ClusterLayout:
        cfg = d / "cluster.json"
        if not cfg.exists():
            raise FileNotFoundError(
                f"{d} is not a cluster run by `kraftkeeper operator local` (no cluster.json)"
            )
        return cls._from_json(d)

    @property
    def name(self) -> str:
        return self.dir.resolve().name

    def endpoint(self, i: int) -> str:
        return f"127.0.0.1:{self.base_port + i}"

    def voters(self) -> str:
        return ",".join(f"{i}@{self.endpoint(i)}" for i in range(1, self.nodes + 1))

    def data_dir(self, i: int) -> Path:
        return self.dir / f"node-{i}"

    def control(self) -> Path:
        p = self.dir / "control"
        p.mkdir(exist_ok=True)
        return p

    def hold_file(self, i: int) -> Path:
        return self.control() / f"node-{i}.hold"

    def stopped_file(self, i: int) -> Path:
        return self.control() / f"node-{i}.stopped"

    def format(self, i: int, *, initial: bool = False) -> str:
        """Format node i's directory (new storage UUID); returns the UUID. ``initial`` only for
        the first formatting of a cluster that was never bootstrapped (:meth:`bootstrap`); any
        other format is a replacement disk (``--no-initial-controllers``)."""
        if initial and self.bootstrapped:
            raise ValueError(f"node {i}: {self.dir} is bootstrapped already; only replacement formats remain")
        out = subprocess.run(
            [
                *kraftkeeper_cmd(),
                "format",
                "--dir",
                str(self.data_dir(i)),
                "--cluster-id",
                self.cluster_id,
                "--node-id",
                str(i),
                *([] if initial else ["--no-initial-controllers"]),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"format of node {i} failed: {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout.strip().splitlines()[-1].strip()

    def formatted(self, i: int) -> bool:
        return (self.data_dir(i) / "meta.properties").exists()

    def bootstrap(self) -> None:
        """Give every unformatted node directory its initial format, then record the cluster as
        bootstrapped. Must run before any node starts; a no-op once bootstrapped."""
        if self.bootstrapped:
            return
        for i in range(1, self.nodes + 1):
            if not self.formatted(i):
                log.info("formatted node %d (initial): storage uuid %s", i, self.format(i, initial=True))
        self.bootstrapped = True
        self.save()

    def ensure_formatted(self, i: int) -> str | None:
        """Format node i's directory as a replacement disk if it has no meta.properties (wiped by
        hand); returns the new UUID, or None if it was formatted already."""
        if self.formatted(i):
            return None
        if not self.bootstrapped:
            raise RuntimeError(f"node {i}: {self.dir} was never bootstrapped; refusing to start nodes")
        return self.format(i)


def replace_disk(layout: ClusterLayout, node: int, *, timeout: float = 60.0) -> str:
    """Stop node ``node`` (through the supervisor if one runs), wipe and re-format its data
    directory; returns the new storage UUID. Raises ValueError/TimeoutError with a clear message."""
    if not 1 <= node <= layout.nodes:
        raise ValueError(f"--node {node}: the cluster has nodes 1..{layout.nodes}")
    if not layout.bootstrapped:
        raise ValueError(
            f"{layout.dir} has never been started (cluster.json: not bootstrapped), so there is no disk"
            " to replace yet; run `kraftkeeper operator local` first"
        )
    hold, stopped = layout.hold_file(node), layout.stopped_file(node)
    try:
        fd = os.open(hold, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        raise ValueError(f"node {node} is already being replaced ({hold} exists)") from None
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    try:
        pidfile = layout.control() / "supervisor.pid"
        sup = int(pidfile.read_text().strip() or 0) if pidfile.exists() else 0
        if sup and pid_alive(sup):
            # TimedOut is a TimeoutError: `cluster replace-disk` says UNAVAILABLE with its message.
            wait_until(f"the supervisor (pid {sup}) to stop node {node}", stopped.exists, timeout, 0.05)
        else:
            node_pid = layout.control() / f"node-{node}.pid"
            if node_pid.exists():
                pid = int(node_pid.read_text().strip() or 0)
                if pid and pid_alive(pid):
                    raise ValueError(f"node {node} (pid {pid}) runs without a supervisor; stop it first")
        shutil.rmtree(layout.data_dir(node), ignore_errors=True)
        return layout.format(node)
    finally:
        with contextlib.suppress(FileNotFoundError):
            hold.unlink()


def meta_uuid(d: Path) -> str | None:
    """The storage UUID in a data directory's meta.properties (None if unformatted/unreadable)."""
    try:
        for line in (d / "meta.properties").read_text().splitlines():
            if line.startswith("directory.id="):
                return line.split("=", 1)[1].strip()
    except OSError:
        return None
    return None
