"""Where a 1-client write's wall time goes, hop by hop: a 3-node KRaftKeeper cluster (fsync; with
``--tls`` mutual TLS between nodes and to the client) whose nodes timestamp the points a write
passes, under the bench's closed-loop asyncio generator with one client.

The nodes run unchanged code: a ``sitecustomize`` put on their ``PYTHONPATH`` calls
:func:`install`, which wraps the functions on the write's path (``Node.put``, the driver's three
phases, ``Peers`` in and out, ``RaftCore.step``, the peer stream's frames, the client waits) to
append ``monotonic_ns tag`` lines to one file per process. CLOCK_MONOTONIC is one clock for the
whole machine, so the three nodes' lines merge into one timeline. For each write the tool follows
the leader and the follower whose acknowledging Fetch left first, and prints the median of each
hop over the run (``p50 of the hop``: medians do not add up exactly to the write's p50).

    .venv/bin/python -m bench.write_trace [--tls] [--duration 5]
"""

from __future__ import annotations

import argparse
import functools
import glob
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENV = "KK_WRITE_TRACE"
REPO = Path(__file__).resolve().parent.parent

# The critical path of one write: (role, tag) in order; L the leader, F the follower whose
# acknowledging Fetch left first.
PATH: tuple[tuple[str, str, str], ...] = (
    ("L", "put", "client PUT reaches Node.put (HTTP parsed, handler called)"),
    ("L", "begin", "the runner takes the Ready (append)"),
    ("L", "send FetchResponse", "parked Fetch answered (leader fast path)"),
    ("L", "ws_send", "answer frame written to the follower's stream"),
    ("F", "decode FetchResponse", "follower: frame read, the send task resumed, decoding"),
    ("F", "step FetchResponse", "follower: response stepped into the core"),
    ("F", "begin", "follower: the runner takes the Ready"),
    ("F", "persist", "follower: persist starts (write + fdatasync)"),
    ("F", "persisted", "follower: persist done"),
    ("F", "send FetchRequest", "follower: acknowledging Fetch handed to the transport"),
    ("F", "ws_send", "follower: Fetch frame written"),
    ("L", "ws_recv", "leader: Fetch frame parsed"),
    ("L", "inbound FetchRequest", "leader: request decoded and checked, stepping"),
    ("L", "begin", "leader: the runner takes the Ready (commit)"),
    ("L", "proposal_done", "leader: the write's waiter completed"),
    ("L", "put_done", "leader: the handler resumed, answer about to be written"),
)

_fd: int | None = None


def _t(tag: str) -> None:
    if _fd is not None:
        os.write(_fd, f"{time.monotonic_ns()} {tag}\n".encode())


def _wrap(owner: Any, name: str, before: Callable[..., str | None], after: str | None = None) -> None:
    fn = getattr(owner, name)
    if asyncio_iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*a: Any, **k: Any) -> Any:
            tag = before(*a, **k)
            if tag:
                _t(tag)
            out = await fn(*a, **k)
            if after:
                _t(after)
            return out

        setattr(owner, name, awrapper)
        return

    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        tag = before(*a, **k)
        if tag:
            _t(tag)
        out = fn(*a, **k)
        if after:
            _t(after)
        return out

    setattr(owner, name, wrapper)


def asyncio_iscoroutinefunction(fn: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)


