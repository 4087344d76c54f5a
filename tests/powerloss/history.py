"""The history of a client workload and its checks: register linearizability per key (the
Wing-Gong-Lowe search) and durability of every acknowledged write.

Operations are puts of values unique in the whole history and linearizable gets
(``/v1/kv``). A put that failed or timed out is *indeterminate*: it may have taken effect at
any time after it started, or never. Two facts keep the search small and exact:

* an indeterminate put whose value no read returned can be left out: if a linearization puts
  it somewhere, removing it leaves one (no read sits between it and the next write);
* an indeterminate put whose value a read returned took effect before that read completed, so
  the earliest such completion is its latest possible linearization point.

Each register key has ONE writer (its puts are sequential): a put the client resent after its
connection broke may be applied twice, and with several writers another write between the two
applications would be reported although the quorum did nothing wrong. With one writer both
applications fall inside the put's own interval.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass


@dataclass
class Op:
    """One client operation. ``complete`` is None for an indeterminate put; a get that failed
    is not recorded (it has no effect)."""

    kind: str  # "put" | "get"
    key: str
    value: str | None  # the value written, or the value read (None: the key was absent)
    invoke: float
    complete: float | None
    offset: int | None = None  # the log offset an acknowledged put was committed at


def _seq(value: str) -> int:
    """Register values are ``<key>#<n>``, n increasing along the key's one writer."""
    return int(value.rsplit("#", 1)[1])


def stale_reads(ops: list[Op]) -> list[str]:
    """Reads older than a write acknowledged before they started (the read returns an
    acknowledged write's value with a lower sequence number, or nothing at all). An
    indeterminate write's value is left to the linearizability search."""
    acked = {o.value for o in ops if o.kind == "put" and o.complete is not None}
    # Per key: acknowledged writes by completion, with the running latest (highest sequence).
    ends: dict[str, list[float]] = defaultdict(list)
    latest: dict[str, list[Op]] = defaultdict(list)
    writes = [o for o in ops if o.kind == "put" and o.complete is not None]
    for w in sorted(writes, key=lambda o: o.complete or 0):
        prev = latest[w.key][-1] if latest[w.key] else None
        ends[w.key].append(float(w.complete or 0))
        latest[w.key].append(w if prev is None or _seq(str(w.value)) > _seq(str(prev.value)) else prev)
    problems = []
    for r in ops:
        if r.kind != "get":
            continue
        n = bisect.bisect_left(ends[r.key], r.invoke)
        if n == 0:
            continue
        last = latest[r.key][n - 1]
        if r.value is None:
            problems.append(f"{r.key}: a read at {r.invoke:.3f} found nothing, after {last.value!r} "
                            f"was acknowledged at {last.complete:.3f} (offset {last.offset})")
        elif r.value in acked and _seq(r.value) < _seq(str(last.value)):
            problems.append(f"{r.key}: a read at {r.invoke:.3f} returned {r.value!r}, older than "
                            f"{last.value!r} acknowledged at {last.complete:.3f} (offset {last.offset})")
    return problems


def duplicate_offsets(ops: list[Op]) -> list[str]:
    """Two acknowledged puts committed at the same offset: one replaced the other."""
    seen: dict[int, Op] = {}
    problems = []
    for o in ops:
        if o.kind == "put" and o.offset is not None:
            if o.offset in seen:
                first = seen[o.offset].value
                problems.append(f"offset {o.offset} acknowledged twice: {first!r} and {o.value!r}")
            seen[o.offset] = o
    return problems


def linearizable(ops: list[Op]) -> bool:
    """Whether one key's history is linearizable as a register starting absent (None)."""
    observed: dict[str, float] = {}
    for o in ops:
        if o.kind == "get" and o.value is not None and o.complete is not None:
            observed[o.value] = min(observed.get(o.value, math.inf), o.complete)
    calls: list[tuple[float, float, str, str | None]] = []  # (invoke, complete, kind, value)
    for o in ops:
        if o.kind == "put" and o.complete is None:
            if o.value not in observed:
                continue  # indeterminate and never seen: left out (module docstring)
            calls.append((o.invoke, observed[str(o.value)], "put", o.value))
        else:
            calls.append((o.invoke, o.complete if o.complete is not None else math.inf, o.kind, o.value))
    calls.sort(key=lambda c: c[0])
    n = len(calls)
    full = (1 << n) - 1
    seen: set[tuple[int, str | None]] = set()
    stack: list[tuple[int, str | None, int]] = [(0, None, 0)]  # (linearized set, value, first not in it)
    while stack:
        done, value, first = stack.pop()
        if done == full:
            return True
        if (done, value) in seen:
            continue
        seen.add((done, value))
        while done >> first & 1:
            first += 1
        # The next operation can be any one not yet linearized that started before every
        # other pending one completed; calls are sorted by start, so the scan stops at the
        # first start after the earliest pending completion.
        horizon = math.inf
        i = first
        while i < n and calls[i][0] < horizon:
            if not done >> i & 1:
                horizon = min(horizon, calls[i][1])
            i += 1
        for j in range(first, i):
            if done >> j & 1 or calls[j][0] > horizon:
                continue
            _, _, kind, v = calls[j]
            if kind == "put":
                stack.append((done | 1 << j, v, first))
            elif v == value:
                stack.append((done | 1 << j, value, first))
    return False


def check_registers(ops: list[Op]) -> list[str]:
    """Every key whose history is not linearizable, with its operations."""
    by_key: dict[str, list[Op]] = defaultdict(list)
    for o in ops:
        by_key[o.key].append(o)
    problems = []
    for key, key_ops in sorted(by_key.items()):
        if not linearizable(key_ops):
            tail = "\n  ".join(
                f"{o.kind} {o.value!r} [{o.invoke:.3f}, {'-' if o.complete is None else f'{o.complete:.3f}'}]"
                f" offset {o.offset}" for o in sorted(key_ops, key=lambda o: o.invoke)[-40:]
            )
            problems.append(f"{key}: not linearizable ({len(key_ops)} operations); the last ones:\n  {tail}")
    return problems
