"""The operator's reaction times over local recoveries: ``kraftkeeper operator local`` on a
loopback cluster, K disk replacements one after another, each timed from its recovery events
(stabilisation deadline to AddVoter started, AddVoter committed to RemoveVoter started), and the
helpers the cost bench (:mod:`bench.operator_cost`) shares; :mod:`bench.operator` is the command
line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kraftkeeper_reports import vocabulary as ev

from testkit.launchers import reported_base_port, start_operator_local, stop_process
from testkit.polling import wait_until

REPO = Path(__file__).resolve().parents[1]


# Errors count as "not yet" while waiting here: a node restarting, the leader moving.
TRANSIENT = (Exception,)


def http_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def describe(eps: list[str]) -> dict[str, Any]:
    """The leader's describe (other nodes answer 421 with a hint; try each)."""
    last: Exception | None = None
    for ep in eps:
        try:
            data: dict[str, Any] = http_json(f"http://{ep}/v1/quorum/describe", 2.0)
            return data
        except Exception as e:
            last = e
    raise RuntimeError(f"no leader answered: {last}")


@contextmanager
def local_cluster(d: Path, nodes: int, extra: list[str]) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    log = d.parent / "operator-local.log"
    proc = start_operator_local(d, nodes, 0, extra, log)
    try:
        yield reported_base_port(d, proc, log), proc
    finally:
        stop_process(proc)


def read_events(d: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in sorted((d / "events").rglob("*.jsonl")):
        out += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    return out


def ts_ms(e: dict[str, Any]) -> int:
    from kraftkeeper_reports.events import parse_ts_ms

    v = parse_ts_ms(e["ts"])
    assert v is not None
    return v


def bench_recovery(k: int, stabilization: float, workdir: Path) -> dict[str, list[float]]:
    from kraftkeeper_operator.local.cluster import ClusterLayout, replace_disk

    d = workdir / "bench-local"
    names = ("detection", "stabilisation", "deadline->add", "add", "commit->remove", "remove", "total")
    rows: dict[str, list[float]] = {n: [] for n in names}
    # --insecure: the bench reads the leader's describe over plain HTTP without a credential (as the
    # real-path bench does with spec.tls.mode Disabled); the recovery's steps are the same.
    extra = ["--stabilization-seconds", str(stabilization), "--insecure"]
    with local_cluster(d, 3, extra) as (base, proc):
        eps = [f"127.0.0.1:{base + i}" for i in (1, 2, 3)]
        wait_until(
            "a leader with 3 known voters",
            lambda: (x := describe(eps)) and len(x["voters"]) == 3 and all(v["uuid"] for v in x["voters"]),
            timeout=120, interval=0.2, errors=TRANSIENT,
        )
        layout = ClusterLayout.load(d)
        for i in range(k):
            node = i % 3 + 1
            new = replace_disk(layout, node)

            def first_fetch(new: str = new, node: int = node) -> int | None:
                x = describe(eps)
                for o in x["observers"] + x["voters"]:
                    if o["id"] == node and o["uuid"] == new and o["last_fetch_timestamp"] >= 0:
                        return int(o["last_fetch_timestamp"])
                return None

            fetched = wait_until(
                f"first fetch of ({node}, {new})", first_fetch, timeout=120, interval=0.02, errors=TRANSIENT,
            )

            def completed(new: str = new) -> list[dict[str, Any]] | None:
                evs = read_events(d)
                done = [e for e in evs if e["type"] == ev.RECOVERY_COMPLETED and e["new_uuid"] == new]
                if not done:
                    return None
                rid = done[0]["recovery_id"]
                return [e for e in evs if e["recovery_id"] == rid]

            evs = wait_until(
                f"recovery {i + 1} completed", completed, timeout=300, interval=0.1, errors=TRANSIENT,
            )
            at = {e["type"]: ts_ms(e) for e in evs}  # the last of each type wins
            first = {e["type"]: ts_ms(e) for e in reversed(evs)}
            rows["detection"].append((first[ev.DISK_REPLACEMENT_DETECTED] - fetched) / 1000)
            rows["stabilisation"].append(
                (at[ev.REPLICA_CAUGHT_UP] - first[ev.DISK_REPLACEMENT_DETECTED]) / 1000
            )
            caught = next(e for e in evs if e["type"] == ev.REPLICA_CAUGHT_UP)
            deadline = int(caught["detail"]["stable_since_ms"]) + round(stabilization * 1000)
            rows["deadline->add"].append((first[ev.ADD_VOTER_STARTED] - deadline) / 1000)
            rows["add"].append((at[ev.ADD_VOTER_COMMITTED] - at[ev.ADD_VOTER_STARTED]) / 1000)
            rows["commit->remove"].append(
                (first[ev.REMOVE_VOTER_STARTED] - at[ev.ADD_VOTER_COMMITTED]) / 1000
            )
            rows["remove"].append((at[ev.REMOVE_VOTER_COMMITTED] - at[ev.REMOVE_VOTER_STARTED]) / 1000)
            rows["total"].append((at[ev.RECOVERY_COMPLETED] - fetched) / 1000)
            print(f"  recovery {i + 1}/{k}: node {node}, total {rows['total'][-1]:.3f} s", file=sys.stderr)
        if proc.poll() is not None:
            raise RuntimeError("operator local exited during the bench")
    return rows
