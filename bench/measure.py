"""The measurements of ``bench/engine.py``: runs the load generators of ``bench/common.py``
against a started cluster (``bench/clusters.py``) and returns its :class:`bench.results.Row`.

* :func:`measure`: a warm-up, then one closed-loop run per client count against the leader
  (once more after a leader change), then the open-loop run at half of the measured peak;
* :func:`measure_pair`: a kraftkeeper row and its ``--baseline`` twin, rounds interleaved
  (``bench/baseline.py``);
* :func:`measure_ceiling`: the generators against an aiohttp no-op server, plaintext and over
  mutual TLS: what they can drive at most on this machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.baseline import Pair, median_run, round_order
from bench.clusters import START_TIMEOUT, Cluster, KraftKeeperCluster, make_pki, probe_path
from bench.common import NOT_YET, http_call
from bench.load import LoadResult, run_asyncio_load, run_load, value_bytes
from bench.procs import ProcessSet
from bench.results import Row
from quorum.localports import free_ports
from testkit.polling import wait_until


def measure(
    cluster: Cluster,
    size: int,
    clients: list[int],
    duration: float,
    generator: str,
    half_load: bool,
    log: Any,
) -> Row:
    row = Row(cluster.label, cluster.family, size, tls=cluster.tls is not None)
    tls = cluster.tls
    leader = cluster.leader()
    # Warm-up: connections, JIT-free but cache- and page-cache-warm paths, first log segment.
    run_load(leader, cluster.kind, size, max(clients), min(2.0, duration), generator, tls)
    for c in clients:
        leader = cluster.leader()
        res = run_load(leader, cluster.kind, size, c, duration, generator, tls)
        if res.ok == 0 or res.errors * 20 > res.ok:
            # A leader change during the run: find the new leader and measure once more.
            leader = cluster.leader()
            res = run_load(leader, cluster.kind, size, c, duration, generator, tls)
        row.runs[c] = res
        if res.errors * 20 > res.ok:
            # wrk counts non-2xx answers without keeping them: record one answer so the output
            # says what the errors were (421 from a moved leader, 503 from a timed-out commit...).
            row.notes.append(
                f"{c} clients: {res.errors} errors; a write now gets {_sample_answer(cluster, size)}"
            )
        log(
            f"  {cluster.label:21} {size:>5} B {c:>4} clients: {res.writes_per_s:9.0f} w/s "
            f"p50 {res.p50_ms:7.2f} ms p99 {res.p99_ms:7.2f} ms errors {res.errors}"
        )
    if half_load and row.runs:
        peak = max(row.runs.values(), key=lambda r: r.writes_per_s)
        if peak.writes_per_s > 0:
            leader = cluster.leader()
            row.half = run_asyncio_load(
                leader, cluster.kind, size, peak.clients, duration, rate=peak.writes_per_s / 2, tls=tls
            )
            log(
                f"  {cluster.label:21} {size:>5} B half of peak ({peak.writes_per_s / 2:.0f}/s offered, "
                f"{peak.clients} conns): p99 {row.half.p99_ms:.2f} ms"
            )
    return row


def measure_pair(
    pair: tuple[KraftKeeperCluster, KraftKeeperCluster],
    size: int,
    clients: list[int],
    duration: float,
    generator: str,
    rounds: int,
    log: Any,
) -> tuple[Row, Row, Pair]:
    """The current row and its ``--baseline`` twin, both clusters up, runs interleaved: each
    round runs every client count on both, alternating which goes first (A B, B A, ...), so
    load drift on a shared machine hits both alike. The table shows each side's median round;
    the ratio lines every round (bench/baseline.py)."""
    rows = (Row(pair[0].label, pair[0].family, size), Row(pair[1].label, pair[1].family, size))
    assert pair[1].baseline is not None
    out = Pair(pair[0].label, pair[1].baseline.rev, size)
    sides = (out.current, out.baseline)
    for cl in pair:  # warm-up: connections, page cache, the first log segment
        run_load(cl.leader(), cl.kind, size, max(clients), min(2.0, duration), generator, cl.tls)
    for r in range(rounds):
        for c in clients:
            for side in round_order(r):
                cl = pair[side]
                res = run_load(cl.leader(), cl.kind, size, c, duration, generator, cl.tls)
                if res.ok == 0 or res.errors * 20 > res.ok:
                    res = run_load(cl.leader(), cl.kind, size, c, duration, generator, cl.tls)
                sides[side].setdefault(c, []).append(res)
                log(
                    f"  round {r + 1}/{rounds} {cl.label:30} {size:>5} B {c:>4} clients: "
                    f"{res.writes_per_s:9.0f} w/s p50 {res.p50_ms:7.2f} ms p99 {res.p99_ms:7.2f} ms "
                    f"errors {res.errors}"
                )
    for row, side_runs in zip(rows, sides, strict=True):
        row.runs = {c: median_run(runs) for c, runs in side_runs.items()}
    return rows[0], rows[1], out


def _sample_answer(cluster: Cluster, size: int) -> str:
    try:
        ep = cluster.endpoints[0]
        if cluster.kind == "etcd":
            body = json.dumps({"key": "YmVuY2g=", "value": ""}).encode()
            status, data = http_call(ep, "POST", "/v3/kv/put", body, timeout=10, tls=cluster.tls)
        else:
            status, data = http_call(ep, "PUT", probe_path(), value_bytes(size), timeout=10, tls=cluster.tls)
    except OSError as e:
        return f"connection error {e}"
    return f"HTTP {status} {data[:160].decode(errors='replace')} from node 1"


def measure_ceiling(
    sizes: list[int], clients: int, duration: float, generator: str, work: Path, tls: bool = False
) -> dict[str, LoadResult]:
    """The generators against a trivial aiohttp handler: what they can drive at most here, and
    what an aiohttp front end costs when it does no work. With ``tls`` also over mutual TLS
    (``asyncio+tls``): if a TLS row comes close to that line, the generator limits it."""
    out: dict[str, LoadResult] = {}
    with ProcessSet(work / "noop-logs") as procs:
        port = free_ports(1)[0]
        procs.spawn("noop", [sys.executable, "-m", "bench.common", "noop-server", "--port", str(port)])
        ep = f"127.0.0.1:{port}"
        wait_until(
            "the no-op server",
            lambda: http_call(ep, "GET", "/readyz", timeout=2)[0] == 200,
            START_TIMEOUT,
            errors=NOT_YET,
        )
        size = max(sizes)
        if tls:
            out["asyncio+tls"] = _tls_ceiling(procs, work, size, clients, duration)
        out[generator] = run_load(ep, "kv", size, clients, duration, generator)
        if generator != "asyncio":
            out["asyncio"] = run_load(ep, "kv", size, clients, duration, "asyncio")
        # The open-loop generator's own latency floor: the half-of-peak p99 of a system means
        # little if it is close to this one.
        rate = min(5000.0, out["asyncio"].writes_per_s / 2)
        out["asyncio-open"] = run_asyncio_load(ep, "kv", size, clients, duration, rate=rate)
    return out


def _tls_ceiling(procs: ProcessSet, work: Path, size: int, clients: int, duration: float) -> LoadResult:
    """The asyncio generator presenting a client certificate to a no-op aiohttp server over
    TLS (server certificate and client check as the nodes', ``quorum.security.tlsctx``)."""
    files = make_pki(work / "noop-tls", "noop")
    d = work / "noop-tls"
    port = free_ports(1)[0]
    server_tls = ["--ca", files.ca, "--cert", str(d / "node-1.crt"), "--key", str(d / "node-1.key")]
    procs.spawn(
        "noop-tls",
        [sys.executable, "-m", "bench.common", "noop-server", "--port", str(port), *server_tls],
    )
    ep = f"127.0.0.1:{port}"
    wait_until(
        "the TLS no-op server",
        lambda: http_call(ep, "GET", "/readyz", timeout=2, tls=files)[0] == 200,
        START_TIMEOUT,
        errors=NOT_YET,
    )
    return run_load(ep, "kv", size, clients, duration, "asyncio", files)


def measure_floor(work: Path, n: int = 500) -> dict[str, float]:
    """The floor of one replicated write on this machine: the p50 of an ``fdatasync`` after a
    100-byte append in the bench's data directory (the disk under test), and the p50 of a
    100-byte request and answer over loopback TCP. A 1-client write needs at least one fsync
    (the leader's and a follower's can overlap, no better) and one round trip, so
    ``1 / (fsync + rtt)`` bounds the writes/s of one client."""
    import os
    import socket
    import statistics
    import threading
    import time

    work.mkdir(parents=True, exist_ok=True)
    path = work / "floor.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    syncs = []
    try:
        for _ in range(n):
            os.write(fd, b"x" * 100)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            syncs.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    srv = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(4096):
                conn.sendall(data)

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    rtts = []
    with socket.create_connection(srv.getsockname()) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            t0 = time.perf_counter()
            c.sendall(b"y" * 100)
            got = 0
            while got < 100:
                got += len(c.recv(4096))
            rtts.append(time.perf_counter() - t0)
    t.join(timeout=5)
    srv.close()
    fsync_ms = statistics.median(syncs) * 1000
    rtt_ms = statistics.median(rtts) * 1000
    return {
        "fdatasync_p50_ms": fsync_ms,
        "loopback_rtt_p50_ms": rtt_ms,
        "writes_per_s": 1000 / (fsync_ms + rtt_ms),
    }
