"""Shared plumbing of the benchmarks (``bench/engine.py``, ``bench/recovery.py``).

What lives here:

* process groups that are always cleaned up (:class:`ProcessSet`): every process the benchmarks
  start gets its own session, so a SIGTERM/SIGKILL to the group also reaches its children, and
  the set is torn down in a ``finally`` even on Ctrl-C;
* tiny synchronous HTTP helpers for the harness (leader discovery, readiness polling);
* the load generators and their result type (:class:`LoadResult`):
  - ``wrk`` (a C generator, Debian package) driven by a generated Lua script that builds PUT
    bodies with varied keys and prints its summary as one JSON line;
  - a lean asyncio generator (raw HTTP/1.1 over ``asyncio`` streams, no HTTP library on the hot
    path) run in its own process. It is the fallback when ``wrk`` is absent and the only
    open-loop (rate-limited) generator, since wrk2 is not packaged by Debian;
* a trivial HTTP server (``noop-server``) used to measure the generators' own ceiling.

Run as ``python -m bench.common load ...`` / ``python -m bench.common noop-server ...`` (the
benchmarks do that themselves).

Both target kinds send the same payload bytes per write: ``kv`` is
``PUT /v1/kv/{key}`` (docs/reference.md) with the raw value as body; ``etcd`` is etcd's
grpc-gateway ``POST /v3/kv/put`` with a JSON body whose key and value are base64, as the
gateway requires (etcd v3 API, ``KV.Put``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from testkit.polling import wait_until as poll_until

REPO_ROOT = Path(__file__).resolve().parent.parent

# The engine's config file knob that turns fsync off (docs/reference.md: fsync is on by default;
# `--config FILE` is JSON). One constant so the benchmark follows the engine if it is renamed:
# a dotted path into the JSON object.
FSYNC_CONFIG_KEY = "log.fsync"

# Keys cycle through this many distinct values per generator thread/connection, so that the
# state machines of all systems stay bounded during long runs while still seeing varied keys.
KEY_SPACE = 1_000_000

T = TypeVar("T")


def kraftkeeper_config(fsync: bool, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON config object for ``kraftkeeper start --config``, with ``FSYNC_CONFIG_KEY`` set."""
    cfg: dict[str, Any] = json.loads(json.dumps(extra or {}))
    node = cfg
    *parents, leaf = FSYNC_CONFIG_KEY.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = fsync
    return cfg


def kraftkeeper_command() -> list[str]:
    """The ``kraftkeeper`` command: the one beside this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / "kraftkeeper"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("kraftkeeper")
    if found:
        return [found]
    return [sys.executable, "-m", "quorum.cli"]




def wait_until(cond: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``cond`` until it returns something truthy (:mod:`testkit.polling`); connection and
    decoding errors count as "not yet"."""
    return poll_until(what, cond, timeout, interval, errors=(OSError, http.client.HTTPException, ValueError))


@dataclass(frozen=True)
class TlsFiles:
    """What a TLS client of a system under test presents: the CA that signed the servers and,
    for mutual TLS, a client certificate and key (PEM files)."""

    ca: str
    cert: str | None = None
    key: str | None = None

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca)
        if self.cert and self.key:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def args(self) -> list[str]:
        out = ["--ca", self.ca]
        if self.cert and self.key:
            out += ["--cert", self.cert, "--key", self.key]
        return out


def http_call(
    endpoint: str,
    method: str,
    path: str,
    body: bytes | None = None,
    timeout: float = 5.0,
    headers: dict[str, str] | None = None,
    tls: TlsFiles | None = None,
) -> tuple[int, bytes]:
    """One synchronous HTTP request to ``HOST:PORT`` (HTTPS with ``tls``); returns (status, body)."""
    host, _, port = endpoint.rpartition(":")
    conn = (
        http.client.HTTPConnection(host, int(port), timeout=timeout)
        if tls is None
        else http.client.HTTPSConnection(host, int(port), timeout=timeout, context=tls.context())
    )
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def find_leader_by_421(
    endpoints: Sequence[str], probe_path: str, probe_body: bytes, timeout: float, tls: TlsFiles | None = None
) -> str:
    """Find the leader of a cluster that answers 421 + ``leader_endpoint`` (docs/reference.md) by
    sending a real write to each node and following hints; returns the endpoint that took it."""

    def attempt() -> str | None:
        for ep in endpoints:
            target = ep
            for _ in range(4):  # follow at most a few hints; a stale hint is retried next poll
                try:
                    status, data = http_call(target, "PUT", probe_path, probe_body, tls=tls)
                except OSError:
                    break
                if status == 200:
                    return target
                if status != 421:
                    break
                hint = json.loads(data or b"{}").get("leader_endpoint")
                if not hint:
                    break
                target = str(hint)
        return None

    return wait_until(attempt, timeout, f"a leader among {', '.join(endpoints)}", interval=0.1)


