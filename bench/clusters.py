"""The systems under test of ``bench/engine.py``: each a 3-node cluster on loopback that the
benchmark starts, finds the leader of, and stops.

* :class:`KraftKeeperCluster`: ``kraftkeeper format`` + ``kraftkeeper start`` x3 (fsync on or
  off, optionally ``--tls-dir``, optionally a ``--baseline`` revision's exported tree); also used
  by ``bench/recovery.py``.
* :class:`EtcdCluster`: Debian's ``etcd`` x3, plaintext or with client and peer TLS.
* :class:`PySyncObjCluster`: three ``python -m bench.engine pysyncobj-node`` processes (the node
  itself is ``bench/pysyncobj_node.py``).

:func:`make_pki` makes the certificates of the TLS rows and of the generator's TLS ceiling.
Every process runs in a :class:`bench.common.ProcessSet`, so ``stop`` ends whole process groups.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from bench.common import NOT_YET, find_leader_by_421, http_call, kraftkeeper_config
from bench.load import TlsFiles
from bench.procs import ProcessSet, kraftkeeper_command
from quorum.localports import free_ports
from quorum.security.pki import init_ca, issue_client, issue_node
from testkit.polling import wait_until
from testkit.revision import BaselineTree

START_TIMEOUT = 60.0


class Cluster(Protocol):
    """A 3-node cluster of one system under test."""

    label: str  # row label, e.g. "kraftkeeper fsync"
    family: str  # "kraftkeeper" | "etcd" | "pysyncobj"
    kind: str  # request shape for the generators: "kv" or "etcd"
    endpoints: list[str]  # client endpoints HOST:PORT, node 1 first
    tls: TlsFiles | None  # what clients present (None: plaintext)

    def start(self) -> None: ...

    def leader(self) -> str: ...

    def stop(self) -> None: ...


def probe_path() -> str:
    return f"/v1/kv/bench-probe-{secrets.token_hex(4)}"


class KraftKeeperCluster:
    family = "kraftkeeper"
    kind = "kv"

    def __init__(
        self,
        work: Path,
        fsync: bool,
        extra_config: dict[str, Any] | None = None,
        tls: bool = False,
        baseline: BaselineTree | None = None,
    ) -> None:
        self.fsync = fsync
        self.label = ("kraftkeeper fsync" if fsync else "kraftkeeper nofsync") + ("+tls" if tls else "")
        self.work = work / (("kk-fsync" if fsync else "kk-nofsync") + ("-tls" if tls else ""))
        # --baseline REV: the same row run by REV's exported tree (testkit/revision.py).
        self.baseline = baseline
        if baseline is not None:
            self.label += f" @{baseline.rev}"
            self.work = self.work.with_name(f"{self.work.name}-{baseline.rev}")
        self.use_tls = tls
        self.tls: TlsFiles | None = None
        self.extra_config = extra_config
        self.procs = ProcessSet(self.work / "logs")
        self.endpoints: list[str] = []
        self.cluster_id = f"bench-{secrets.token_hex(6)}"
        self.config_path = self.work / "config.json"

    def node_dir(self, i: int) -> Path:
        return self.work / f"n{i}"

    def _command(self) -> tuple[list[str], dict[str, str] | None, Path | None]:
        """argv prefix, extra environment and working directory of ``kraftkeeper``."""
        if self.baseline is None:
            return kraftkeeper_command(), None, None
        return self.baseline.command(), self.baseline.env(), self.baseline.source

    def start(self) -> None:
        ports = free_ports(3)
        self.endpoints = [f"127.0.0.1:{p}" for p in ports]
        self.work.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(kraftkeeper_config(self.fsync, self.extra_config)))
        if self.use_tls:
            self.tls = make_pki(self.work / "tls", self.cluster_id)
        for i in range(1, 4):
            self.format_node(i)
            self.start_node(i)
        for i, ep in enumerate(self.endpoints, start=1):
            wait_until(
                f"kraftkeeper node {i} /readyz",
                partial(self._ready, i, ep),
                START_TIMEOUT,
                errors=NOT_YET,
            )

    def format_node(self, i: int) -> str:
        """``kraftkeeper format`` node ``i``'s directory; returns the new storage UUID (the last
        line of stdout, docs/reference.md)."""
        cmd, env, cwd = self._command()
        proc = subprocess.run(
            [
                *cmd,
                "format",
                "--dir",
                str(self.node_dir(i)),
                "--cluster-id",
                self.cluster_id,
                "--node-id",
                str(i),
            ],
            capture_output=True,
            timeout=60,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"kraftkeeper format failed for node {i}: {proc.stderr.decode().strip()}")
        return proc.stdout.decode().strip().splitlines()[-1].strip()

    def start_node(self, i: int) -> None:
        voters = ",".join(f"{n + 1}@{ep}" for n, ep in enumerate(self.endpoints))
        cmd, env, cwd = self._command()
        self.procs.spawn(
            f"node-{i}",
            [
                *cmd,
                "start",
                "--dir",
                str(self.node_dir(i)),
                "--listen",
                self.endpoints[i - 1],
                "--voters",
                voters,
                "--config",
                str(self.config_path),
                *(["--tls-dir", str(self.work / "tls")] if self.tls is not None else []),
            ],
            env=env,
            cwd=cwd,
        )

    def _ready(self, i: int, ep: str) -> bool:
        self.procs.check_alive(f"node-{i}")
        return http_call(ep, "GET", "/readyz", timeout=2, tls=self.tls)[0] == 200

    def leader(self) -> str:
        return find_leader_by_421(self.endpoints, probe_path(), b"probe", START_TIMEOUT, tls=self.tls)

    def stop(self) -> None:
        self.procs.close()


def make_pki(directory: Path, cluster_id: str) -> TlsFiles:
    """A CA, node certificates 1-3 (server and client use, 127.0.0.1) and a ``readwrite``
    client certificate, made with our PKI module (ECDSA P-256)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = init_ca(directory, cluster_id)
    for i in (1, 2, 3):
        issue_node(ca, i)
    cert, key = issue_client(ca, "bench", "readwrite")
    return TlsFiles(str(directory / "ca.crt"), str(cert), str(key))


