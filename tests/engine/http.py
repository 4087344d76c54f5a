"""Plain synchronous HTTP for process-level tests (urllib, one request per call), so that a
test can look at exactly one node's answer: status and decoded JSON body."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def call(
    endpoint: str, method: str, path: str, body: bytes | None = None, timeout: float = 10
) -> tuple[int, Any]:
    """``method path`` on ``endpoint`` (HOST:PORT); returns (status, JSON body or raw bytes)."""
    req = urllib.request.Request(f"http://{endpoint}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw
