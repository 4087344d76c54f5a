"""The intervals a recovery report measures, defined once for the Spark job, the HTML report and
the demo's console (so a number printed by ``kraftkeeper demo`` and one in the report mean the same).

Every interval runs between the first events of two types of one recovery, and which two depends
on the voter-change order the recovery actually recorded:

* ``AddThenRemove`` (KIP-856 "Disk failure recovery"): the replacement catches up as an observer,
  is added with AddVoter, then the old (id, UUID) is removed with RemoveVoter. The voter set never
  shrinks; it holds four voters, one dead, between the two commits.
* ``RemoveThenAdd`` (Kafka 4.x, KIP-853: a voter id has one directory id, so the old one goes
  first; ``operator watch`` and Kafka's own auto-join): RemoveVoter, then AddVoter. Between the two
  commits the voter set is one short (two of three).

In both orders the quorum tolerates one failure less than configured from the loss of the disk
until the *second* voter change commits: with a dead voter in the set (majority 2 of 3 with 2
live, or 3 of 4 with 3 live) and, in RemoveThenAdd, then with a voter missing (2 of 2). That
window is ``degraded``; ``exposure`` is its part with the dead (id, old UUID) still a voter.

A recovery's order is read from its own timestamps (:func:`recorded_order`, the same rule in
Spark), not from ``detail.order``: Kafka's auto-join is labelled ``auto-join`` and records
RemoveThenAdd. Pure standard library: the demo uses it without Spark.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from kraftkeeper_reports import events as ev

ADD_THEN_REMOVE: Final = "AddThenRemove"
REMOVE_THEN_ADD: Final = "RemoveThenAdd"
ORDERS: Final = (ADD_THEN_REMOVE, REMOVE_THEN_ADD)
AUTO_JOIN: Final = "auto-join"  # detail.order of Kafka's auto-join, recorded from outside
# detail.order labels and the voter-change order each one records (auto-join removes first).
LABEL_ORDER: Final = {ADD_THEN_REMOVE: ADD_THEN_REMOVE, REMOVE_THEN_ADD: REMOVE_THEN_ADD,
                      AUTO_JOIN: REMOVE_THEN_ADD}
# Evidence of the order, strongest first: RemoveThenAdd when the first event of the first type
# precedes the first of the second; the first pair with both present decides; else AddThenRemove.
ORDER_EVIDENCE: Final = (
    (ev.REMOVE_VOTER_COMMITTED, ev.ADD_VOTER_COMMITTED),
    (ev.REMOVE_VOTER_STARTED, ev.ADD_VOTER_STARTED),
)


@dataclass(frozen=True)
class Span:
    """From the first ``start`` event to the first ``end`` event, as a reader sees it."""

    start: str
    end: str
    title: str
    meaning: str


@dataclass(frozen=True)
class Interval(Span):
    """``name`` (a column stem: ``<name>_ms``) with its span in each voter-change order. Its own
    ``start``/``end``/``title``/``meaning`` are the AddThenRemove span's (KIP-856's)."""

    name: str
    spans: Mapping[str, Span]

    @classmethod
    def of(cls, name: str, spans: Mapping[str, Span]) -> Interval:
        k = spans[ADD_THEN_REMOVE]
        return cls(k.start, k.end, k.title, k.meaning, name, spans)

    def span(self, order: str) -> Span:
        return self.spans[order if order in self.spans else ADD_THEN_REMOVE]

    def same_in_both(self) -> bool:
        a, r = self.spans[ADD_THEN_REMOVE], self.spans[REMOVE_THEN_ADD]
        return (a.start, a.end) == (r.start, r.end)

    def _known(self, orders: set[str] | frozenset[str]) -> list[str]:
        """The orders among ``orders`` this interval has a span for; KIP-856's when none is."""
        return sorted(o for o in orders if o in self.spans) or [ADD_THEN_REMOVE]

    def title_for(self, orders: set[str] | frozenset[str]) -> str:
        """The title for a table over recoveries of ``orders``: one order's own title, or, for a
        mix whose spans differ, both spans named with their order."""
        known = self._known(orders)
        if len(known) == 1 or self.same_in_both():
            return self.span(known[0]).title
        both = "; ".join(f"{o}: {self.spans[o].title.split(': ', 1)[1]}" for o in known)
        return f"{self.head_for(orders)} ({both})"

    def head_for(self, orders: set[str] | frozenset[str]) -> str:
        """The title's short name (before its colon) for ``orders``: a column heading."""
        return " / ".join(dict.fromkeys(self.spans[o].title.split(":")[0] for o in self._known(orders)))

    def meaning_for(self, orders: set[str] | frozenset[str]) -> str:
        known = self._known(orders)
        if len(known) == 1 or self.spans[known[0]].meaning == self.spans[known[-1]].meaning:
            return self.span(known[0]).meaning
        return "; ".join(f"{o}: {self.spans[o].meaning}" for o in known)


