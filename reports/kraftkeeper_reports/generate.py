"""A realistic, deterministic generator of recovery event logs, for tests, benchmarks and demos.

The shape follows what a KIP-856 disk-failure recovery does (KIP-856 "Disk failure recovery"):
the replacement replica fetches the whole log as an observer (seconds to minutes, roughly log
size / fetch throughput, with a long right tail: lognormal), then the operator sends AddVoter and
RemoveVoter, each committed in milliseconds by one quorum round trip. Some recoveries fail:

* ``timeout``: catch-up did not finish before the operator's deadline (10 minutes here);
* ``replica_fell_behind``: the replica lagged again when AddVoter checked it (KIP-856 step 4,
  REPLICA_NOT_CAUGHT_UP), and the operator gave up after its retries;
* ``quorum_lost``: the leader was lost mid-recovery (leader_id is null on the failed event).

With ``engines`` naming Kafka, Kafka clusters record Kafka's order (KIP-853): RemoveVoter first,
by ``operator watch`` (``RemoveThenAdd``, with both *_started events and the same failures) or,
on every other Kafka cluster, by Kafka's own auto-join (``auto-join``: only committed steps, as
``kraftkeeper demo`` records them from outside, 5 events, never failed).

Many clusters (namespace/name) with their own log size and fetch throughput; a weekly pattern
and one cluster with a degraded week make the daily trend worth looking at. With
``malformed_rate`` > 0 a fraction of lines is damaged, one damage per line, each kind of bad
input the report counts, and a fraction of recoveries gets a recovery-level anomaly; the
returned :class:`GenerateStats` says how many of each were injected.

Output: ``OUT/date=YYYY-MM-DD/part-NNNNN.jsonl``, files of one day by the detection date of
their recoveries. Deterministic for a given seed and parameters, whatever ``workers`` is: each
day has its own random stream seeded from (seed, day).
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import random
import sys
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, fields
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TextIO

from kraftkeeper_reports import events as ev
from kraftkeeper_reports.intervals import ADD_THEN_REMOVE, AUTO_JOIN, REMOVE_THEN_ADD
from kraftkeeper_reports.recovery_steps import AT, TYP, Ev, Steps, Who, line, voter_changes

_NAMESPACES = ("payments", "search", "ingest", "billing", "identity", "analytics", "edge", "ml")
_NAMES = ("kraft-a", "kraft-b", "meta", "controller", "quorum")
EVENTS_PER_RECOVERY = 7.0  # a successful recovery emits 7; failed ones fewer (about 6.9 overall)

LINE_DAMAGE = (
    ev.MALFORMED_JSON, ev.NOT_AN_OBJECT, ev.MISSING_FIELD, ev.WRONG_TYPE, ev.INVALID_VALUE, ev.BAD_TIMESTAMP,
    ev.UNSUPPORTED_SCHEMA_VERSION, ev.UNKNOWN_TYPE, ev.EXTRA_FIELDS, ev.BLANK_LINE,
)
ENGINES = ("kraftkeeper", "kafka")
AUTO_JOIN_RECORDER = "kraftkeeper demo: DescribeQuorum every 50 ms"  # as demo_kafka writes it
RECOVERY_ANOMALIES = ("impossible_order", "event_after_end", "missing_detection", "duplicate_event")


@dataclass(frozen=True)
class ClusterProfile:
    name: str
    voters: int
    log_mb: float  # log size the new replica must fetch
    fetch_mb_s: float  # catch-up throughput
    weight: float  # share of the recoveries
    fail_rate: float


@dataclass
class GenerateStats:
    """What was written: counts that tests compare with the report."""

    files: int = 0
    lines: int = 0
    events: int = 0
    recoveries: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    failure_reasons: Counter[str] = field(default_factory=Counter)
    line_damage: Counter[str] = field(default_factory=Counter)
    recovery_anomalies: Counter[str] = field(default_factory=Counter)

    def merge(self, other: GenerateStats) -> None:
        for f in fields(self):
            mine = getattr(self, f.name)
            if isinstance(mine, Counter):
                mine.update(getattr(other, f.name))
            else:
                setattr(self, f.name, mine + getattr(other, f.name))

    def as_dict(self) -> dict[str, object]:
        values = ((f.name, getattr(self, f.name)) for f in fields(self))
        return {k: dict(v) if isinstance(v, Counter) else v for k, v in values}


def cluster_profiles(n: int, seed: int) -> list[ClusterProfile]:
    rng = random.Random(f"{seed}:clusters")
    out = []
    for i in range(n):
        ns = _NAMESPACES[i % len(_NAMESPACES)]
        name = _NAMES[(i // len(_NAMESPACES)) % len(_NAMES)]
        suffix = "" if i < len(_NAMESPACES) * len(_NAMES) else f"-{i}"
        out.append(
            ClusterProfile(
                name=f"{ns}/{name}{suffix}",
                voters=5 if rng.random() < 0.3 else 3,
                log_mb=math.exp(rng.uniform(math.log(80), math.log(12000))),
                fetch_mb_s=rng.uniform(40, 160),
                weight=rng.uniform(0.3, 2.0),
                fail_rate=rng.uniform(0.01, 0.05),
            )
        )
    return out


def _uuid(rng: random.Random) -> str:
    # KIP-856 directory ids print like Kafka's Uuid: 16 random bytes, base64url, no padding.
    return base64.urlsafe_b64encode(rng.getrandbits(128).to_bytes(16, "big")).decode()[:22]


@dataclass(frozen=True)
class _DayJob:
    day: date
    index: int  # day number from the start (the degraded week is keyed on it)
    counts: tuple[tuple[int, int], ...]  # (cluster index, recoveries)
    out: str
    files: int
    seed: int
    malformed_rate: float
    failure_scale: float
    profiles: tuple[ClusterProfile, ...]
    degraded_cluster: int
    degraded_days: tuple[int, int]
    engines: tuple[str, ...] = ()


def _damage(line: str, kind: str, rng: random.Random) -> list[str]:
    """The damaged form of one line (one kind of damage), as the lines that replace it."""
    if kind == ev.BLANK_LINE:
        return [line, ""]
    if kind == ev.MALFORMED_JSON:
        return [line[: rng.randrange(1, len(line) - 1)]]  # a torn write
    if kind == ev.NOT_AN_OBJECT:
        return [rng.choice(('["not", "an", "event"]', "42", '"text"', "null"))]
    obj = json.loads(line)
    if kind == ev.UNKNOWN_TYPE:
        extra = dict(obj, type=rng.choice(("leader_changed", "snapshot_fetched", "operator_restarted")))
        return [line, json.dumps(extra, separators=(",", ":"))]
    if kind == ev.MISSING_FIELD:
        del obj[rng.choice(ev.REQUIRED_FIELDS)]
    elif kind == ev.WRONG_TYPE:
        f = rng.choice(("replica_id", "leader_epoch", "cluster", "detail", "schema_version"))
        obj[f] = {"replica_id": "3", "leader_epoch": "7", "cluster": 12, "detail": "n/a",
                  "schema_version": "1"}[f]
    elif kind == ev.INVALID_VALUE:
        f = rng.choice(("replica_id", "recovery_id"))
        obj[f] = -1 if f == "replica_id" else " "
    elif kind == ev.BAD_TIMESTAMP:
        ts = obj["ts"]
        obj["ts"] = rng.choice(
            (ts[:-1], ts[:10] + " " + ts[11:], ts[:5] + "13" + ts[7:], ts[:19] + "Z", ts[:-1] + "+02:00")
        )
    elif kind == ev.UNSUPPORTED_SCHEMA_VERSION:
        obj["schema_version"] = 2
    elif kind == ev.EXTRA_FIELDS:
        obj["host"] = f"node-{rng.randrange(100)}"
    return [json.dumps(obj, separators=(",", ":"))]


@dataclass(frozen=True)
class _ClusterDay:
    """What every recovery of one cluster on one day shares."""

    prof: ClusterProfile
    degraded: bool
    order: str
    engine_detail: str  # extra detail fields of the detection event
    catch_median_ms: float
    fail_rate: float

    @staticmethod
    def of(job: _DayJob, ci: int) -> _ClusterDay:
        prof = job.profiles[ci]
        degraded = ci == job.degraded_cluster and job.degraded_days[0] <= job.index < job.degraded_days[1]
        catch_median_ms = 1500.0 + prof.log_mb / prof.fetch_mb_s * 1000.0
        engine_detail = ""
        order = ADD_THEN_REMOVE
        if job.engines:
            # Which engine runs this cluster, and its voter-change order (Kafka refuses a second
            # directory id for a voter id, so it removes first: RemoveThenAdd). Kafka clusters
            # take turns between `operator watch` and Kafka's own auto-join.
            engine = job.engines[ci % len(job.engines)]
            if engine == "kafka":
                order = AUTO_JOIN if (ci // len(job.engines)) % 2 else REMOVE_THEN_ADD
                catch_median_ms *= 1.3
            engine_detail = f',"engine":"{engine}","order":"{order}"'
            if order == AUTO_JOIN:
                engine_detail += f',"recorded_by":"{AUTO_JOIN_RECORDER}"'
        if order == AUTO_JOIN:
            fail_rate = 0.0  # Kafka retries by itself; the recorder logs no failure
        else:
            fail_rate = min(0.9, prof.fail_rate * job.failure_scale * (3.0 if degraded else 1.0))
        return _ClusterDay(prof, degraded, order, engine_detail, catch_median_ms, fail_rate)


class _Day:
    """One day's files: every recovery of every cluster, drawn from the day's own random stream."""

    def __init__(self, job: _DayJob, handles: Sequence[TextIO]) -> None:
        self.job, self.handles = job, handles
        self.rng = random.Random(f"{job.seed}:{job.day.isoformat()}")
        self.stats = GenerateStats(files=len(handles))
        d = job.day
        self.day_start = int(datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp() * 1000)

    def cluster(self, ci: int, count: int) -> None:
        rng, c = self.rng, _ClusterDay.of(self.job, ci)
        voters = c.prof.voters
        leader = rng.randrange(1, voters + 1)
        epoch = rng.randrange(3, 40) + self.job.index * 2
        starts = sorted(rng.randrange(0, 86_400_000) for _ in range(count))
        out = self.handles[ci % len(self.handles)]
        for seq, t0 in enumerate(starts):
            replica = rng.randrange(1, voters + 1)
            if replica == leader:  # a voter that lost its disk cannot be leading
                replica = replica % voters + 1
            if rng.random() < 0.04:  # an election happened since the last recovery
                leader = rng.choice([v for v in range(1, voters + 1) if v != replica])
                epoch += 1
            rid = f"r-{self.job.day:%Y%m%d}-{ci:03d}-{seq:06d}"
            who = Who(c.prof.name, rid, replica, _uuid(rng), _uuid(rng))
            s = Steps(rng, t0, leader, epoch)
            failed = self.recovery(c, s)
            if self.job.malformed_rate > 0:
                self.anomaly(s, failed)
            self.write(out, who, s.events)

    def recovery(self, c: _ClusterDay, s: Steps) -> str | None:
        """Draw one recovery's events into ``s``; the failure reason, None when it completed."""
        rng = self.rng
        log_bytes = int(c.prof.log_mb * 1_048_576 * rng.uniform(0.8, 1.2))
        catch = rng.lognormvariate(math.log(c.catch_median_ms * (3.0 if c.degraded else 1.0)), 0.55)
        s.add(ev.DISK_REPLACEMENT_DETECTED, 0, f'{{"log_bytes":{log_bytes}{c.engine_detail}}}')
        failed: str | None = None
        if rng.random() < c.fail_rate:
            failed = rng.choices(ev.FAILURE_REASONS, weights=(0.5, 0.3, 0.2))[0]
        if catch >= 600_000 and c.order != AUTO_JOIN:  # the operator's catch-up deadline (10 min)
            failed = "timeout"
        if failed == "timeout":
            s.fail(failed)
        else:
            s.add(ev.REPLICA_CAUGHT_UP, int(catch), f'{{"fetched_bytes":{log_bytes}}}')
            voter_changes(s, c.order, c.prof.voters, failed)
        self.stats.recoveries += 1
        self.stats.outcomes["failed" if failed else "completed"] += 1
        if failed:
            self.stats.failure_reasons[failed] += 1
        return failed

    def anomaly(self, s: Steps, failed: str | None) -> None:
        """Maybe give the recovery an anomaly: what an operator restart or a clock step produces."""
        rng, evs = self.rng, s.events
        if not (rng.random() < self.job.malformed_rate * 4 and len(evs) >= 3):
            return
        kind = rng.choice(RECOVERY_ANOMALIES)
        if kind == "impossible_order" and len(evs) >= 4:
            # add_voter_committed stamped before add_voter_started (clock stepped back); in the
            # other orders the step after caught up is stamped before it.
            add_first = (evs[2][TYP], evs[3][TYP]) == (ev.ADD_VOTER_STARTED, ev.ADD_VOTER_COMMITTED)
            i = 3 if add_first else 2
            evs[i] = _moved(evs[i], evs[i - 1][AT] - rng.randrange(5, 500))
        elif kind == "event_after_end":
            typ = ev.REPLICA_CAUGHT_UP if failed else ev.REMOVE_VOTER_COMMITTED
            evs.append((typ, evs[-1][AT] + rng.randrange(10, 5000), s.leader, s.epoch, "{}"))
        elif kind == "missing_detection":
            del evs[0]
        elif kind == "duplicate_event":
            evs.insert(2, _moved(evs[1], evs[1][AT] + rng.randrange(1, 50)))
        else:
            return
        self.stats.recovery_anomalies[kind] += 1

    def write(self, out: TextIO, who: Who, evs: list[Ev]) -> None:
        """Write the recovery's lines, each damaged with probability ``malformed_rate``."""
        m, rng, stats = self.job.malformed_rate, self.rng, self.stats
        for e in evs:
            text = line(self.day_start, who, e)
            stats.events += 1
            if m > 0 and rng.random() < m:
                kind = rng.choice(LINE_DAMAGE)
                stats.line_damage[kind] += 1
                out_lines = _damage(text, kind, rng)
            else:
                out_lines = [text]
            for ln in out_lines:
                out.write(ln)
                out.write("\n")
                stats.lines += 1