# ---------------------------------------------------------------------------------------------
# Processes


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path


class ProcessSet:
    """Child processes, each in its own session (= process group), all stopped on ``close()``.

    Invariant: after ``close()`` returns, no process group started here is alive (SIGTERM, a
    grace period, then SIGKILL to the whole group)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, Proc] = {}

    def __enter__(self) -> ProcessSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def spawn(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> Proc:
        if name in self.procs and self.procs[name].popen.poll() is None:
            raise RuntimeError(f"process {name!r} is already running")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=str(cwd or REPO_ROOT),
                start_new_session=True,
            )
        proc = Proc(name, popen, log_path)
        self.procs[name] = proc
        return proc

    def alive(self, name: str) -> bool:
        p = self.procs.get(name)
        return p is not None and p.popen.poll() is None

    def check_alive(self, name: str) -> None:
        """Raise with the tail of the log if the process exited: a crashed node must not look
        like a slow one."""
        p = self.procs[name]
        if p.popen.poll() is not None:
            tail = self.tail(name)
            last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
            raise RuntimeError(f"{name} exited with {p.popen.returncode}: {last}\nlog tail:\n{tail}")

    def tail(self, name: str, lines: int = 20) -> str:
        try:
            text = self.procs[name].log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, name: str, sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
        p = self.procs.get(name)
        if p is None:
            return
        _signal_group(p.popen, sig)
        try:
            p.popen.wait(grace)
        except subprocess.TimeoutExpired:
            _signal_group(p.popen, signal.SIGKILL)
            p.popen.wait()
        # The group may hold children even after the leader exited.
        _signal_group(p.popen, signal.SIGKILL)

    def kill(self, name: str) -> None:
        self.stop(name, signal.SIGKILL)

    def close(self) -> None:
        for p in self.procs.values():
            _signal_group(p.popen, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        for p in self.procs.values():
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p.popen, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(5)
        self.procs.clear()


def _signal_group(popen: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so ``finally`` blocks clean up on either signal."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_python_module(module: str, args: Sequence[str], timeout: float) -> str:
    """Run ``python -m module args`` from the repository root in its own process group; return
    stdout. Killed as a group on timeout or interrupt."""
    popen = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=str(REPO_ROOT),
        start_new_session=True,
    )
    try:
        out, err = popen.communicate(timeout=timeout)
    finally:
        _signal_group(popen, signal.SIGKILL)
        if popen.poll() is None:
            popen.wait()
    if popen.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed ({popen.returncode}): {err.decode()[-2000:]}")
    return out.decode()


# ---------------------------------------------------------------------------------------------
# Load generation


@dataclass
class LoadResult:
    """One measured run. Latencies in milliseconds; ``ok`` counts 2xx answers only, and
    ``writes_per_s`` is ``ok / duration_s`` (committed writes per second)."""

    generator: str
    clients: int
    duration_s: float
    ok: int
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    target_rate: float | None = None
    # Open loop only: p99 of (actual send time - scheduled send time). When the generator itself
    # is starved of CPU this grows, and it is part of p99_ms: read the two together.
    send_lag_p99_ms: float | None = None

    @property
    def writes_per_s(self) -> float:
        return self.ok / self.duration_s if self.duration_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["writes_per_s"] = self.writes_per_s
        return d


def value_bytes(size: int) -> bytes:
    """The value every generator writes: ``size`` printable bytes (same for every system)."""
    return (b"0123456789abcdefghijklmnopqrstuvwxyz" * (size // 36 + 1))[:size]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# Keys are "b" + one id digit + "-" + six decimal digits: 3 + 3 + 3 bytes, so their base64 is
# the concatenation of the base64 of each 3-byte chunk (base64 maps 3 bytes to 4 characters
# independently). The Lua script thus builds etcd's base64 keys from a 1000-entry table.
_WRK_LUA = r"""
-- generated by bench/common.py: PUT/POST writes with varied keys, JSON summary on stdout
local kind = "%(kind)s"
local path_prefix = "%(path_prefix)s"
local value = "%(value)s"
local value_b64 = "%(value_b64)s"
local b64_3digits = {%(b64_table)s}
local b64_prefix = {%(b64_prefix)s}
local key_space = %(key_space)d
local threads = {}
local counter = 0
local tid = 0