def install() -> None:
    """In a node process (from the ``sitecustomize``): open the trace file, wrap the path."""
    global _fd
    out = os.environ.get(ENV)
    if not out:
        return
    _fd = os.open(f"{out}/t.{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    import aiohttp
    from aiohttp import web

    from quorum.core.raft import RaftCore
    from quorum.driver.driver import Driver
    from quorum.runtime import peers, peerstream, waits, wire
    from quorum.runtime.node import Node

    main = threading.get_ident()
    _wrap(Node, "put", lambda *a, **k: "put", "put_done")
    _wrap(Driver, "begin", lambda self, ready: f"begin commit={ready.commit}")
    _wrap(
        Driver,
        "persist",
        lambda self, p: "persist" + ("" if threading.get_ident() == main else " (thread)"),
        "persisted",
    )
    _wrap(peers.Peers, "send", lambda self, out: f"send {type(out.message).__name__}")
    names = {path: cls.__name__ for path, cls in wire.REQUEST_BY_PATH.items()}
    _wrap(peers.Peers, "handle_rpc", lambda self, path, *a, **k: f"inbound {names.get(path, path)}")
    _wrap(RaftCore, "step", lambda self, msg, *a, **k: f"step {type(msg).__name__}")
    _wrap(waits.ClientWaits, "proposal_done", lambda *a: "proposal_done")
    _wrap(peerstream, "parse_request", lambda *a, **k: "ws_recv")
    _wrap(wire, "decode", lambda cls, *a, **k: f"decode {cls.__name__}")
    _wrap(web.WebSocketResponse, "send_bytes", lambda *a, **k: "ws_send")
    _wrap(aiohttp.ClientWebSocketResponse, "send_bytes", lambda *a, **k: "ws_send")


Event = tuple[int, int, str]  # (ns, pid, tag)


def load(directory: Path) -> tuple[list[Event], int]:
    """Every line of every node's file, merged by time, and the leader's pid (most puts)."""
    events: list[Event] = []
    puts: dict[int, int] = {}
    for f in glob.glob(str(directory / "t.*")):
        pid = int(f.rsplit(".", 1)[1])
        with open(f) as fh:
            for line in fh:
                ns, tag = line.rstrip("\n").split(" ", 1)
                tag = tag.split(" commit=")[0]
                events.append((int(ns), pid, tag))
                puts[pid] = puts.get(pid, 0) + (tag == "put")
    events.sort()
    return events, max(puts, key=lambda p: puts[p])


def hops(events: list[Event], leader: int) -> list[list[float]]:
    """Per hop of :data:`PATH`, its duration in µs for every write followed end to end."""
    out: list[list[float]] = [[] for _ in PATH[1:]]
    starts = [i for i, (_, pid, tag) in enumerate(events) if pid == leader and tag == "put"]
    for s in starts[3:]:  # the first writes open connections
        end = next(
            (j for j in range(s, len(events)) if events[j][1] == leader and events[j][2] == "put_done"), None
        )
        if end is None:
            break
        window = events[s : end + 1]
        acks = [(ns, pid) for ns, pid, tag in window if pid != leader and tag == "send FetchRequest"]
        if not acks:
            continue
        follower = acks[0][1]
        times: list[int] = []
        k = 0
        for role, tag, _what in PATH:
            want = leader if role == "L" else follower
            while k < len(window) and not (window[k][1] == want and window[k][2].startswith(tag)):
                k += 1
            if k == len(window):
                break
            times.append(window[k][0])
        if len(times) == len(PATH):
            for h in range(len(PATH) - 1):
                out[h].append((times[h + 1] - times[h]) / 1000)
    return out


def report(events: list[Event], leader: int) -> str:
    per_hop = hops(events, leader)
    n = len(per_hop[0])
    if n == 0:
        return "no write was followed end to end"
    lines = [f"{n} writes followed; p50 per hop (µs):"]
    total = 0.0
    for h, (role, _tag, what) in enumerate(PATH[1:]):
        p50 = statistics.median(per_hop[h])
        total += p50
        lines.append(f"  {p50:8.0f}  {role}  {what}")
    lines.append(f"  {total:8.0f}     sum of the hop medians (Node.put to its return)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.write_trace", description=__doc__.split("\n")[0])
    ap.add_argument("--tls", action="store_true", help="mutual TLS between nodes and to the client")
    ap.add_argument("--duration", type=float, default=5.0)
    a = ap.parse_args(argv)
    from bench.clusters import KraftKeeperCluster
    from bench.load import run_load

    work = Path(tempfile.mkdtemp(prefix="kk-write-trace-"))
    trace = work / "trace"
    hook = work / "hook"
    trace.mkdir()
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        f"import sys\nsys.path.append({str(REPO)!r})\nfrom bench.write_trace import install\ninstall()\n"
    )
    os.environ[ENV] = str(trace)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p)
    cluster = KraftKeeperCluster(work / "cluster", fsync=True, tls=a.tls)
    try:
        cluster.start()
        result = run_load(cluster.leader(), "kv", 100, 1, a.duration, "asyncio", cluster.tls)
    finally:
        cluster.stop()
        os.environ.pop(ENV, None)
    print(f"load average {os.getloadavg()[0]:.1f}; generator: {result.ok} writes, p50 {result.p50_ms:.2f} ms")
    events, leader = load(trace)
    print(report(events, leader))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
