"""The RPC header codec, per message: the compiled codec (:mod:`quorum.runtime.wirefast`, msgspec,
with the reference's rules as the fallback) against the reference strict codec alone
(:mod:`quorum.runtime.wire` on :mod:`quorum.strictjson`), decode and encode, in µs per message.

```sh
.venv/bin/python -m bench.wire_codec            # --number N per timing, --repeat R timings
```

Each message is one a node really sends (a follower's FetchRequest with its UUID and endpoint,
the leader's FetchResponse with a 150-byte batch, votes, epochs, snapshot fetches). Per message
and operation it prints the best and the median of R timings of N calls each (the best is the
least disturbed by other processes on a shared machine), ``json.loads`` of the header alone as
the floor of any JSON decoder in Python, and the ratio reference / compiled of the medians.
The client path has no JSON to decode (a PUT's body is the value, the answer is formatted as
bytes), so it is not measured here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit
from collections.abc import Callable, Sequence
from typing import Any

from quorum.core import messages as m
from quorum.runtime import wire
from quorum.types import ErrorCode, OffsetAndEpoch, ReplicaKey

U1 = "3f2b9c4e-8d1a-4e6f-9b2c-7a5d1e0f4c21"
U2 = "a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d"
CLUSTER = "kraftkeeper-bench-cluster"
RECORDS = bytes(150)  # one 100-byte value's batch, about what a 1-client write replicates

SAMPLES: list[Any] = [
    m.FetchRequest(123456, CLUSTER, 2, U2, 7, 1_048_576, 7, 500, 8 << 20, "node-2.kraftkeeper:9093"),
    m.FetchResponse(
        123456, ErrorCode.NONE, 1, 7, 1_048_576, 0, RECORDS, None, None, "node-1.kraftkeeper:9093"
    ),
    m.VoteRequest(41, CLUSTER, 1, U1, 8, 2, U2, 7, 1_048_576, "node-1.kraftkeeper:9093", True),
    m.VoteResponse(41, ErrorCode.NONE, -1, 7, True, None, True, 2, U2),
    m.BeginQuorumEpochRequest(42, CLUSTER, 1, 8, 2, U2, U1, "node-1.kraftkeeper:9093"),
    m.BeginQuorumEpochResponse(42, ErrorCode.NONE, 1, 8, "node-1.kraftkeeper:9093", 2),
    m.EndQuorumEpochRequest(
        43, CLUSTER, 1, 8, 2, U2, (ReplicaKey(2, U2), ReplicaKey(3, U1)), U1, "node-1.kraftkeeper:9093"
    ),
    m.EndQuorumEpochResponse(43, ErrorCode.NONE, 1, 8, "node-1.kraftkeeper:9093", 2),
    m.FetchSnapshotRequest(44, CLUSTER, 2, U2, 8, OffsetAndEpoch(1_000_000, 7), 0, 8 << 20),
    m.FetchSnapshotResponse(44, ErrorCode.NONE, 1, 8, OffsetAndEpoch(1_000_000, 7), 4096, 0, bytes(4096)),
]


def _encode_reference(msg: Any) -> bytes:
    hb = wire.encode_header_reference(msg)
    raw = next((getattr(msg, n) for n in ("records", "unaligned_records") if hasattr(msg, n)), b"")
    return len(hb).to_bytes(4, "little") + hb + bytes(raw)


def _time(fn: Callable[[], Any], number: int, repeat: int) -> tuple[float, float]:
    """(best, median) µs per call."""
    runs = [t / number * 1e6 for t in timeit.repeat(fn, number=number, repeat=repeat)]
    return min(runs), statistics.median(runs)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--number", type=int, default=20_000, help="calls per timing")
    ap.add_argument("--repeat", type=int, default=7, help="timings per operation")
    args = ap.parse_args(argv)
    print("µs per message, best / median of the timings; ratio = reference / compiled (medians)")
    print(
        f"{'message':<26} {'hdr B':>5}  {'decode ref':>12} {'compiled':>12} {'ratio':>6}"
        f" {'json.loads':>10}  {'encode ref':>12} {'compiled':>12} {'ratio':>6}"
    )
    for msg in SAMPLES:
        cls = type(msg)
        body = wire.encode(msg)
        assert body == _encode_reference(msg), f"{cls.__name__}: the compiled encoder's bytes differ"
        assert wire.decode(cls, body) == wire.decode_reference(cls, body) == msg
        hb, _ = wire.split_frame(cls.__name__, body)
        n, r = args.number, args.repeat
        dref = _time(lambda: wire.decode_reference(cls, body), n, r)  # noqa: B023 - timed at once
        dnew = _time(lambda: wire.decode(cls, body), n, r)  # noqa: B023
        floor = _time(lambda: json.loads(hb), n, r)  # noqa: B023
        eref = _time(lambda: _encode_reference(msg), n, r)  # noqa: B023
        enew = _time(lambda: wire.encode(msg), n, r)  # noqa: B023
        print(
            f"{cls.__name__:<26} {len(hb):>5}  {dref[0]:>5.1f} / {dref[1]:>4.1f}"
            f" {dnew[0]:>5.1f} / {dnew[1]:>4.1f}"
            f" {dref[1] / dnew[1]:>5.1f}x {floor[1]:>10.1f}  {eref[0]:>5.1f} / {eref[1]:>4.1f}"
            f" {enew[0]:>5.1f} / {enew[1]:>4.1f} {eref[1] / enew[1]:>5.1f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
