"""RFC 3339 timestamps in UTC, the one format every timestamp we write uses: Kubernetes status
fields and Events (``metav1.Time``: whole seconds, ``Z``), the recovery event log and status
records (milliseconds, ``Z``), lock files and notes. Standard library only, so the node, the
operator, the reports and the tests can all import it cheaply.

Invariant: :func:`parse_rfc3339` reads back everything :func:`rfc3339` writes, to the millisecond
(whole-second stamps read back as ``...000``).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

__all__ = ["now_ms", "parse_rfc3339", "rfc3339"]


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch (what stamps are made from)."""
    return time.time_ns() // 1_000_000


def rfc3339(ms: int | None = None, *, millis: bool = False) -> str:
    """``ms`` (default: now) as ``2026-11-29T03:45:46Z``; with ``millis``,
    ``2026-11-29T03:45:46.123Z``."""
    at = now_ms() if ms is None else ms
    stamp = datetime.fromtimestamp(at // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{at % 1000:03d}Z" if millis else f"{stamp}Z"


def parse_rfc3339(text: str) -> int:
    """Milliseconds since the epoch of an RFC 3339 stamp (``Z`` or a numeric offset). A stamp
    without a zone is refused: its instant is unknown."""
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}") from None
    if at.tzinfo is None:
        raise ValueError(f"RFC 3339 timestamp without a zone: {text!r}")
    return round(at.timestamp() * 1000)
