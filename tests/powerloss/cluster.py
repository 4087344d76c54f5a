"""A 3-node TLS cluster of real ``kraftkeeper start`` processes whose data directories each sit
on their own powerfs mount: a node can crash (SIGKILL: its unsynced writes stay in its disk's
page cache, as after a process crash) and its disk can lose power (``clear-cache``: every byte
it did not fsync is gone)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from quorum.client import QuorumClient
from quorum.security.clientconfig import load_client_config
from tests.powerloss.powerfs import PowerFs
from tests.tlsfixtures import TlsCluster


class PowerCluster(TlsCluster):
    """:class:`~tests.tlsfixtures.TlsCluster` with node i's data directory on ``disks[i]``."""

    def __init__(self, root: Path, tls: Path, mount: Callable[[str], PowerFs],
                 config: dict[str, Any] | None = None) -> None:
        super().__init__(root, tls, config=config)
        self.disks = {i: mount(f"disk-{i}") for i in self.ports}

    def data_dir(self, i: int) -> Path:
        return self.disks[i].mountpoint / "data"

    def running(self) -> list[int]:
        return [i for i, p in self.procs.items() if p.poll() is None]

    def crash(self, nodes: Iterable[int]) -> None:
        """SIGKILL ``nodes`` at once (signalled together, then reaped)."""
        nodes = [i for i in nodes if i in self.procs]
        for i in nodes:
            self.procs[i].send_signal(signal.SIGKILL)
        for i in nodes:
            self.kill(i)

    def power_loss(self, nodes: Iterable[int]) -> None:
        """Power loss of ``nodes``: their processes die and their disks drop what was not
        fsynced."""
        nodes = list(nodes)
        self.crash(nodes)
        for i in nodes:
            self.disks[i].clear_cache()

    def ready(self, i: int) -> bool:
        """Whether node i answers ``/readyz`` with 200 (it knows a leader, or is it); raises
        while it does not answer at all."""
        status, _ = self.call_as("rw.json", lambda q: q.node_get(self.endpoint(i), "/readyz"))
        return bool(status == 200)

    def client(self, timeout: float = 10) -> QuorumClient:
        """A client with the read-write token (the caller closes it)."""
        config = load_client_config(self.tls / "rw.json")
        return QuorumClient(self.bootstrap, timeout=timeout, client_config=config)