_A = "\u2192"
_DET, _CU = ev.DISK_REPLACEMENT_DETECTED, ev.REPLICA_CAUGHT_UP
_AVC, _RVC, _DONE = ev.ADD_VOTER_COMMITTED, ev.REMOVE_VOTER_COMMITTED, ev.RECOVERY_COMPLETED
_LOWER_BOUND = " (a lower bound: the disk was gone before it was detected)"


def _both(start: str, end: str, title: str, meaning: str) -> dict[str, Span]:
    s = Span(start, end, title, meaning)
    return {ADD_THEN_REMOVE: s, REMOVE_THEN_ADD: s}


# One row per interval, in the order the report shows them: AddThenRemove's span, RemoveThenAdd's.
_TABLE: Final = (
    ("catch_up", _both(_DET, _CU, f"Catch-up: detection {_A} caught up",
                       "the new replica fetches the log as an observer")),
    ("add_voter", {
        ADD_THEN_REMOVE: Span(_CU, _AVC, f"AddVoter: caught up {_A} AddVoter committed",
                              "stabilisation wait and operator reaction plus one AddVoter round"),
        REMOVE_THEN_ADD: Span(_RVC, _AVC, f"AddVoter: RemoveVoter committed {_A} AddVoter committed",
                              "operator reaction plus one AddVoter round (the second change)"),
    }),
    ("remove_voter", {
        ADD_THEN_REMOVE: Span(_AVC, _RVC, f"RemoveVoter: AddVoter committed {_A} RemoveVoter committed",
                              "operator reaction plus one RemoveVoter round"),
        REMOVE_THEN_ADD: Span(_CU, _RVC, f"RemoveVoter: caught up {_A} RemoveVoter committed",
                              "stabilisation wait and operator reaction plus one RemoveVoter round "
                              "(the first change)"),
    }),
    ("under_replicated", {
        ADD_THEN_REMOVE: Span(_DET, _AVC, f"Replacement not yet a voter: detection {_A} AddVoter committed",
                              "until the replacement (id, new UUID) is a committed voter" + _LOWER_BOUND),
        REMOVE_THEN_ADD: Span(_RVC, _AVC, f"Voter missing: RemoveVoter committed {_A} AddVoter committed",
                              "the voter set is one short (two of three): a majority of it is every "
                              "voter, so no failure is tolerated"),
    }),
    ("exposure", _both(_DET, _RVC, f"Dead voter in set: detection {_A} RemoveVoter committed",
                       "the quorum ran with the dead (id, old UUID) as a voter, tolerating one failure "
                       "less" + _LOWER_BOUND)),
    ("degraded", {
        ADD_THEN_REMOVE: Span(_DET, _RVC, f"One failure less tolerated: detection {_A} RemoveVoter committed",
                              "a dead voter in the set until the second change (RemoveVoter) commits"
                              + _LOWER_BOUND),
        REMOVE_THEN_ADD: Span(_DET, _AVC, f"One failure less tolerated: detection {_A} AddVoter committed",
                              "a dead voter in the set, then a voter missing, until the second change "
                              "(AddVoter) commits" + _LOWER_BOUND),
    }),
    ("total", _both(_DET, _DONE, f"Total: detection {_A} recovery completed",
                    "the whole recovery as the operator logged it")),
)

INTERVALS: Final = tuple(Interval.of(name, spans) for name, spans in _TABLE)
BY_NAME: Final = {i.name: i for i in INTERVALS}
PHASES: Final = tuple(i.name for i in INTERVALS)
CATCH_UP: Final = BY_NAME["catch_up"]
ADD_VOTER: Final = BY_NAME["add_voter"]
REMOVE_VOTER: Final = BY_NAME["remove_voter"]
UNDER_REPLICATED: Final = BY_NAME["under_replicated"]
EXPOSURE: Final = BY_NAME["exposure"]
DEGRADED: Final = BY_NAME["degraded"]
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


def recorded_order(first_ms: Mapping[str, float | int | None]) -> str:
    """The voter-change order one recovery's first timestamps show (see ``ORDER_EVIDENCE``)."""
    for a, b in ORDER_EVIDENCE:
        ta, tb = first_ms.get(a), first_ms.get(b)
        if ta is None or tb is None or (isinstance(ta, float) and math.isnan(ta)) or (
            isinstance(tb, float) and math.isnan(tb)
        ):
            continue
        return REMOVE_THEN_ADD if ta < tb else ADD_THEN_REMOVE
    return ADD_THEN_REMOVE


def durations(first_ms: Mapping[str, int]) -> dict[str, int | None]:
    """Each interval in ms from the first timestamp (epoch ms) of each event type of one
    recovery, in the order it recorded; None where an end is missing or precedes its start."""
    order = recorded_order(first_ms)
    out: dict[str, int | None] = {}
    for i in INTERVALS:
        s = i.span(order)
        a, b = first_ms.get(s.start), first_ms.get(s.end)
        out[i.name] = None if a is None or b is None or b < a else b - a
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
