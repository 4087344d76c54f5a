"""The event loop under a 4 MiB-body flood, with and without shared loop turns (the hostile-peer
flood, ``quorum.runtime.limits`` / ``quorum.runtime.turns.ReadTurns``).

Each round starts the node's real HTTP server (``build_app`` + ``start_server``, TLS, uvloop when
installed) in its own process with a stub node, once with the default per-turn quota and once
with the quota off (interleaved: A, B, A, B ...), floods it from this process with 100
connections each sending a 4 MiB PUT body but its last byte, probes ``/healthz`` meanwhile, and
reads the server's own measurements from ``/metrics``: the largest event-loop lag and the most
CPU its loop thread used between two 50 ms checks (a long single turn). Output: one line per run,
then the medians and the ratio off/on.

    .venv/bin/python -m bench.flood              # 5 rounds
    .venv/bin/python -m bench.flood --rounds 3 --plaintext
"""

from __future__ import annotations

import argparse
import asyncio
import select
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from testkit.polling import wait_until

QUOTA_ON = 1024 * 1024
QUOTA_OFF = 1 << 62


class _Stub:
    node_id = 1

    async def put(self, key: str, value: bytes) -> int:
        return 1

    def health(self) -> tuple[bool, dict[str, Any]]:
        return True, {"status": "ok"}

    def metrics_text(self) -> str:
        return ""


def serve(port: int, quota: int, tls_dir: str | None) -> None:
    """The server process: the node's HTTP server with a stub node until killed."""
    from quorum.runtime.limits import Limits
    from quorum.runtime.server import build_app, start_server
    from quorum.security.tlsctx import server_context

    async def main() -> None:
        app = build_app(_Stub(), max_body=4 * 1024 * 1024 + 64 * 1024, limits=Limits(turn_quota=quota))  # type: ignore[arg-type]
        ctx = None
        if tls_dir:
            d = Path(tls_dir)
            ctx = server_context(d / "ca.crt", d / "node-1.crt", d / "node-1.key")
        await start_server(app, f"127.0.0.1:{port}", ctx)
        await asyncio.Event().wait()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def _get(port: int, path: str, ctx: ssl.SSLContext | None) -> bytes:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    if ctx is not None:
        s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
    with s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def flood(port: int, ctx: ssl.SSLContext | None, n: int = 100, size: int = 4 * 1024 * 1024) -> None:
    chunk = b"z" * (256 * 1024)
    socks: list[list[Any]] = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if ctx is not None:
            s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
        s.sendall(f"PUT /v1/kv/big-{i} HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode())
        s.setblocking(False)
        socks.append([s, 0])
    idle = 0
    while idle < 20:  # until the server stops taking bytes
        progressed = False
        for entry in socks:
            want = min(len(chunk), size - 1 - entry[1])
            if want <= 0:
                continue
            try:
                entry[1] += entry[0].send(chunk[:want])
                progressed = True
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError, OSError):
                continue
        idle = 0 if progressed else idle + 1
        if not progressed:
            select.select([], [e[0] for e in socks], [], 0.05)
    for entry in socks:
        entry[0].close()


def one_run(port: int, quota: int, tls_dir: Path | None) -> dict[str, float]:
    args = [sys.executable, "-m", "bench.flood", "--serve", str(port), "--quota", str(quota)]
    proc = subprocess.Popen([*args, *(["--tls-dir", str(tls_dir)] if tls_dir else [])])
    ctx = None
    if tls_dir is not None:
        ctx = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
        ctx.check_hostname = False
    try:
        wait_until(
            f"the flood server on port {port} answering /healthz",
            lambda: _get(port, "/healthz", ctx) or True, 30, 0.1, errors=(OSError,),
        )
        worst, stop = [0.0], threading.Event()

        def probe() -> None:
            while not stop.is_set():
                t = time.monotonic()
                _get(port, "/healthz", ctx)
                worst[0] = max(worst[0], time.monotonic() - t)
                stop.wait(0.1)

        th = threading.Thread(target=probe, daemon=True)
        th.start()
        flood(port, ctx)
        stop.set()
        th.join()
        metrics = _get(port, "/metrics", ctx).decode()
        out = {"worst_probe_ms": worst[0] * 1000}
        for line in metrics.splitlines():
            for name in ("loop_lag_max_ms", "loop_busy_max_ms"):
                if line.startswith(f"kraftkeeper_http_{name} "):
                    out[name] = float(line.split()[1])
        return out
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--plaintext", action="store_true")
    p.add_argument("--port", type=int, default=29400)
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    p.add_argument("--quota", type=int, default=QUOTA_ON, help=argparse.SUPPRESS)
    p.add_argument("--tls-dir", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        serve(a.serve, a.quota, a.tls_dir)
        return
    with tempfile.TemporaryDirectory() as tmp:
        tls_dir = None
        if not a.plaintext:
            from testkit.tls import make_tls_dir

            tls_dir = make_tls_dir(Path(tmp), nodes=(1,))
        runs: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
        for r in range(a.rounds):
            for label, quota in (("on", QUOTA_ON), ("off", QUOTA_OFF)):
                res = one_run(a.port, quota, tls_dir)
                runs[label].append(res)
                print(
                    f"round {r + 1} turns {label:3} " + " ".join(f"{k}={v:.0f}" for k, v in res.items()),
                    flush=True,
                )
        for key in ("loop_lag_max_ms", "loop_busy_max_ms", "worst_probe_ms"):
            on = statistics.median(x[key] for x in runs["on"])
            off = statistics.median(x[key] for x in runs["off"])
            print(f"median {key}: shared turns {on:.0f}, unshared {off:.0f}, ratio {off / max(on, 1):.1f}x")


if __name__ == "__main__":
    main()
