"""Side-by-side write benchmark: KRaftKeeper against etcd and PySyncObj on one machine.

Every system runs as a 3-node cluster on loopback and takes the same work from the same load
generator in the same invocation: committed writes per second and p50/p99 commit latency for
each value size and each number of concurrent clients (each client is one keep-alive HTTP/1.1
connection), plus the p99 of an open-loop run at half of the system's measured peak.

Systems (rows of the output):

* ``kraftkeeper fsync`` / ``kraftkeeper nofsync``: ``kraftkeeper start`` x3, writes are
  ``PUT /v1/kv/{key}`` to the leader (interfaces.md); fsync is toggled through the config knob
  ``bench.common.FSYNC_CONFIG_KEY``.
* ``kraftkeeper fsync+tls``: the same with ``--tls-dir`` (issue 8): mutual TLS between the
  nodes, and every write over HTTPS with a ``readwrite`` client certificate.
* ``etcd``: Debian's ``etcd`` (3.4) x3, writes through its grpc-gateway ``POST /v3/kv/put``
  (base64 key and value in JSON); etcd always fsyncs its WAL before acknowledging.
* ``etcd tls``: the same with client and peer TLS and certificate checks on both
  (``--client-cert-auth``, ``--peer-client-cert-auth``); certificates from ``quorum.security.pki``
  (ECDSA P-256, as KRaftKeeper's), writes over HTTPS with a client certificate.

TLS rows need a generator that presents a client certificate: the asyncio one. When any TLS row
is requested and ``--generator auto``, every row uses it, so the cost of TLS printed at the end
compares like with like.
* ``pysyncobj batch`` / ``pysyncobj nobatch``: PySyncObj (a Python Raft library) x3, each node a
  process with an in-memory dict, no journal file (so no fsync), with the library's default
  ``appendEntriesUseBatch=True`` and with ``appendEntriesUseBatch=False``. A tiny aiohttp front
  end per node (``pysyncobj-node`` below) turns ``PUT /v1/kv/{key}`` into a replicated call and
  answers once PySyncObj reports it committed, 421 + ``leader_endpoint`` on a follower, like
  KRaftKeeper. The front end is the same aiohttp stack KRaftKeeper's server uses; its own cost
  is the "aiohttp no-op" ceiling printed at the top (a handler that answers at once).

Run ``python -m bench.engine --help``; ``bench/README.md`` explains the columns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from bench.baseline import (
    BaselineTree,
    Pair,
    export_tree,
    median_run,
    missing_start_flags,
    ratio_lines,
    round_order,
)
from bench.common import (
    LoadResult,
    ProcessSet,
    TlsFiles,
    find_leader_by_421,
    free_ports,
    have_wrk,
    http_call,
    kraftkeeper_command,
    kraftkeeper_config,
    run_asyncio_load,
    run_load,
    sigterm_as_interrupt,
    use_uvloop,
    value_bytes,
    wait_until,
)
from quorum.security.pki import init_ca, issue_client, issue_node

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


def _probe_path() -> str:
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
        # --baseline REV: the same row run by REV's exported tree (bench/baseline.py).
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
            self.tls = _make_pki(self.work / "tls", self.cluster_id)
        for i in range(1, 4):
            self.format_node(i)
            self.start_node(i)
        for i, ep in enumerate(self.endpoints, start=1):
            wait_until(partial(self._ready, i, ep), START_TIMEOUT, f"kraftkeeper node {i} /readyz")

    def format_node(self, i: int) -> str:
        """``kraftkeeper format`` node ``i``'s directory; returns the new storage UUID (the last
        line of stdout, interfaces.md)."""
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
        return find_leader_by_421(self.endpoints, _probe_path(), b"probe", START_TIMEOUT, tls=self.tls)

    def stop(self) -> None:
        self.procs.close()


def _make_pki(directory: Path, cluster_id: str) -> TlsFiles:
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
            self.tls = _make_pki(self.work / "tls", "etcd-bench")
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

        return wait_until(find, START_TIMEOUT, "an etcd leader", interval=0.1)

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
            wait_until(partial(self._ready, i, ep), START_TIMEOUT, f"pysyncobj node {i} /readyz")

    def _ready(self, i: int, ep: str) -> bool:
        self.procs.check_alive(f"pso-{i}")
        return http_call(ep, "GET", "/readyz", timeout=2)[0] == 200

    def leader(self) -> str:
        return find_leader_by_421(self.endpoints, _probe_path(), b"probe", START_TIMEOUT)

    def stop(self) -> None:
        self.procs.close()


def pysyncobj_node(argv: Sequence[str]) -> int:
    """One PySyncObj node plus its HTTP front end (runs in its own process)."""
    from aiohttp import web
    from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated  # type: ignore[import-untyped]

    ap = argparse.ArgumentParser(prog="python -m bench.engine pysyncobj-node")
    ap.add_argument("--index", type=int, required=True)
    ap.add_argument("--raft-ports", required=True)
    ap.add_argument("--http-ports", required=True)
    ap.add_argument("--no-batch", action="store_true")
    a = ap.parse_args(argv)
    raft = [f"127.0.0.1:{p}" for p in a.raft_ports.split(",")]
    http = [f"127.0.0.1:{p}" for p in a.http_ports.split(",")]
    http_of = dict(zip(raft, http, strict=True))

    class KV(SyncObj):  # type: ignore[misc]
        def __init__(self) -> None:
            conf = SyncObjConf(appendEntriesUseBatch=not a.no_batch)
            super().__init__(raft[a.index], [r for r in raft if r != raft[a.index]], conf)
            self.data: dict[str, bytes] = {}

        @replicated  # type: ignore[untyped-decorator]
        def put(self, key: str, value: bytes) -> int:
            self.data[key] = value
            return len(self.data)

    kv = KV()

    def leader_addr() -> str | None:
        leader = kv._getLeader()
        if leader is None:
            return None
        return str(getattr(leader, "address", leader))

    async def readyz(request: web.Request) -> web.Response:
        return web.Response(status=200 if leader_addr() else 503, text="ok" if leader_addr() else "no leader")

    async def put(request: web.Request) -> web.Response:
        body = await request.read()
        if not kv._isLeader():
            lead = leader_addr()
            return web.json_response(
                {"error_code": "NOT_LEADER", "leader_endpoint": http_of.get(lead or "")}, status=421
            )
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[Any, Any]] = loop.create_future()

        def settle(result: Any, err: Any) -> None:
            if not fut.done():
                fut.set_result((result, err))

        def done(result: Any, err: Any) -> None:  # called on PySyncObj's own thread
            loop.call_soon_threadsafe(settle, result, err)

        kv.put(request.match_info["key"], body, callback=done)
        result, err = await fut
        if err != FAIL_REASON.SUCCESS:
            return web.json_response(
                {"error_code": "UNAVAILABLE", "message": f"pysyncobj: {err}"}, status=503
            )
        return web.json_response({"offset": result})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/readyz", readyz)
    app.router.add_put("/v1/kv/{key}", put)
    host, _, port = http[a.index].rpartition(":")
    use_uvloop()
    web.run_app(app, host=host, port=int(port), print=None, access_log=None)
    return 0


# ---------------------------------------------------------------------------------------------


@dataclass
class Row:
    label: str
    family: str
    size: int
    tls: bool = False
    runs: dict[int, LoadResult] = field(default_factory=dict)
    half: LoadResult | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def _measure(
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


def _measure_pair(
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
            status, data = http_call(ep, "PUT", _probe_path(), value_bytes(size), timeout=10, tls=cluster.tls)
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
            lambda: http_call(ep, "GET", "/readyz", timeout=2)[0] == 200, START_TIMEOUT, "the no-op server"
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
    files = _make_pki(work / "noop-tls", "noop")
    d = work / "noop-tls"
    port = free_ports(1)[0]
    server_tls = ["--ca", files.ca, "--cert", str(d / "node-1.crt"), "--key", str(d / "node-1.key")]
    procs.spawn(
        "noop-tls",
        [sys.executable, "-m", "bench.common", "noop-server", "--port", str(port), *server_tls],
    )
    ep = f"127.0.0.1:{port}"
    wait_until(
        lambda: http_call(ep, "GET", "/readyz", timeout=2, tls=files)[0] == 200,
        START_TIMEOUT,
        "the TLS no-op server",
    )
    return run_load(ep, "kv", size, clients, duration, "asyncio", files)


def _fmt_ratio(a: float, b: float | None) -> str:
    return f"{a / b:5.2f}x" if b else "    - "


def render(rows: list[Row], clients: list[int], sizes: list[int]) -> str:
    lines: list[str] = []
    w = max([21, *(len(r.label) for r in rows)])  # --baseline labels are longer
    for size in sizes:
        srows = [r for r in rows if r.size == size]
        if not srows:
            continue
        lines.append("")
        lines.append(
            f"== value size {size} B: committed writes/s, p50/p99 commit latency (ms), "
            f"ratio of writes/s vs etcd and vs best PySyncObj =="
        )
        head = f"{'system':{w}} |" + "|".join(f"{f'{c} clients':^40}" for c in clients) + "| p99 @50% peak"
        sub = f"{'':{w}} |" + "|".join(
            f"{'w/s':>8} {'p50':>6} {'p99':>7} {'vsEtcd':>7} {'vsPSO':>7} " for _ in clients
        )
        lines += [head, sub, "-" * len(head)]
        for r in srows:
            cells = []
            for c in clients:
                res = r.runs.get(c)
                if res is None:
                    cells.append(f"{'n/a':>40}")
                    continue
                # TLS rows against etcd with TLS, plaintext rows against plaintext etcd
                etcd = next(
                    (
                        x.runs[c].writes_per_s
                        for x in srows
                        if x.family == "etcd" and x.tls == r.tls and c in x.runs
                    ),
                    None,
                )
                pso = max(
                    (x.runs[c].writes_per_s for x in srows if x.family == "pysyncobj" and c in x.runs),
                    default=None,
                )
                cells.append(
                    f"{res.writes_per_s:8.0f} {res.p50_ms:6.2f} {res.p99_ms:7.2f} "
                    f"{_fmt_ratio(res.writes_per_s, etcd):>7} {_fmt_ratio(res.writes_per_s, pso):>7} "
                )
            half = "n/a"
            if r.half is not None:
                achieved = r.half.ok / r.half.duration_s
                half = f"{r.half.p99_ms:.2f} ms at {achieved:.0f}/s"
                if r.half.send_lag_p99_ms is not None:
                    half += f" (send lag p99 {r.half.send_lag_p99_ms:.1f} ms)"
                if r.half.target_rate and achieved < 0.9 * r.half.target_rate:
                    half += " (below offered)"
            line = f"{r.label:{w}} |" + "|".join(cells) + f"| {half}"
            if r.error:
                line = f"{r.label:{w}} | FAILED: {r.error}"
            lines.append(line)
        errs = [
            f"{r.label} {c} clients: {res.errors}" for r in srows for c, res in r.runs.items() if res.errors
        ]
        errs += [f"{r.label} @50%: {r.half.errors}" for r in srows if r.half is not None and r.half.errors]
        if errs:
            lines.append("non-2xx answers or connection errors (not counted as writes): " + "; ".join(errs))
        lines += [f"note: {r.label}: {n}" for r in srows for n in r.notes]
        lines += _tls_cost(srows, clients)
    return "\n".join(lines)


def _tls_cost(srows: list[Row], clients: list[int]) -> list[str]:
    """What TLS costs each system (writes/s and p99 against its plaintext row), and KRaftKeeper
    with TLS against etcd with TLS at the largest client count (issue 8)."""
    by_label = {r.label: r for r in srows if not r.error}
    pairs = [("kraftkeeper fsync+tls", "kraftkeeper fsync"), ("etcd tls", "etcd")]
    out: list[str] = []
    for tls_label, plain_label in pairs:
        t, p = by_label.get(tls_label), by_label.get(plain_label)
        if t is None or p is None:
            continue
        cells = []
        for c in clients:
            if c in t.runs and c in p.runs and p.runs[c].writes_per_s > 0:
                tr, pr = t.runs[c], p.runs[c]
                cells.append(
                    f"{c} clients {100 * (tr.writes_per_s / pr.writes_per_s - 1):+.0f}% w/s "
                    f"(p99 {pr.p99_ms:.2f} -> {tr.p99_ms:.2f} ms)"
                )
        if cells:
            out.append(f"cost of TLS, {tls_label} vs {plain_label}: " + "; ".join(cells))
    kk, et = by_label.get("kraftkeeper fsync+tls"), by_label.get("etcd tls")
    top = max(clients)
    if kk is not None and et is not None and top in kk.runs and top in et.runs and et.runs[top].writes_per_s:
        ratio = kk.runs[top].writes_per_s / et.runs[top].writes_per_s
        out.append(
            f"kraftkeeper fsync+tls vs etcd tls at {top} clients: {ratio:.2f}x writes/s "
            f"({kk.runs[top].writes_per_s:.0f} vs {et.runs[top].writes_per_s:.0f})"
        )
    return out


def parse_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{what}: expected positive integers, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Every process was stopped by the `finally` blocks on the way here.
        print("interrupted: all benchmark processes stopped", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["pysyncobj-node"]:
        return pysyncobj_node(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short runs, one value size (smoke test)")
    ap.add_argument("--duration", type=float, default=None, help="seconds per run (default 10, --quick 2)")
    ap.add_argument("--clients", type=lambda s: parse_list(s, "--clients"), default=[1, 16, 128])
    ap.add_argument(
        "--sizes",
        type=lambda s: parse_list(s, "--sizes"),
        default=None,
        help="value sizes in bytes (default 100,1024; --quick 100)",
    )
    ap.add_argument(
        "--peers",
        default="etcd,etcd-tls,pysyncobj",
        help="comma-separated peers from etcd,etcd-tls,pysyncobj; 'none' for kraftkeeper alone",
    )
    ap.add_argument(
        "--kraftkeeper",
        default="fsync,nofsync,fsync+tls",
        help="kraftkeeper configs from fsync,nofsync,fsync+tls; 'none' to run the peers alone",
    )
    ap.add_argument(
        "--generator",
        choices=["auto", "wrk", "asyncio"],
        default="auto",
        help="closed-loop generator (auto: wrk if installed)",
    )
    ap.add_argument("--no-half-load", action="store_true", help="skip the open-loop run at half of peak")
    ap.add_argument(
        "--workdir", type=Path, default=None, help="where data dirs and logs go (default: a temp dir)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--json", type=Path, default=None, help="also write all results as JSON here")
    ap.add_argument(
        "--baseline",
        metavar="REV",
        default=None,
        help="also run each kraftkeeper row with git revision REV's code, interleaved with the "
        "current code in this invocation, and print the ratio now/REV (no half-load runs for them)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="with --baseline: interleaved rounds per client count (default 3, --quick 1)",
    )
    a = ap.parse_args(argv)
    duration = a.duration if a.duration is not None else (2.0 if a.quick else 10.0)
    sizes = a.sizes or ([100] if a.quick else [100, 1024])
    if duration <= 0:
        ap.error("--duration must be > 0")
    peers = [] if a.peers == "none" else [p.strip() for p in a.peers.split(",") if p.strip()]
    kk = [] if a.kraftkeeper == "none" else [p.strip() for p in a.kraftkeeper.split(",") if p.strip()]
    bad = [p for p in peers if p not in ("etcd", "etcd-tls", "pysyncobj")] + [
        k for k in kk if k not in ("fsync", "nofsync", "fsync+tls")
    ]
    if bad:
        ap.error(
            f"unknown system(s) {', '.join(bad)}: "
            "--peers takes etcd,etcd-tls,pysyncobj and --kraftkeeper fsync,nofsync,fsync+tls"
        )
    any_tls = "etcd-tls" in peers or "fsync+tls" in kk
    generator = a.generator
    if generator == "auto":
        # TLS rows need client certificates, which only the asyncio generator presents; every
        # row then uses it so the cost of TLS compares like with like.
        generator = "wrk" if have_wrk() and not any_tls else "asyncio"
    if generator == "wrk" and not have_wrk():
        ap.error("--generator wrk: wrk is not installed (scripts/install-bench.sh install)")
    if generator == "wrk" and any_tls:
        ap.error("--generator wrk cannot present client certificates: leave out the TLS rows or use asyncio")
    if {"etcd", "etcd-tls"} & set(peers) and shutil.which("etcd") is None:
        ap.error("--peers etcd: etcd is not installed (scripts/install-bench.sh install), or leave it out")

    rounds = a.rounds if a.rounds is not None else (1 if a.quick else 3)
    if rounds <= 0:
        ap.error("--rounds must be > 0")
    if a.rounds is not None and a.baseline is None:
        ap.error("--rounds applies to --baseline only")
    if a.baseline is not None and not kk:
        ap.error("--baseline needs at least one --kraftkeeper row to compare")

    work = a.workdir or Path(tempfile.mkdtemp(prefix="kk-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    tree: BaselineTree | None = None
    if a.baseline is not None:
        try:
            tree = export_tree(a.baseline, work)
            missing = missing_start_flags(tree, ["--tls-dir"] if "fsync+tls" in kk else [])
        except ValueError as e:
            if a.workdir is None:
                shutil.rmtree(work, ignore_errors=True)
            ap.error(str(e))
        if missing:
            if a.workdir is None:
                shutil.rmtree(work, ignore_errors=True)
            ap.error(
                f"--baseline {a.baseline}: its `kraftkeeper start` has no {', '.join(missing)}: "
                "leave the fsync+tls row out"
            )

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    clusters: list[Cluster | tuple[KraftKeeperCluster, KraftKeeperCluster]] = []
    for k in kk:
        cur = KraftKeeperCluster(work, fsync=k.startswith("fsync"), tls=k.endswith("+tls"))
        if tree is None:
            clusters.append(cur)
        else:
            fsync, tls = k.startswith("fsync"), k.endswith("+tls")
            clusters.append((cur, KraftKeeperCluster(work, fsync=fsync, tls=tls, baseline=tree)))
    if "etcd" in peers:
        clusters.append(EtcdCluster(work))
    if "etcd-tls" in peers:
        clusters.append(EtcdCluster(work, tls=True))
    if "pysyncobj" in peers:
        clusters += [PySyncObjCluster(work, batch=True), PySyncObjCluster(work, batch=False)]

    rows: list[Row] = []
    pairs: list[Pair] = []
    ceiling: dict[str, LoadResult] = {}
    try:
        with sigterm_as_interrupt():
            log(f"work dir {work}; generator {generator}; {duration:g}s per run; machine: {_machine()}")
            # The ceiling needs no long runs: it is a sanity line, not a result.
            ceiling = measure_ceiling(sizes, max(a.clients), min(duration, 5.0), generator, work, tls=any_tls)
            for name, res in ceiling.items():
                log(
                    f"  generator ceiling ({name} -> aiohttp no-op, {res.clients} conns): "
                    f"{res.writes_per_s:.0f} req/s"
                )
            for item in clusters:
                group: tuple[Cluster, ...] = item if isinstance(item, tuple) else (item,)
                try:
                    for cl in group:
                        log(f"starting {cl.label}")
                        cl.start()
                    for size in sizes:
                        if isinstance(item, tuple):
                            cur_row, base_row, pair = _measure_pair(
                                item, size, a.clients, duration, generator, rounds, log
                            )
                            rows += [cur_row, base_row]
                            pairs.append(pair)
                        else:
                            rows.append(
                                _measure(item, size, a.clients, duration, generator, not a.no_half_load, log)
                            )
                except (RuntimeError, TimeoutError, OSError) as e:
                    log(f"  {' / '.join(cl.label for cl in group)} FAILED: {e}")
                    for cl in group:
                        for size in sizes:
                            if not any(r.label == cl.label and r.size == size for r in rows):
                                rows.append(Row(cl.label, cl.family, size, error=str(e).splitlines()[0]))
                finally:
                    for cl in group:
                        cl.stop()
    finally:
        for item in clusters:
            for cl in item if isinstance(item, tuple) else (item,):
                cl.stop()
        if not a.keep and a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)

    print(f"machine: {_machine()}; generator: {generator}; {duration:g}s per run")
    for name, res in ceiling.items():
        print(
            f"generator ceiling: {name} against an aiohttp no-op handler ({res.clients} conns, "
            f"{max(sizes)} B bodies): {res.writes_per_s:.0f} req/s"
            + (f" (offered {res.target_rate:.0f}/s)" if res.target_rate else "")
            + f", p50 {res.p50_ms:.2f} ms, p99 {res.p99_ms:.2f} ms"
            + (f", send lag p99 {res.send_lag_p99_ms:.2f} ms" if res.send_lag_p99_ms is not None else "")
        )
    print(render(rows, a.clients, sizes))
    for line in ratio_lines(pairs, a.clients):
        print(line)
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "generator": generator,
                    "duration_s": duration,
                    "clients": a.clients,
                    "sizes": sizes,
                    "ceiling": {k: v.to_json() for k, v in ceiling.items()},
                    "rows": [
                        {
                            "system": r.label,
                            "family": r.family,
                            "size": r.size,
                            "error": r.error,
                            "notes": r.notes,
                            "runs": {str(c): res.to_json() for c, res in r.runs.items()},
                            "half_load": r.half.to_json() if r.half else None,
                        }
                        for r in rows
                    ],
                    "baseline": [
                        {
                            "system": p.label,
                            "rev": p.rev,
                            "size": p.size,
                            "rounds": {
                                str(c): {
                                    "now": [x.to_json() for x in p.current.get(c, [])],
                                    "baseline": [x.to_json() for x in p.baseline.get(c, [])],
                                    "ratios": p.ratios(c),
                                }
                                for c in a.clients
                            },
                        }
                        for p in pairs
                    ],
                },
                indent=2,
            )
        )
    return 1 if any(r.error for r in rows) else 0


def _machine() -> str:
    import os
    import platform

    # The load average tells the reader whether other work shared the cores during the runs.
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    py = platform.python_version()
    return f"{platform.machine()} {os.cpu_count()} cpus, python {py}, load average {load}"


# `value_bytes` is re-exported for the recovery benchmark's fills.
__all__ = ["Cluster", "EtcdCluster", "KraftKeeperCluster", "PySyncObjCluster", "main", "value_bytes"]

if __name__ == "__main__":
    sys.exit(main())
