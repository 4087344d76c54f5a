"""Free loopback ports for clusters started on this machine: the demo, ``operator local``, the
real Kafka controllers of ``demo --engine kafka``, the tests and the benchmarks. One allocator
for all of them.

Two rules, both from how the ports are then used:

* **Outside the kernel's ephemeral range** (``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999
  by default on Linux). Every outgoing connection takes a local port from that range and leaves it
  in TIME_WAIT for a minute after an active close; a machine that just made thousands of short
  connections has most of the range in TIME_WAIT, and a port handed out from it can also be
  taken by the next outgoing connection before the server binds it. Below the range nothing but
  listeners lives.
* **Checked the way the servers bind.** aiohttp, asyncio and the JVM bind listeners with
  ``SO_REUSEADDR``, which on Linux ignores TIME_WAIT and fails only when another socket listens
  on the port (or holds it bound without the option). A probe without ``SO_REUSEADDR`` refuses
  ports the servers would bind fine; a probe that only binds misses a listener of another
  program, so the probe binds *and* listens.

A port is free only between the probe and the server's bind; callers that start a server on it
at once (as all of ours do) are safe in practice, and concurrent callers rarely meet because the
first candidate is drawn at random. "Rarely" is not never: the single-node Kubernetes cluster
(``scripts/k8s-node.sh``) draws eleven ports and then starts its components one after another
over tens of seconds, while test workers beside it draw ports many times a second; once another
worker's etcd took the port drawn for the cluster's etcd, and the cluster's API server wrote into
the wrong etcd. Such long-lived, many-port users ask for ``above_ephemeral=True``: a block above
the ephemeral range, where nothing else here allocates and no outgoing connection takes a port.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["NoFreePorts", "ephemeral_range", "free_port", "free_port_range", "free_ports", "port_is_free"]

# Below this, well-known and registered services cluster; we leave them alone.
_LOWEST = 10000
_HIGHEST = 65535
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


class NoFreePorts(RuntimeError):
    """No block of free loopback ports was found (the message says where it looked)."""


def ephemeral_range(path: Path = _RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (inclusive); Linux's default when it cannot be read."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _candidate_spans(n: int) -> list[tuple[int, int]]:
    """Where a block of ``n`` ports may start: below the ephemeral range, else above it; the whole
    non-privileged range only if the ephemeral range leaves no room on either side."""
    low, high = ephemeral_range()
    spans = []
    if low - n > _LOWEST:
        spans.append((_LOWEST, low - n))
    if _HIGHEST - n > high + 1:
        spans.append((high + 1, _HIGHEST - n + 1))
    return spans or [(1024, _HIGHEST - n + 1)]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``host:port`` now, binding as aiohttp and the JVM do."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError:
            return False
    return True


def free_port_range(n: int, host: str = "127.0.0.1", *, span: tuple[int, int] | None = None) -> int:
    """A base port with ``base .. base+n-1`` all free on ``host``. ``span`` (first, last base)
    limits where to look; by default below (or above) the kernel's ephemeral range."""
    if n < 1:
        raise ValueError(f"free_port_range: n must be at least 1, not {n}")
    spans = [span] if span is not None else _candidate_spans(n)
    rng = random.Random()
    for first, last in spans:
        if last < first:
            continue
        size = last - first + 1
        # A random start, then a walk: a busy neighbourhood costs a few probes, not a failure.
        start = rng.randrange(size)
        tries = min(size, 2000)
        step = max(1, n)
        for i in range(tries):
            base = first + (start + i * step) % size
            if all(port_is_free(base + k, host) for k in range(n)):
                return base
    where = ", ".join(f"{a}..{b}" for a, b in spans)
    raise NoFreePorts(f"UNAVAILABLE: no {n} consecutive free ports on {host} (looked for a base in {where})")


def free_ports(n: int, host: str = "127.0.0.1", *, above_ephemeral: bool = False) -> list[int]:
    """``n`` distinct free ports (consecutive; callers should not rely on that). With
    ``above_ephemeral`` they come from above the kernel's ephemeral range when it leaves room
    there (module docstring), else from the usual place."""
    span = None
    if above_ephemeral:
        _low, high = ephemeral_range()
        if _HIGHEST - n + 1 >= high + 1:
            span = (high + 1, _HIGHEST - n + 1)
    try:
        base = free_port_range(n, host, span=span)
    except NoFreePorts:
        if span is None:
            raise
        base = free_port_range(n, host)
    return list(range(base, base + n))


def free_port(host: str = "127.0.0.1") -> int:
    """One free port."""
    return free_port_range(1, host)
