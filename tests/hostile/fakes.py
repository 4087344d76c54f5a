"""The attacker's tools for the hostile-peer suite: raw HTTP requests (plaintext or
TLS, with any certificate), raw RPC frames, a fake peer that answers as a "leader" would, and
the end-of-test check that a node is serving with its committed data and voter set intact."""

from __future__ import annotations

import http.client
import json
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psutil

from quorum.core import messages as m
from quorum.localports import free_ports
from quorum.runtime import wire
from quorum.types import ErrorCode, OffsetAndEpoch
from testkit.polling import wait_until

# The node's own (KRaft's) election and fetch timeouts for the hostile clusters, not the shorter
# ones of the other process tests: the attacks, the 4 MiB flood above all, load the 2-core test
# machine while the leader must keep its leadership.
NODE_DEFAULT_TIMEOUTS = {"raft": {"election_timeout_ms": 1000, "fetch_timeout_ms": 2000}}


def request(
    endpoint: str,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    ctx: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    timeout: float = 30,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One HTTP request on a fresh connection; (status, JSON body or raw bytes)."""
    host, _, port = endpoint.rpartition(":")
    conn: http.client.HTTPConnection
    if ctx is None:
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    else:
        conn = _HostnameHTTPS(host, int(port), timeout=timeout, context=ctx, sni=server_hostname)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        r = conn.getresponse()
        raw = r.read()
        if r.getheader("Content-Type", "").startswith("application/json"):
            return r.status, json.loads(raw)
        return r.status, raw
    finally:
        conn.close()


class _HostnameHTTPS(http.client.HTTPSConnection):
    """HTTPS to 127.0.0.1 checking the certificate against another name (a node's peer name)."""

    def __init__(
        self, host: str, port: int, *, timeout: float, context: ssl.SSLContext, sni: str | None
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._sni = sni or host
        self._ctx = context

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._ctx.wrap_socket(sock, server_hostname=self._sni)


def hold_large_bodies(
    endpoint: str,
    pid: int,
    *,
    ctx: ssl.SSLContext | None = None,
    headers: str = "",
    connections: int = 100,
    size: int = 4 * 1024 * 1024,
) -> tuple[list[socket.socket], int]:
    """Open ``connections`` connections (TLS with ``ctx``) to ``endpoint``, each sending a PUT
    with a ``size``-byte body but its last byte, until the node stops taking bytes; returns the
    sockets (still open: the caller checks the node serves meanwhile, then closes them) and how
    far process ``pid``'s RSS grew at its peak, in bytes."""
    proc = psutil.Process(pid)
    base = peak = proc.memory_info().rss
    host, _, port = endpoint.rpartition(":")
    chunk = b"z" * (256 * 1024)
    socks: list[tuple[socket.socket, int]] = []
    for i in range(connections):
        s = socket.create_connection((host, int(port)), timeout=10)
        if ctx is not None:
            s = ctx.wrap_socket(s, server_hostname=host)
        s.sendall(
            f"PUT /v1/kv/big-{i} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {size}\r\n\r\n".encode()
        )
        s.setblocking(False)
        socks.append((s, 0))
    idle_rounds = 0
    while idle_rounds < 20:  # until the node stops taking bytes (or all are sent)
        progressed = False
        for n, (s, sent) in enumerate(socks):
            want = min(len(chunk), size - 1 - sent)
            if want <= 0:
                continue
            try:
                k = s.send(chunk[:want])
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError, OSError):
                continue  # (an SSL write that would block is retried with the same bytes)
            socks[n] = (s, sent + k)
            progressed = progressed or k > 0
        peak = max(peak, proc.memory_info().rss)
        idle_rounds = 0 if progressed else idle_rounds + 1
        if not progressed:
            select.select([], [s for s, _ in socks], [], 0.05)
    peak = max(peak, proc.memory_info().rss)
    return [s for s, _ in socks], peak - base


class Prober:
    """A thread sending one request after another to ``endpoint`` (a fresh connection each, as
    a new client would) and noting when each was sent and what status came back; used to show
    a node answers while a flood is under way."""

    def __init__(
        self,
        endpoint: str,
        path: str,
        *,
        ctx: ssl.SSLContext | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.endpoint, self.path, self.ctx, self.headers = endpoint, path, ctx, headers
        self.answers: list[tuple[float, int]] = []  # (monotonic time sent, status)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                status, _ = request(self.endpoint, "GET", self.path, ctx=self.ctx, headers=self.headers)
            except OSError:
                status = 0
            self.answers.append((sent, status))
            self._stop.wait(0.1)  # pace: each probe is a TLS handshake for the flooded node

    def answered_since(self, t: float, status: int = 200) -> bool:
        """A request sent at or after ``t`` was answered with ``status``."""
        return any(sent >= t and st == status for sent, st in self.answers)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def buffered_body_bytes(endpoint: str, ctx: ssl.SSLContext | None = None) -> int:
    """The node's ``kraftkeeper_http_buffered_body_bytes`` gauge (request bodies being read)."""
    status, raw = request(endpoint, "GET", "/metrics", ctx=ctx)
    assert status == 200
    for line in raw.decode().splitlines():
        if line.startswith("kraftkeeper_http_buffered_body_bytes "):
            return int(float(line.split()[1]))
    raise AssertionError("no kraftkeeper_http_buffered_body_bytes in /metrics")


def http_metrics(endpoint: str, ctx: ssl.SSLContext | None = None) -> dict[str, float]:
    """The node's ``kraftkeeper_http_*`` metrics (its server limits and event-loop lag), by name
    without the prefix."""
    status, raw = request(endpoint, "GET", "/metrics", ctx=ctx)
    assert status == 200
    out: dict[str, float] = {}
    for line in raw.decode().splitlines():
        if line.startswith("kraftkeeper_http_"):
            name, value = line.split()
            out[name.removeprefix("kraftkeeper_http_")] = float(value)
    return out


def assert_kept_leadership(
    before: dict[str, Any], after: dict[str, Any], loop_before: dict[str, float], loop_after: dict[str, float]
) -> None:
    """The leader of ``before`` still leads in the same epoch; if not, the message carries the
    leader's event-loop measurements over the attack (a long wait for a CPU points at an
    overloaded machine, a long busy turn at the server)."""
    assert (after["leader_id"], after["leader_epoch"]) == (before["leader_id"], before["leader_epoch"]), (
        f"leadership moved from {before['leader_id']} (epoch {before['leader_epoch']}) to "
        f"{after['leader_id']} (epoch {after['leader_epoch']}); the old leader's loop: longest "
        f"lag {loop_after['loop_lag_max_ms']:.0f} ms, most CPU between two checks "
        f"{loop_after['loop_busy_max_ms']:.0f} ms, waited "
        f"{loop_after['loop_cpu_wait_ms_total'] - loop_before['loop_cpu_wait_ms_total']:.0f} ms "
        f"for a CPU during the attack"
    )


OPEN_PATHS = ("/healthz", "/readyz", "/metrics")
UUID_SHAPE = re.compile(r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}")


def assert_open_endpoints_reveal_no_uuid(
    endpoint: str, uuids: set[str], ctx: ssl.SSLContext | None = None
) -> None:
    """``/healthz``, ``/readyz`` and ``/metrics``, read without credentials, name no storage
    UUID (a voter's UUID is what a forged plaintext Fetch ack needs) and nothing
    shaped like one."""
    assert uuids
    for path in OPEN_PATHS:
        status, body = request(endpoint, "GET", path, ctx=ctx)
        assert status in (200, 503), (path, status)
        text = body.decode(errors="replace") if isinstance(body, bytes) else json.dumps(body)
        assert text, path
        for u in uuids:
            assert u not in text and u.replace("-", "") not in text, (path, u)
        assert not UUID_SHAPE.search(text), (path, UUID_SHAPE.search(text))


def rpc(endpoint: str, msg: Any, **kw: Any) -> tuple[int, Any]:
    """POST a raft RPC message (any dataclass of quorum.core.messages) as its wire frame."""
    return request(endpoint, "POST", f"/raft/v1/{m.RPC_PATHS[type(msg)]}", wire.encode(msg), **kw)


def frame(header: bytes) -> bytes:
    """A raw RPC frame around an arbitrary header (the Fetch header framing)."""
    return len(header).to_bytes(4, "little") + header


def fetch_header(cluster_id: str, replica: int, epoch: int) -> dict[str, Any]:
    body = wire.encode(m.FetchRequest(1, cluster_id, replica, None, epoch, 0, 0, 0, 1024))
    return dict(json.loads(wire.split_frame("fetch", body)[0]))


@dataclass
class Snapshot:
    """What must survive every attack: leader, epoch, voter set and committed keys."""

    leader: int
    epoch: int
    voters: list[tuple[int, str | None]]
    keys: dict[str, bytes] = field(default_factory=dict)


@dataclass
class FakeLeader:
    """A fake peer that answers every RPC as the leader of epoch 1000 would, naming a snapshot
    of its own (the attack: followers that believed it installed the snapshot)."""

    cluster_id: str
    hits: list[str] = field(default_factory=list)
    endpoint: str = ""
    _server: ThreadingHTTPServer | None = None

    @contextmanager
    def running(self) -> Iterator[FakeLeader]:
        fake = self
        port = free_ports(1)[0]
        self.endpoint = f"127.0.0.1:{port}"

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                fake.hits.append(self.path)
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path.endswith("/fetch_snapshot"):
                    out = m.FetchSnapshotResponse(
                        1, ErrorCode.NONE, 99, 1000, OffsetAndEpoch(10**6, 1000), 5, 0, b"evil!"
                    )
                else:
                    out = m.FetchResponse(
                        1, ErrorCode.NONE, 99, 1000, 10**6, 10**6, b"", None, OffsetAndEpoch(10**6, 1000)
                    )
                data = wire.encode(out)
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), H)
        t = threading.Thread(target=self._server.serve_forever, daemon=True)
        t.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            t.join(10)


def voters(d: dict[str, Any]) -> list[tuple[int, str]]:
    """The (id, UUID) pairs of a describe's voter set."""
    return [(v["id"], v["uuid"]) for v in d["voters"]]


def assert_intact(
    before: dict[str, Any],
    after: dict[str, Any],
    endpoints: list[str],
    keys: dict[str, bytes],
    read: Callable[[str], bytes | None],
    write: Callable[[str, bytes], int],
    *,
    same_leader: bool = True,
    ctx: ssl.SSLContext | None = None,
) -> None:
    """The end state every attack must leave (``before``/``after``: the leader's describe):
    every node serving, the committed ``keys`` intact, a new write accepted, the voter set
    unchanged and, with ``same_leader``, the same leader in the same epoch."""
    assert voters(after) == voters(before)
    if same_leader:
        assert (after["leader_id"], after["leader_epoch"]) == (before["leader_id"], before["leader_epoch"])
    for ep in endpoints:  # polled: a node the test restarted may still be starting
        wait_until(
            f"{ep} serving /healthz",
            lambda ep=ep: request(ep, "GET", "/healthz", ctx=ctx)[0] == 200,
            60,
            errors=(Exception,),
        )
    for k, v in keys.items():
        assert read(k) == v, k
    assert write("after-attack", b"ok") >= 0


def wait_stable(describe: Any, timeout: float = 60) -> dict[str, Any]:
    """The leader's describe once a leader with a committed high watermark is known."""

    def find() -> dict[str, Any] | None:
        d: dict[str, Any] = describe()
        return d if d.get("leader_id", -1) >= 0 and d.get("high_watermark", 0) > 0 else None

    return dict(wait_until("a stable leader", find, timeout, errors=(Exception,)))
