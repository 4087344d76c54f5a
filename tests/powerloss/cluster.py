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
from testkit.polling import wait_until
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

    def hold_syncs(self, nodes: Iterable[int], within: float) -> list[int]:
        """Hold every fsync on the disks of ``nodes`` (powerfs ``hold-sync``) and wait up to
        ``within`` seconds until each has one held; returns those that have. The next
        :meth:`fault` of these nodes ends the hold, so they die inside their fsync."""
        nodes = list(nodes)
        for i in nodes:
            self.disks[i].command("hold-sync")
        try:
            wait_until(
                "held fsyncs",
                lambda: all(self.disks[i].stats()["held_syncs"] for i in nodes),
                within,
                errors=(Exception,),
            )
        except AssertionError:
            pass  # a node that wrote nothing meanwhile dies outside an fsync
        return [i for i in nodes if self.disks[i].stats()["held_syncs"]]

    def fault(self, crash: Iterable[int] = (), power: Iterable[int] = ()) -> None:
        """SIGKILL the nodes of ``crash`` and ``power`` at once; then the disks of ``power`` lose
        what was not fsynced. A victim whose fsync is held (:meth:`hold_syncs`) dies inside it:
        the hold ends after the signals, and the held fsync fails without syncing (the killed
        process cannot exit before it returns)."""
        power = list(power)
        victims = [*crash, *power]
        for i in victims:
            if i in self.procs:
                self.procs[i].send_signal(signal.SIGKILL)
        for i in victims:
            self.disks[i].command("fail-held-sync")
        for i in victims:
            self.kill(i)
        for i in power:
            self.disks[i].clear_cache()

    def stop(self) -> None:
        for disk in self.disks.values():  # a held fsync would keep its process from stopping
            if disk.proc is not None:
                disk.command("fail-held-sync")
        super().stop()

    def crash(self, nodes: Iterable[int]) -> None:
        """SIGKILL ``nodes`` at once: their unsynced writes stay in their disks' page cache."""
        self.fault(crash=nodes)

    def power_loss(self, nodes: Iterable[int]) -> None:
        """Power loss of ``nodes``: their processes die and their disks drop what was not
        fsynced."""
        self.fault(power=nodes)

    def ready(self, i: int) -> bool:
        """Whether node i answers ``/readyz`` with 200 (it knows a leader, or is it); raises
        while it does not answer at all."""
        status, _ = self.call_as("rw.json", lambda q: q.node_get(self.endpoint(i), "/readyz"))
        return bool(status == 200)

    def client(self, timeout: float = 10) -> QuorumClient:
        """A client with the read-write token (the caller closes it)."""
        config = load_client_config(self.tls / "rw.json")
        return QuorumClient(self.bootstrap, timeout=timeout, client_config=config)