def _moved(e: Ev, at: int) -> Ev:
    return (e[TYP], at, e[2], e[3], e[4])


def _generate_day(job: _DayJob) -> GenerateStats:
    day_dir = Path(job.out) / f"date={job.day.isoformat()}"
    day_dir.mkdir(parents=True, exist_ok=True)
    handles = [
        open(day_dir / f"part-{k:05d}.jsonl", "w", encoding="utf-8", buffering=1 << 20)
        for k in range(job.files)
    ]
    try:
        day = _Day(job, handles)
        for ci, count in job.counts:
            day.cluster(ci, count)
    finally:
        for h in handles:
            h.close()
    return day.stats


def generate(
    out: str | Path,
    events: int = 100_000,
    clusters: int = 12,
    days: int = 30,
    start: date = date(2026, 10, 1),
    seed: int = 1,
    malformed_rate: float = 0.001,
    failure_scale: float = 1.0,
    files_per_day: int = 2,
    workers: int = 1,
    engines: tuple[str, ...] = (),
) -> GenerateStats:
    """Write about ``events`` events (within one recovery's worth per day and cluster) under
    ``out`` and return what was written. ``malformed_rate``: fraction of lines damaged (each
    kind equally likely) and, times four, of recoveries given an anomaly; 0 for clean data.
    ``engines`` (e.g. ("kraftkeeper", "kafka")): clusters take turns, and each recovery's
    detection event names its engine and voter-change order in ``detail`` (the report then
    compares them side by side)."""
    if events <= 0 or clusters <= 0 or days <= 0 or files_per_day <= 0:
        raise ValueError("events, clusters, days and files_per_day must be positive")
    if not 0.0 <= malformed_rate < 0.25:
        raise ValueError("malformed_rate must be in [0, 0.25)")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise ValueError(f"engines: unknown engine {unknown[0]!r} (known: {', '.join(ENGINES)})")
    profiles = tuple(cluster_profiles(clusters, seed))
    rng = random.Random(f"{seed}:plan")
    recoveries = max(1, round(events / EVENTS_PER_RECOVERY))
    # Fewer disks are swapped at weekends; a gentle upward drift as the fleet grows.
    day_w = [
        (0.55 if (start + timedelta(d)).weekday() >= 5 else 1.0) * (1 + 0.01 * d) * rng.uniform(0.85, 1.15)
        for d in range(days)
    ]
    total_w = sum(day_w) * sum(p.weight for p in profiles)
    degraded_cluster = rng.randrange(clusters)
    d0 = days // 2
    jobs = []
    for d in range(days):
        counts = []
        for ci, p in enumerate(profiles):
            exact = recoveries * day_w[d] * p.weight / total_w
            n = int(exact) + (1 if rng.random() < exact - int(exact) else 0)
            if n:
                counts.append((ci, n))
        jobs.append(
            _DayJob(start + timedelta(d), d, tuple(counts), str(out), files_per_day, seed, malformed_rate,
                    failure_scale, profiles, degraded_cluster, (d0, min(days, d0 + 7)), tuple(engines))
        )
    Path(out).mkdir(parents=True, exist_ok=True)
    stats = GenerateStats()
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for s in pool.map(_generate_day, jobs):
                stats.merge(s)
    else:
        for j in jobs:
            stats.merge(_generate_day(j))
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kraftkeeper_reports.generate", description="Write a realistic recovery event log."
    )
    ap.add_argument("--out", required=True, help="output directory (date=YYYY-MM-DD/ partitions)")
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--clusters", type=int, default=12)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--malformed-rate", type=float, default=0.001)
    ap.add_argument("--files-per-day", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--engines", default="",
                    help="comma-separated engines clusters take turns on, e.g. kraftkeeper,kafka (Kafka "
                         "clusters: RemoveThenAdd by operator watch, or Kafka's auto-join); default none")
    a = ap.parse_args(argv)
    engines = tuple(e for e in a.engines.split(",") if e)
    try:
        stats = generate(a.out, a.events, a.clusters, a.days, seed=a.seed, malformed_rate=a.malformed_rate,
                         files_per_day=a.files_per_day, workers=a.workers, engines=engines)
    except (ValueError, OSError) as e:
        print(f"INVALID_REQUEST: {e}", file=sys.stderr)
        return 2
    print(json.dumps(stats.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
