"""The bounds of the RPC header fields, shared by the reference decoder
(:mod:`quorum.runtime.wire`) and the compiled one (:mod:`quorum.runtime.wirefast`), so the two
cannot drift apart: KIP-595 types (ids and epochs int32, offsets and timestamps int64), and the
limits a hostile peer must not exceed."""

from __future__ import annotations

import re

from quorum.core.config import MAX_FETCH_BYTES
from quorum.strictjson import INT32, INT64

MAX_HEADER = 64 * 1024
MAX_WAIT_MS = 60_000  # a Fetch long-poll longer than a minute is a mistake or an attack
MAX_BYTES = MAX_FETCH_BYTES  # = records.MAX_BATCH_BYTES: one batch is always served whole
MAX_ENDPOINT = 262  # 255-character host name, ':' and a port
MAX_SUCCESSORS = 256
MAX_CLUSTER_ID = 128
MAX_ERROR_CODE = 64

ENDPOINT = re.compile(r"^[^\s/@]+:[0-9]{1,5}$")  # host:port; the port's range is checked apart
ID = (0, INT32[1])
ID_OR_NONE = (-1, INT32[1])  # -1 = no leader / unknown (KIP-595)
EPOCH = (0, INT32[1])
OFFSET = (0, INT64[1])
HIGH_WATERMARK = (-1, INT64[1])  # -1 = not known yet
DIVERGING_OFFSET = (-1, INT64[1])
WAIT_MS = (0, MAX_WAIT_MS)
FETCH_BYTES = (0, MAX_BYTES)


def valid_port(endpoint: str) -> bool:
    """Whether the port of an endpoint that matched :data:`ENDPOINT` is 1..65535."""
    return 0 < int(endpoint.rpartition(":")[2]) < 65536