function setup(thread)
  thread:set("bench_tid", #threads %% 10)
  table.insert(threads, thread)
end

function init(args)
  tid = tonumber(bench_tid) or 0
  counter = math.random(0, key_space - 1)
end

function request()
  counter = (counter + 1) %% key_space
  local hi = math.floor(counter / 1000)
  local lo = counter %% 1000
  if kind == "etcd" then
    local k = b64_prefix[tid + 1] .. b64_3digits[hi + 1] .. b64_3digits[lo + 1]
    local body = '{"key":"' .. k .. '","value":"' .. value_b64 .. '"}'
    return wrk.format("POST", "/v3/kv/put", {["Content-Type"] = "application/json"}, body)
  end
  local key = string.format("b%%d-%%03d%%03d", tid, hi, lo)
  return wrk.format("PUT", path_prefix .. key, {["Content-Type"] = "application/octet-stream"}, value)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\nWRKJSON {"requests":%%d,"duration_us":%%d,"status":%%d,"connect":%%d,"read":%%d,' ..
    '"write":%%d,"timeout":%%d,"p50_us":%%d,"p99_us":%%d,"max_us":%%d}\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def wrk_script(kind: str, size: int) -> str:
    if kind not in ("kv", "etcd", "noop"):
        raise ValueError(f"unknown target kind {kind!r}: expected kv, etcd or noop")
    val = value_bytes(size).decode()
    table = ",".join(f'"{_b64(f"{i:03d}".encode())}"' for i in range(1000))
    prefixes = ",".join(f'"{_b64(f"b{i}-".encode())}"' for i in range(10))
    return _WRK_LUA % {
        "kind": kind,
        "path_prefix": "/v1/kv/",
        "value": val,
        "value_b64": _b64(val.encode()),
        "b64_table": table,
        "b64_prefix": prefixes,
        "key_space": KEY_SPACE,
    }


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def run_wrk(endpoint: str, kind: str, size: int, clients: int, duration: float) -> LoadResult:
    """Closed-loop run with wrk: ``clients`` keep-alive connections on ``min(clients, 2)``
    threads (the machine has two cores; more threads only add contention)."""
    threads = max(1, min(clients, 2))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(wrk_script(kind, size))
        script = f.name
    try:
        argv = [
            "wrk",
            "-c",
            str(clients),
            "-t",
            str(threads),
            "-d",
            f"{max(1, round(duration))}s",
            "--timeout",
            "10s",
            "-s",
            script,
            f"http://{endpoint}",
        ]
        proc = subprocess.run(argv, capture_output=True, timeout=duration + 60, start_new_session=True)
    finally:
        os.unlink(script)
    out = proc.stdout.decode(errors="replace")
    line = next((ln for ln in out.splitlines() if ln.startswith("WRKJSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {out[-1000:]} {proc.stderr.decode()[-1000:]}")
    d = json.loads(line[len("WRKJSON ") :])
    errors = d["status"] + d["connect"] + d["read"] + d["write"] + d["timeout"]
    return LoadResult(
        generator="wrk",
        clients=clients,
        duration_s=d["duration_us"] / 1e6,
        ok=max(0, d["requests"] - d["status"]),
        errors=errors,
        p50_ms=d["p50_us"] / 1000,
        p99_ms=d["p99_us"] / 1000,
        max_ms=d["max_us"] / 1000,
    )


def run_asyncio_load(
    endpoint: str,
    kind: str,
    size: int,
    clients: int,
    duration: float,
    rate: float | None = None,
    tls: TlsFiles | None = None,
) -> LoadResult:
    """Run the asyncio generator in its own process (so it never shares a core's event loop
    with anything under test); closed loop, or open loop at ``rate`` writes/s."""
    args = [
        "load",
        "--endpoint",
        endpoint,
        "--kind",
        kind,
        "--size",
        str(size),
        "--clients",
        str(clients),
        "--duration",
        str(duration),
    ]
    if rate is not None:
        args += ["--rate", str(rate)]
    if tls is not None:
        args += tls.args()
    out = run_python_module("bench.common", args, timeout=duration + 120)
    d = json.loads(out.strip().splitlines()[-1])
    return LoadResult(**{k: v for k, v in d.items() if k != "writes_per_s"})


def run_load(
    endpoint: str,
    kind: str,
    size: int,
    clients: int,
    duration: float,
    generator: str = "auto",
    tls: TlsFiles | None = None,
) -> LoadResult:
    """Closed-loop run with the chosen generator (``auto``: wrk if installed, else asyncio).
    With ``tls`` only the asyncio generator can present a client certificate."""
    if generator == "auto":
        generator = "wrk" if have_wrk() and tls is None else "asyncio"
    if generator == "wrk" and tls is not None:
        raise ValueError("wrk cannot present a client certificate: use the asyncio generator for TLS")
    if generator == "asyncio" and tls is not None:
        return run_asyncio_load(endpoint, kind, size, clients, duration, tls=tls)
    if generator == "wrk":
        return run_wrk(endpoint, kind, size, clients, duration)
    if generator == "asyncio":
        return run_asyncio_load(endpoint, kind, size, clients, duration)
    raise ValueError(f"unknown generator {generator!r}: expected auto, wrk or asyncio")


def _request_bytes(kind: str, host: str, key_no: int, conn_no: int, value: bytes) -> bytes:
    key = f"b{conn_no % 10}-{key_no % KEY_SPACE:06d}".encode()
    if kind == "etcd":
        body = json.dumps({"key": _b64(key), "value": _b64(value)}).encode()
        head = f"POST /v3/kv/put HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    else:
        body = value
        head = f"PUT /v1/kv/{key.decode()} HTTP/1.1\r\nHost: {host}\r\n"
    return head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("server closed the connection")
    status = int(status_line.split(b" ", 2)[1])
    length = 0
    chunked = False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, val = line.partition(b":")
        lname = name.strip().lower()
        if lname == b"content-length":
            length = int(val)
        elif lname == b"transfer-encoding" and b"chunked" in val.lower():
            chunked = True
    body = b""
    if chunked:
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            body += (await reader.readexactly(size + 2))[:size]
            if size == 0:
                break
    elif length:
        body = await reader.readexactly(length)
    return status, body


def _leader_hint(body: bytes) -> str | None:
    try:
        hint = json.loads(body or b"{}").get("leader_endpoint")
    except (ValueError, AttributeError):
        return None
    return str(hint) if hint else None


async def _asyncio_load(
    endpoint: str,
    kind: str,
    size: int,
    clients: int,
    duration: float,
    rate: float | None,
    tls: TlsFiles | None = None,
) -> LoadResult:
    """Closed loop: each connection sends its next write when the previous answer arrived.
    Open loop (``rate``): write i is due at ``start + i / rate`` whatever happened before; its
    latency is measured from that due time, so queueing behind slow answers is counted
    (no coordinated omission)."""
    value = value_bytes(size)
    latencies: list[float] = []
    lags: list[float] = []
    counts = {"ok": 0, "errors": 0}
    next_index = 0
    ctx = tls.context() if tls is not None else None

    async def connect(ep: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        h, _, p = ep.rpartition(":")
        if ctx is None:
            return await asyncio.open_connection(h, int(p))
        return await asyncio.open_connection(h, int(p), ssl=ctx, server_hostname=h)

    # Every connection is open (and its TLS handshake done) before the clock starts: 128
    # handshakes take longer than a fixed head start on a busy machine, and their cost (on
    # both sides) is not what a run of committed writes measures.
    conns = await asyncio.gather(*(connect(endpoint) for _ in range(clients)))
    start = time.perf_counter() + 0.05
    end = start + duration

    async def worker(conn_no: int) -> None:
        nonlocal next_index
        target = endpoint
        reader, writer = conns[conn_no]
        key_no = conn_no * 7919
        try:
            await asyncio.sleep(max(0.0, start - time.perf_counter()))
            while True:
                if rate is not None:
                    i = next_index
                    next_index += 1
                    due = start + i / rate
                    if due >= end:
                        return
                    delay = due - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    lags.append(time.perf_counter() - due)
                else:
                    due = time.perf_counter()
                    if due >= end:
                        return
                key_no += 1
                request = _request_bytes(kind, target.rpartition(":")[0], key_no, conn_no, value)
                # A 421 means "not applied, the leader is elsewhere" (docs/reference.md): follow the
                # hint and send the same write again; its latency still counts from `due`.
                for _hop in range(3):
                    writer.write(request)
                    try:
                        status, body = await _read_response(reader)
                    except (ConnectionError, asyncio.IncompleteReadError):
                        status, body = -1, b""
                    if status == 421:
                        hint = _leader_hint(body)
                        if hint and hint != target:
                            writer.close()
                            target = hint
                            reader, writer = await connect(target)
                            continue
                    break
                if 200 <= status < 300:
                    latencies.append(time.perf_counter() - due)
                    counts["ok"] += 1
                    continue
                counts["errors"] += 1
                if status == -1:
                    writer.close()
                    await asyncio.sleep(0.05)
                    reader, writer = await connect(target)
        finally:
            writer.close()

    await asyncio.gather(*(worker(i) for i in range(clients)))
    elapsed = max(1e-9, min(time.perf_counter(), end + 10) - start)
    if rate is not None:
        elapsed = duration  # the offered load spans exactly the duration
    lat = sorted(latencies)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else 0.0

    return LoadResult(
        generator="asyncio-open" if rate is not None else "asyncio",
        clients=clients,
        duration_s=elapsed,
        ok=counts["ok"],
        errors=counts["errors"],
        p50_ms=pct(0.50),
        p99_ms=pct(0.99),
        max_ms=lat[-1] * 1000 if lat else 0.0,
        target_rate=rate,
        send_lag_p99_ms=sorted(lags)[int(0.99 * len(lags))] * 1000 if lags else None,
    )


# ---------------------------------------------------------------------------------------------
# The trivial server used to measure the generators' ceiling (and the cost of an aiohttp front
# end that does no work).


def use_uvloop() -> bool:
    """Use uvloop for this process's event loops when it is installed, as the engine does
    (quorum/runtime/run.py): the front ends and generators under comparison then share one
    event-loop implementation."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def serve_noop(port: int, tls: TlsFiles | None = None) -> None:
    """``tls``: serve https with this certificate, verifying client certificates against the
    CA (the TLS rows' generator ceiling)."""
    # imported here, as aiohttp: the load generator (same module) starts without them
    from aiohttp import web

    from quorum.security.tlsctx import server_context

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"offset": 0})

    async def ready(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/readyz", ready)
    app.router.add_route("*", "/{tail:.*}", handle)
    use_uvloop()
    ssl_context = server_context(tls.ca, tls.cert, tls.key) if tls and tls.cert and tls.key else None
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, ssl_context=ssl_context)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.common", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ld = sub.add_parser("load", help="run the asyncio load generator; prints one JSON line")
    ld.add_argument("--endpoint", required=True, help="HOST:PORT")
    ld.add_argument("--kind", choices=["kv", "etcd", "noop"], default="kv")
    ld.add_argument("--size", type=int, default=100)
    ld.add_argument("--clients", type=int, default=1)
    ld.add_argument("--duration", type=float, default=5.0)
    ld.add_argument("--rate", type=float, default=None, help="open loop at this many writes/s")
    ld.add_argument("--ca", default=None, help="HTTPS: the CA file that signed the server")
    ld.add_argument("--cert", default=None, help="HTTPS: client certificate (mutual TLS)")
    ld.add_argument("--key", default=None, help="HTTPS: client key (mutual TLS)")
    ns = sub.add_parser("noop-server", help="a trivial aiohttp server answering 200 to everything")
    ns.add_argument("--port", type=int, required=True)
    ns.add_argument("--ca", default=None, help="https: the CA that signed client certificates")
    ns.add_argument("--cert", default=None, help="https: the server certificate")
    ns.add_argument("--key", default=None, help="https: the server key")
    args = ap.parse_args(argv)
    if args.cmd == "noop-server":
        serve_noop(args.port, TlsFiles(args.ca, args.cert, args.key) if args.ca else None)
        return 0
    if args.clients < 1 or args.duration <= 0 or args.size < 0 or (args.rate is not None and args.rate <= 0):
        ap.error("--clients must be >= 1, --duration and --rate > 0, --size >= 0")
    use_uvloop()
    res = asyncio.run(
        _asyncio_load(
            args.endpoint,
            args.kind,
            args.size,
            args.clients,
            args.duration,
            args.rate,
            TlsFiles(args.ca, args.cert, args.key) if args.ca else None,
        )
    )
    print(json.dumps(res.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
