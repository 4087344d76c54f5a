"""The benchmarks' harness and their command line (``bench/engine.py``, ``bench/recovery.py``).

What lives here: the engine's config for a run (``FSYNC_CONFIG_KEY``), tiny synchronous HTTP
helpers for the harness (leader discovery, readiness polling), and a trivial HTTP server
(``noop-server``) used to measure the generators' own ceiling. The load generators are in
:mod:`bench.load`, the process groups and launchers in :mod:`bench.procs`.

Run as ``python -m bench.common load ...`` (the asyncio generator of :mod:`bench.load`) /
``python -m bench.common noop-server ...`` (the benchmarks do that themselves).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import sys
from collections.abc import Sequence
from typing import Any, TypeVar

from bench.load import TlsFiles, asyncio_load
from bench.procs import use_uvloop
from testkit.polling import wait_until

# The engine's config file knob that turns fsync off (docs/reference.md: fsync is on by default;
# `--config FILE` is JSON). One constant so the benchmark follows the engine if it is renamed:
# a dotted path into the JSON object.
FSYNC_CONFIG_KEY = "log.fsync"


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


# What counts as "not yet" while polling a system under test (testkit.polling.wait_until's
# ``errors``): refused or reset connections, broken HTTP, a body that is not JSON yet.
NOT_YET = (OSError, http.client.HTTPException, ValueError)


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

    return wait_until(f"a leader among {', '.join(endpoints)}", attempt, timeout, 0.1, errors=NOT_YET)


# ---------------------------------------------------------------------------------------------
# The trivial server used to measure the generators' ceiling (and the cost of an aiohttp front
# end that does no work).


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
        asyncio_load(
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
