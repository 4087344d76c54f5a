"""The intervals a recovery report measures, defined once for the Spark job, the HTML report and
the demo's console (so a number printed by ``kraftkeeper demo`` and one in the report mean the same).

Every interval runs between the first events of two types of one recovery (KIP-856 "Disk failure
recovery": the replacement catches up as an observer, is added with AddVoter, then the old
(id, UUID) is removed with RemoveVoter). Pure standard library: the demo uses it without Spark.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from kraftkeeper_reports import events as ev


@dataclass(frozen=True)
class Interval:
    """``name`` (a column stem: ``<name>_ms``) runs from the first ``start`` event to the first
    ``end`` event. ``title`` is what a reader sees; ``meaning`` says why it matters."""

    name: str
    start: str
    end: str
    title: str
    meaning: str


# (name, start, end, title, meaning): one row per interval, in the order the report shows them.
_TABLE: Final = (
    ("catch_up", ev.DISK_REPLACEMENT_DETECTED, ev.REPLICA_CAUGHT_UP,
     "Catch-up: detection \u2192 caught up",
     "the new replica fetches the log as an observer"),
    ("add_voter", ev.REPLICA_CAUGHT_UP, ev.ADD_VOTER_COMMITTED,
     "AddVoter: caught up \u2192 AddVoter committed",
     "stabilisation wait and operator reaction plus one AddVoter round"),
    ("remove_voter", ev.ADD_VOTER_COMMITTED, ev.REMOVE_VOTER_COMMITTED,
     "RemoveVoter: AddVoter committed \u2192 RemoveVoter committed",
     "operator reaction plus one RemoveVoter round"),
    ("under_replicated", ev.DISK_REPLACEMENT_DETECTED, ev.ADD_VOTER_COMMITTED,
     "Without full voter count: detection \u2192 AddVoter committed",
     "until the replacement (id, new UUID) is a committed voter (a lower bound: the disk was gone "
     "before it was detected)"),
    ("exposure", ev.DISK_REPLACEMENT_DETECTED, ev.REMOVE_VOTER_COMMITTED,
     "Dead voter in set: detection \u2192 RemoveVoter committed",
     "the quorum ran with the dead (id, old UUID) as a voter, tolerating one failure less"),
    ("total", ev.DISK_REPLACEMENT_DETECTED, ev.RECOVERY_COMPLETED,
     "Total: detection \u2192 recovery completed",
     "the whole recovery as the operator logged it"),
)

INTERVALS: Final = tuple(Interval(*row) for row in _TABLE)
BY_NAME: Final = {i.name: i for i in INTERVALS}
PHASES: Final = tuple(i.name for i in INTERVALS)
CATCH_UP: Final = BY_NAME["catch_up"]
ADD_VOTER: Final = BY_NAME["add_voter"]
REMOVE_VOTER: Final = BY_NAME["remove_voter"]
UNDER_REPLICATED: Final = BY_NAME["under_replicated"]
EXPOSURE: Final = BY_NAME["exposure"]
TOTAL: Final = BY_NAME["total"]


NO_VALUE: Final = "\u2013"  # an en dash where there is no number


def fmt_ms(ms: float | int | None) -> str:
    """A duration for people: 840 ms, 12.3 s, 4.5 min, 1.2 h (never scientific notation)."""
    if ms is None or (isinstance(ms, float) and math.isnan(ms)):
        return NO_VALUE
    v = float(ms)
    if v < 1000:
        return f"{v:.0f} ms"
    if v < 60_000:
        return f"{v / 1000:.1f} s"
    if v < 3_600_000:
        return f"{v / 60_000:.1f} min"
    return f"{v / 3_600_000:.1f} h"


def durations(first_ms: Mapping[str, int]) -> dict[str, int | None]:
    """Each interval in ms from the first timestamp (epoch ms) of each event type of one
    recovery; None where an end is missing."""
    out: dict[str, int | None] = {}
    for i in INTERVALS:
        a, b = first_ms.get(i.start), first_ms.get(i.end)
        out[i.name] = None if a is None or b is None else b - a
    return out


def first_timestamps(events: list[dict[str, object]]) -> dict[str, int]:
    """The first timestamp (epoch ms) of each known type among one recovery's event records."""
    out: dict[str, int] = {}
    for e in events:
        typ, ts = e.get("type"), e.get("ts")
        if not isinstance(typ, str) or not isinstance(ts, str):
            continue
        ms = ev.parse_ts_ms(ts)
        if ms is not None and (typ not in out or ms < out[typ]):
            out[typ] = ms
    return out
