"""The one port allocator (``quorum.localports``): the demo, ``operator local``, the tests and the
benches get loopback ports the servers they start can bind, also right after the machine made many
short connections (each leaves its local port in TIME_WAIT).

The demo used to probe a port the kernel handed out for a client (inside the ephemeral range) and
the ports after it, binding without ``SO_REUSEADDR``: a port in TIME_WAIT failed that probe though
the node's server (which binds with ``SO_REUSEADDR``) would have taken it, and after tens of
thousands of short connections the demo gave up with "no free range of loopback ports".
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kraftkeeper_demo.demo_common import free_base_port

from quorum.localports import NoFreePorts, ephemeral_range, free_port_range, free_ports, port_is_free


@contextmanager
def _listener() -> Iterator[socket.socket]:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(512)
    try:
        yield srv
    finally:
        srv.close()


def _time_wait_from(srv: socket.socket, local_port: int | None = None) -> int:
    """One short connection to ``srv`` that the client closes first, so its local port ends in
    TIME_WAIT (the active closer's side); returns that port."""
    c = socket.socket()
    if local_port is not None:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        c.bind(("127.0.0.1", local_port))
    c.connect(srv.getsockname())
    conn, _ = srv.accept()
    port = int(c.getsockname()[1])
    c.close()  # FIN from the client first ...
    conn.close()  # ... then the server's: the client side goes to TIME_WAIT
    return port


def _plain_bind_fails(port: int) -> bool:
    """The old probe: bind without SO_REUSEADDR."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


async def _serve_all(ports: list[int]) -> None:
    """Bind a server on every port as the node does (asyncio, SO_REUSEADDR), then close them."""
    servers = [await asyncio.start_server(lambda r, w: None, "127.0.0.1", p) for p in ports]
    for s in servers:
        s.close()
        await s.wait_closed()


def test_a_block_in_time_wait_is_handed_out_and_served() -> None:
    # A block of 4 ports, each left in TIME_WAIT by a short connection bound to it.
    base = free_port_range(4)
    with _listener() as srv:
        for p in range(base, base + 4):
            _time_wait_from(srv, p)
    # The premise: the old probe refuses these ports ...
    assert all(_plain_bind_fails(p) for p in range(base, base + 4)), "no TIME_WAIT was made"
    # ... the allocator, limited to that block, hands it out, and servers bind every port.
    assert free_port_range(4, span=(base, base)) == base
    asyncio.run(_serve_all(list(range(base, base + 4))))


def test_demo_allocator_after_many_short_connections() -> None:
    low, high = ephemeral_range()
    made: set[int] = set()
    with _listener() as srv:
        for _ in range(3000):
            made.add(_time_wait_from(srv))
    assert len(made) > 2500 and all(low <= p <= high for p in made), "clients did not use the ephemeral range"
    for _ in range(30):
        base = free_base_port(3)  # the demo's call: base..base+3
        ports = list(range(base, base + 4))
        assert not any(low <= p <= high for p in ports), f"{ports} inside the ephemeral range {low}-{high}"
        assert not made & set(ports)
        asyncio.run(_serve_all(ports))


def test_a_listening_port_is_not_free() -> None:
    with _listener() as srv:
        port = int(srv.getsockname()[1])
        assert not port_is_free(port)
        with pytest.raises(NoFreePorts, match=f"{port}"):
            free_port_range(1, span=(port, port))


def test_a_port_bound_by_another_program_is_not_free() -> None:
    # Bound without SO_REUSEADDR and not listening (a client about to connect): taken.
    port = free_ports(1)[0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        assert not port_is_free(port)
    assert port_is_free(port)


def test_bad_count_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        free_port_range(0)


def test_above_ephemeral_block_stays_clear_of_the_usual_draws() -> None:
    # The single-node cluster's ports: above the ephemeral range, so a test worker beside it
    # (which draws below the range) can never take one between the probe and the bind.
    low, high = ephemeral_range()
    if 65535 - 11 + 1 < high + 1:
        pytest.skip(f"the ephemeral range {low}-{high} leaves no room above it on this machine")
    ports = free_ports(11, above_ephemeral=True)
    assert len(set(ports)) == 11
    assert all(high < p <= 65535 for p in ports)
    usual = {free_port_range(1) for _ in range(50)}
    assert all(p < low for p in usual)
