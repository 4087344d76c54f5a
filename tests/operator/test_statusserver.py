"""The shared status server of ``operator local`` and ``operator watch`` on a real loopback port:
/status follows what its owner publishes, /metrics is Prometheus text from the operator's
registry, /healthz answers ok, an unknown path is 404, and a taken port is an error, not a hang."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from kraftkeeper_operator.statusserver import StatusServer
from kraftkeeper_operator.telemetry import OperatorMetrics

from quorum.localports import free_port


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


async def _exercise(status: dict[str, Any] | None) -> None:
    metrics = OperatorMetrics()
    server = StatusServer(metrics, (lambda: status) if status is not None else None)
    port = free_port()
    await server.start("127.0.0.1", port)
    base = f"http://127.0.0.1:{port}"
    try:
        code, _, body = await asyncio.to_thread(_get, base + "/status")
        assert code == 200
        if status is None:
            assert json.loads(body) == {"conditions": [], "recoveries": []}
            server.last = {"phase": "Running", "passes": 3}
            _, _, body = await asyncio.to_thread(_get, base + "/status")
            assert json.loads(body) == {"phase": "Running", "passes": 3}
        else:
            assert json.loads(body) == status
            status["passes"] = 7  # the owner replaces what it publishes; the server reads it anew
            _, _, body = await asyncio.to_thread(_get, base + "/status")
            assert json.loads(body)["passes"] == 7
        code, ctype, body = await asyncio.to_thread(_get, base + "/metrics")
        assert code == 200 and ctype.startswith("text/plain")
        assert "kraftkeeper_operator_" in body
        assert await asyncio.to_thread(_get, base + "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
        with pytest.raises(urllib.error.HTTPError) as e:
            await asyncio.to_thread(_get, base + "/nope")
        assert e.value.code == 404
        # A second server on the same port fails at start and leaves nothing running.
        other = StatusServer(metrics)
        with pytest.raises(OSError):
            await other.start("127.0.0.1", port)
        assert other.runner is None
    finally:
        await server.stop()
        await server.stop()  # idempotent
    with pytest.raises(urllib.error.URLError):
        await asyncio.to_thread(_get, base + "/healthz")


def test_status_from_last_attribute() -> None:
    asyncio.run(_exercise(None))


def test_status_from_owner_callable() -> None:
    asyncio.run(_exercise({"phase": "Starting", "passes": 0}))
