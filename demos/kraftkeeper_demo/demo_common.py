"""What both demos share (``demo`` for our engine, ``demo_kafka`` for real Kafka controllers): the
console lines, loopback port ranges, the demo's working directory, reading the event log back, and
printing one recovery's intervals exactly as the report names and measures them
(``kraftkeeper_reports.intervals``). Standard library and ``quorum.localports`` only: no Spark,
no operator imports.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from kraftkeeper_reports.intervals import (
    CATCH_UP,
    DEGRADED,
    EXPOSURE,
    REMOVE_THEN_ADD,
    TOTAL,
    UNDER_REPLICATED,
    durations,
    first_timestamps,
    fmt_ms,
    recorded_order,
)

from quorum.localports import NoFreePorts, free_port_range

MARKER = ".kraftkeeper-demo"


class DemoError(Exception):
    pass


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_base_port(n: int) -> int:
    """A base port with base..base+n all free on loopback (:mod:`quorum.localports`: outside the
    kernel's ephemeral range, probed as the servers bind), its failure as the demo's error."""
    try:
        return free_port_range(n + 1)
    except NoFreePorts as e:
        raise DemoError(str(e)) from None


def prepare_dir(d: Path, *foreign: str) -> str | None:
    """Make ``d`` ready for a demo run; returns an error message instead when ``d`` holds one of
    ``foreign`` (a cluster the demo did not make). A previous demo run (the marker file says the
    demo made it) is removed, so running the README's first command twice just works."""
    marker = d / MARKER
    if marker.exists():
        say(f"removing the previous demo run in {d}")
        shutil.rmtree(d)
    else:
        held = [f for f in foreign if (d / f).exists()]
        if held:
            return f"{d} already holds a cluster ({held[0]}); pass a new --dir or delete it"
    d.mkdir(parents=True, exist_ok=True)
    marker.write_text("created by kraftkeeper demo; the next demo run in this directory replaces it\n")
    return None


def read_events(events_dir: Path) -> list[dict[str, Any]]:
    """Every JSON object in the ``*.jsonl`` files under ``events_dir`` (unreadable lines skipped)."""
    out: list[dict[str, Any]] = []
    if not events_dir.exists():
        return out
    for p in sorted(events_dir.rglob("*.jsonl")):
        for line in p.read_text(errors="replace").splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


def print_intervals(evs: list[dict[str, Any]], healer: str = "") -> None:
    """One recovery's total, the time it tolerated one failure less, its dead-voter exposure,
    (RemoveThenAdd) the time a voter was missing, and catch-up: named and measured as the report
    does, in the voter-change order the recovery recorded (``intervals``), from its events."""
    first = first_timestamps(evs)
    order = recorded_order(first)
    d = durations(first)
    by = f"healed by {healer}, " if healer else ""
    say(f"  {by}order {order}; the report's intervals for this recovery:")
    shown = (TOTAL, DEGRADED, EXPOSURE, *((UNDER_REPLICATED,) if order == REMOVE_THEN_ADD else ()), CATCH_UP)
    for i in shown:
        say(f"  {i.span(order).title}: {fmt_ms(d[i.name])}")