class EtcdCluster:
    family = "etcd"
    kind = "etcd"

    def __init__(self, work: Path, tls: bool = False) -> None:
        self.label = "etcd tls" if tls else "etcd"
        self.work = work / ("etcd-tls" if tls else "etcd")
        self.use_tls = tls
        self.tls: TlsFiles | None = None
        self.procs = ProcessSet(self.work / "logs")
        self.endpoints: list[str] = []

    def _tls_args(self, i: int) -> list[str]:
        """Client and peer TLS with certificate checks on both (etcd's security guide)."""
        if self.tls is None:
            return []
        d = self.work / "tls"
        node = [str(d / f"node-{i + 1}.crt"), str(d / f"node-{i + 1}.key")]
        return [
            "--cert-file", node[0], "--key-file", node[1],
            "--client-cert-auth", "--trusted-ca-file", self.tls.ca,
            "--peer-cert-file", node[0], "--peer-key-file", node[1],
            "--peer-client-cert-auth", "--peer-trusted-ca-file", self.tls.ca,
        ]  # fmt: skip

    def start(self) -> None:
        etcd = shutil.which("etcd")
        if etcd is None:
            raise RuntimeError("etcd is not installed: run scripts/install-bench.sh install")
        ports = free_ports(6)
        client, peer = ports[:3], ports[3:]
        self.endpoints = [f"127.0.0.1:{p}" for p in client]
        if self.use_tls:
            self.tls = make_pki(self.work / "tls", "etcd-bench")
        sch = "https" if self.tls is not None else "http"
        initial = ",".join(f"e{i + 1}={sch}://127.0.0.1:{p}" for i, p in enumerate(peer))
        token = f"bench-{secrets.token_hex(4)}"
        for i in range(3):
            self.procs.spawn(
                f"etcd-{i + 1}",
                [
                    etcd,
                    "--name",
                    f"e{i + 1}",
                    "--data-dir",
                    str(self.work / f"e{i + 1}"),
                    "--listen-client-urls",
                    f"{sch}://{self.endpoints[i]}",
                    "--advertise-client-urls",
                    f"{sch}://{self.endpoints[i]}",
                    "--listen-peer-urls",
                    f"{sch}://127.0.0.1:{peer[i]}",
                    "--initial-advertise-peer-urls",
                    f"{sch}://127.0.0.1:{peer[i]}",
                    *self._tls_args(i),
                    "--initial-cluster",
                    initial,
                    "--initial-cluster-state",
                    "new",
                    "--initial-cluster-token",
                    token,
                    "--logger",
                    "zap",
                    "--log-level",
                    "warn",
                ],
            )

    def leader(self) -> str:
        def find() -> str | None:
            for i, ep in enumerate(self.endpoints, start=1):
                self.procs.check_alive(f"etcd-{i}")
                try:
                    status, body = http_call(
                        ep, "POST", "/v3/maintenance/status", b"{}", timeout=2, tls=self.tls
                    )
                except OSError:
                    continue
                if status != 200:
                    continue
                d = json.loads(body)
                # uint64 ids arrive as JSON strings from the gateway.
                if d.get("leader") and str(d["leader"]) == str(d.get("header", {}).get("member_id")):
                    return ep
            return None

        return wait_until("an etcd leader", find, START_TIMEOUT, 0.1, errors=NOT_YET)

    def stop(self) -> None:
        self.procs.close()


class PySyncObjCluster:
    family = "pysyncobj"
    kind = "kv"

    tls: TlsFiles | None = None

    def __init__(self, work: Path, batch: bool) -> None:
        self.batch = batch
        self.label = "pysyncobj batch" if batch else "pysyncobj nobatch"
        self.work = work / ("pso-batch" if batch else "pso-nobatch")
        self.procs = ProcessSet(self.work / "logs")
        self.endpoints: list[str] = []

    def start(self) -> None:
        ports = free_ports(6)
        raft, http = ports[:3], ports[3:]
        self.endpoints = [f"127.0.0.1:{p}" for p in http]
        for i in range(3):
            argv = [
                sys.executable,
                "-m",
                "bench.engine",
                "pysyncobj-node",
                "--index",
                str(i),
                "--raft-ports",
                ",".join(map(str, raft)),
                "--http-ports",
                ",".join(map(str, http)),
            ]
            if not self.batch:
                argv.append("--no-batch")
            self.procs.spawn(f"pso-{i + 1}", argv)
        for i, ep in enumerate(self.endpoints, start=1):
            wait_until(
                f"pysyncobj node {i} /readyz",
                partial(self._ready, i, ep),
                START_TIMEOUT,
                errors=NOT_YET,
            )

    def _ready(self, i: int, ep: str) -> bool:
        self.procs.check_alive(f"pso-{i}")
        return http_call(ep, "GET", "/readyz", timeout=2)[0] == 200

    def leader(self) -> str:
        return find_leader_by_421(self.endpoints, probe_path(), b"probe", START_TIMEOUT)

    def stop(self) -> None:
        self.procs.close()
