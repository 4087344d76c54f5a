"""One PySyncObj node plus its HTTP front end, the process behind each node of the
``pysyncobj batch`` / ``pysyncobj nobatch`` rows of ``bench/engine.py``.

Started by :class:`bench.clusters.PySyncObjCluster` as ``python -m bench.engine pysyncobj-node
--index I --raft-ports P1,P2,P3 --http-ports H1,H2,H3 [--no-batch]``: a PySyncObj ``SyncObj``
holding an in-memory dict (no journal file, so no fsync) behind a tiny aiohttp app that turns
``PUT /v1/kv/{key}`` into a replicated call, answers once PySyncObj reports it committed, and
answers 421 + ``leader_endpoint`` on a follower, like KRaftKeeper (docs/reference.md).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any

from bench.procs import use_uvloop


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
