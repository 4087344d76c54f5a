"""The status port of ``kraftkeeper operator local``, bound before it is reported.

The cluster's ports are one block: the operator's ``/metrics``, ``/status`` and ``/healthz`` on
PORT, node i on PORT+i (cluster.json's ``base_port``). The operator binds PORT first thing, before
formatting the nodes or issuing certificates (seconds on a loaded machine), so that no other
process can take it in between. With ``--base-port 0`` it chooses the block itself
(:mod:`quorum.localports`), listens on PORT at once and only then writes the block into
cluster.json: whoever started it reads the port from there, and the port it reads is already
held. (A fresh draw replaces one another listener took between the probe and the bind.)

The node ports PORT+1..PORT+N are bound by the node processes when they start; the supervisor
restarts a node whose port was busy.
"""

from __future__ import annotations

import socket

from quorum.localports import NoFreePorts, free_port_range

__all__ = ["HOST", "PortUnavailable", "bind_free_block", "bind_status"]

HOST = "127.0.0.1"
_DRAWS = 20


class PortUnavailable(RuntimeError):
    """The operator port cannot be listened on (the message names it and why)."""


def bind_status(port: int) -> socket.socket:
    """A socket listening on ``HOST:port``, bound as aiohttp binds (``SO_REUSEADDR``, so a port in
    TIME_WAIT is fine); :class:`PortUnavailable` if another socket listens there."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((HOST, port))
        # Listening, not only bound: on Linux another SO_REUSEADDR socket may bind a port that is
        # bound but not listening, and the allocator's probe counts only listeners as taken.
        s.listen(128)
    except OSError as e:
        s.close()
        raise PortUnavailable(f"{HOST}:{port}: {e.strerror or e}") from None
    return s


def bind_free_block(nodes: int) -> tuple[int, socket.socket]:
    """A base port whose block ``base .. base+nodes`` was free, with ``base`` already listening."""
    last: PortUnavailable | None = None
    for _ in range(_DRAWS):
        try:
            base = free_port_range(nodes + 1, HOST)
        except NoFreePorts as e:
            raise PortUnavailable(str(e).removeprefix("UNAVAILABLE: ")) from None
        try:
            return base, bind_status(base)
        except PortUnavailable as e:  # taken between the probe and the bind: draw again
            last = e
    raise PortUnavailable(f"no free block of {nodes + 1} loopback ports could be bound (last: {last})")
