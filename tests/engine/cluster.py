"""A real local cluster for process-level tests: N ``kraftkeeper start`` processes on
loopback, each with its own data directory, driven through the real CLI and HTTP API."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quorum.client import QuorumClient
from quorum.localports import free_ports
from testkit.polling import ANY_ERROR, wait_until

KK = [sys.executable, "-m", "quorum.cli"]




def run_cli(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([*KK, *args], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"kraftkeeper {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p


class LocalCluster:
    def __init__(
        self, root: Path, n: int = 3, config: dict[str, Any] | None = None, cluster_id: str = "test-cluster"
    ) -> None:
        self.root = root
        self.n = n
        self.cluster_id = cluster_id
        self.ports = dict(zip(range(1, n + 1), free_ports(n), strict=True))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.uuids: dict[int, str] = {}
        self.config_path: Path | None = None
        # Shorter than KRaft's defaults so failover tests finish sooner, long enough to stay
        # stable on a loaded 2-core CI machine.
        cfg = {"raft": {"election_timeout_ms": 600, "fetch_timeout_ms": 1500}}
        if config:
            for k, v in config.items():
                cfg.setdefault(k, {}).update(v)
        self.config_path = root / "node-config.json"
        self.config_path.write_text(json.dumps(cfg))

    @property
    def voters(self) -> str:
        """The bootstrap voter set: the first ``n`` nodes (later ones join as observers)."""
        return ",".join(f"{i}@127.0.0.1:{p}" for i, p in self.ports.items() if i <= self.n)

    def endpoint(self, i: int) -> str:
        return f"127.0.0.1:{self.ports[i]}"

    @property
    def bootstrap(self) -> str:
        return ",".join(self.endpoint(i) for i in self.ports)

    def data_dir(self, i: int) -> Path:
        return self.root / f"node-{i}"

    def format(self, i: int, replacement: bool = False, uuid_from_cert: Path | None = None) -> str:
        """Format node i; ``replacement`` for a disk that replaces a lost one (KIP-853 style
        ``--no-initial-controllers``: the node never counts itself a bootstrap voter); ``uuid_from_cert``
        formats with the storage UUID that certificate names."""
        extra = ["--no-initial-controllers"] if replacement else []
        out = run_cli(
            "format",
            "--dir",
            str(self.data_dir(i)),
            "--cluster-id",
            self.cluster_id,
            "--node-id",
            str(i),
            *(["--storage-uuid-from-cert", str(uuid_from_cert)] if uuid_from_cert else []),
            *extra,
        )
        self.uuids[i] = out.stdout.strip().splitlines()[-1]
        return self.uuids[i]

    def add_node(self, i: int) -> None:
        """A node outside the bootstrap voters (it joins as an observer), formatted and started."""
        self.ports[i] = free_ports(1)[0]
        self.format(i, replacement=True)
        self.start(i)

    def start_args(self, i: int) -> list[str]:
        """Extra ``kraftkeeper start`` options for node i (``tests.tlsfixtures``: TLS)."""
        return []

    def command(self, i: int) -> tuple[list[str], dict[str, str] | None]:
        """The ``kraftkeeper`` command of node i and its environment (None: this process's);
        a mixed-version test runs another revision's tree for some nodes."""
        return KK, None

    def start(self, i: int) -> None:
        log = open(self.root / f"node-{i}.log", "ab")
        kk, env = self.command(i)
        self.procs[i] = subprocess.Popen(
            [
                *kk,
                "start",
                "--dir",
                str(self.data_dir(i)),
                "--listen",
                self.endpoint(i),
                "--voters",
                self.voters,
                "--config",
                str(self.config_path),
                *self.start_args(i),
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
            env=env,
        )

    def up(self) -> LocalCluster:
        for i in self.ports:
            self.format(i)
        for i in self.ports:
            self.start(i)
        return self

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Stop node i with ``sig``; a node that ignores SIGTERM for 15 s is SIGKILLed (a test
        must never leave a process behind)."""
        p = self.procs.pop(i, None)
        if p is None or p.poll() is not None:
            return
        p.send_signal(sig)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=15)
            if sig != signal.SIGKILL:
                raise AssertionError(f"node {i} did not stop on signal {sig}") from None

    def replace_disk(self, i: int) -> str:
        """Kill node i, delete its directory, format it again (new storage UUID), start it."""
        self.kill(i)
        shutil.rmtree(self.data_dir(i))
        uuid = self.format(i, replacement=True)
        self.start(i)
        return uuid

    def stop(self) -> None:
        errors = []
        for i in list(self.procs):
            try:
                self.kill(i, signal.SIGTERM)
            except AssertionError as e:
                errors.append(str(e))
        if errors:
            raise AssertionError("; ".join(errors))

    def log_text(self, i: int) -> str:
        return (self.root / f"node-{i}.log").read_text(errors="replace")

    # ---- client helpers (sync wrappers over QuorumClient) --------------------------------
    def call(self, fn: Callable[[QuorumClient], Any], timeout: float = 30) -> Any:
        async def go() -> Any:
            async with QuorumClient(self.bootstrap, timeout=timeout) as c:
                return await fn(c)

        return asyncio.run(go())

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = self.call(lambda c: c.describe())
        return d

    def leader(self, timeout: float = 30) -> int:
        def find() -> int | None:
            d = self.describe()
            return d["leader_id"] if d.get("leader_id", -1) >= 0 and d.get("high_watermark", 0) > 0 else None

        return int(wait_until(
            "a leader with a committed high watermark", find, timeout, 0.05, errors=ANY_ERROR,
        ))

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
