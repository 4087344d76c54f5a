"""The small HTTP server of the local supervisor (``operator local``) and of ``operator watch``:
``/metrics`` (Prometheus text from the operator's registry), ``/status`` (JSON: the last controller
status) and ``/healthz`` (``ok``). One implementation, so both modes answer alike.

The status is whatever ``status()`` returns at request time (by default ``self.last``, which the
owner replaces after every controller pass); the server never computes anything itself.

The server takes no credential, so with ``redact`` (``operator local`` with TLS on) it names no
storage UUID: a (replica id, storage UUID) pair is half of what a peer request claims, and the
nodes show it only to an authenticated admin (``kraftkeeper quorum describe``). Keys naming a
UUID are dropped and any UUID inside a message is replaced by ``<storage uuid>``.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .telemetry import OperatorMetrics

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def redact_uuids(value: Any) -> Any:
    """``value`` without storage UUIDs: keys ending in ``uuid`` (any case) dropped, UUIDs in
    strings replaced."""
    if isinstance(value, dict):
        return {k: redact_uuids(v) for k, v in value.items() if not str(k).lower().endswith("uuid")}
    if isinstance(value, list | tuple):
        return [redact_uuids(v) for v in value]
    if isinstance(value, str):
        return _UUID.sub("<storage uuid>", value)
    return value


class StatusServer:
    """``/metrics``, ``/status`` and ``/healthz`` on ``host:port`` until :meth:`stop`."""

    def __init__(
        self,
        metrics: OperatorMetrics,
        status: Callable[[], dict[str, Any]] | None = None,
        *,
        redact: bool = False,
    ) -> None:
        self.metrics = metrics
        self.redact = redact
        self.last: dict[str, Any] = {"conditions": [], "recoveries": []}
        self._status = status if status is not None else (lambda: self.last)
        self.runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        async def h_metrics(_: web.Request) -> web.Response:
            body = generate_latest(self.metrics.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def h_status(_: web.Request) -> web.Response:
            status = self._status()
            return web.json_response(redact_uuids(status) if self.redact else status)

        async def h_health(_: web.Request) -> web.Response:
            return web.Response(text="ok\n")

        app = web.Application()
        app.add_routes(
            [web.get("/metrics", h_metrics), web.get("/status", h_status), web.get("/healthz", h_health)]
        )
        return app

    async def start(self, host: str, port: int, *, sock: socket.socket | None = None) -> None:
        """Serve on ``host:port``, or on ``sock`` when given (already listening there: bound by
        the caller before it reported the port)."""
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        try:
            site = web.SockSite(runner, sock) if sock is not None else web.TCPSite(runner, host, port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self.runner = runner

    async def stop(self) -> None:
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()
