"""Operator benchmarks: recovery timing in local mode, and the Kubernetes operator's cost.

``recovery`` (default 20 recoveries, ``--recoveries K`` for fewer): one ``kraftkeeper operator local``
cluster of 3 real node processes; K times, a simulated volume replacement of node 1, 2, 3, 1, ...
(the leader included, whenever it is the one picked) through the same code as
``kraftkeeper cluster replace-disk``. For each recovery:

* first fetch: the new replica's ``last_fetch_timestamp`` when the bench first sees the new
  (id, UUID) among the leader's observers (polled every 20 ms, so at most ~20 ms late);
* detection = operator's ``disk_replacement_detected`` - first fetch;
* stabilisation = ``replica_caught_up`` - ``disk_replacement_detected`` (includes the policy's
  stabilisation time, ``--stabilization-seconds``, default 2);
* add = ``add_voter_committed`` - ``add_voter_started``; remove likewise;
* deadline->add = ``add_voter_started`` - the stabilisation deadline (``replica_caught_up``'s
  ``detail.stable_since_ms`` + the stabilisation time): reaction time, no policy in it;
* commit->remove = ``remove_voter_started`` - ``add_voter_committed``: reaction time likewise;
* total = ``recovery_completed`` - first fetch.
The cluster runs with the default polling interval (0.5 s) and live window (5 s): the two reaction
times must not depend on either (the controller wakes on the deadline and right after a commit).
Times come from the operator's event log (millisecond timestamps) and the leader's clock, which
on one machine are the same clock. Median and p99 (nearest rank) are printed.

``cost`` (default 100 objects): a real etcd + kube-apiserver (the binaries
``scripts/k8s-testenv.sh install`` provides), ``kraftkeeper operator run`` in a subprocess, and N
KRaftQuorum objects whose replicas all resolve (test hook ``KRAFTKEEPER_ENDPOINT_OVERRIDES``) to one
shared real 3-node quorum on loopback, so every daemon pass does real describes. Reported: time
until all N are reconciled (status written), API requests and operator CPU seconds for that setup,
and for a steady window (``--window`` seconds, default 30) afterwards. API requests are the
kube-apiserver's own ``apiserver_request_total`` counter delta minus the bench's requests.

``--real``: the same two measurements on a real single-node Kubernetes (bench/operator_real.py:
``kubectl delete pod,pvc`` to recovery completed, split into Kubernetes' phases (old pod gone,
re-creation, volume, container start), the pod's own start (format, node start, first fetch) and
the operator's phases, each with its share of the total, printed next to the local-mode split of
the same invocation;
operator CPU and API requests with 100 objects, pods running for 3 of them). Needs root and
``scripts/k8s-node.sh install``. ``recovery --real --kafka``: Kafka controller pods replaced
instead (bench/kafka_real.py: the same Kubernetes phases, the controller's own start, the
operator's RemoveRaftVoter / AddRaftVoter).

Run from the repository root: ``python -m bench.operator [recovery|cost|all] [options]``; the
Apache Kafka rows: ``python -m bench.operator kafka [options]`` (bench/kafka_recovery.py).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import TypeVar

if __package__ in (None, ""):
    # Run as a file (`python bench/operator.py`): import `bench` from the repository root, and keep
    # this directory off the path, where operator.py would shadow the standard library's module.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


from bench import kafka_recovery
from bench.operator_cost import bench_cost
from bench.operator_local import bench_recovery

T = TypeVar("T")


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["kafka"]:
        # The Kafka rows: our watcher at stabilisation 0 and default, Kafka's auto-join
        # and the manual kafka-metadata-quorum path, on identical replacements of real controllers
        # (a follower's and the leader's in every round, interleaved).
        return kafka_recovery.main(args[1:])
    p = argparse.ArgumentParser(
        prog="python -m bench.operator",
        description=__doc__.split("\n\n")[0],
        epilog="python -m bench.operator kafka [--modes ... --roles ... --rounds N]: the Apache Kafka rows "
        "(bench/kafka_recovery.py).",
    )
    p.add_argument("what", nargs="?", choices=["recovery", "cost", "all"], default="all")
    p.add_argument("--recoveries", type=int, default=20)
    p.add_argument("--stabilization-seconds", type=float, default=2.0)
    p.add_argument("--objects", type=int, default=100)
    p.add_argument("--window", type=float, default=30.0)
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--real", action="store_true",
                   help="also on a real single-node Kubernetes (scripts/k8s-node.sh), next to local mode")
    p.add_argument("--volume-binding", choices=["WaitForFirstConsumer", "Immediate"],
                   default="WaitForFirstConsumer",
                   help="with --real: the bench quorum's StorageClass binding mode (bench/kubenode.py)")
    p.add_argument("--tls", action="store_true",
                   help="with --real: the bench quorum with TLS on (bench/operator_real.py)")
    p.add_argument("--kafka", action="store_true",
                   help="with --real: replace Kafka controller pods instead (bench/kafka_real.py)")
    a = p.parse_args(argv)
    if a.recoveries < 1 or a.objects < 1:
        p.error("--recoveries and --objects must be >= 1")
    if a.kafka:
        if not a.real or a.what != "recovery":
            p.error("--kafka needs `recovery --real`")
        return main_real_kafka(a.recoveries)
    if a.real:
        if a.stabilization_seconds != round(a.stabilization_seconds):
            p.error("--real needs a whole --stabilization-seconds (spec.recovery.stabilizationSeconds)")
        return main_real(a)
    workdir = Path(tempfile.mkdtemp(prefix="kk-bench-operator-"))
    try:
        if a.what in ("recovery", "all"):
            rows = bench_recovery(a.recoveries, a.stabilization_seconds, workdir)
            print(
                f"\nRecovery timing, local mode, {a.recoveries} recoveries, "
                f"stabilisation {a.stabilization_seconds:g} s (seconds)"
            )
            print(f"{'phase':<16}{'p50':>10}{'p99':>10}{'min':>10}{'max':>10}")
            for name, vals in rows.items():
                print(
                    f"{name:<16}{statistics.median(vals):>10.3f}{pct(vals, 99):>10.3f}{min(vals):>10.3f}"
                    f"{max(vals):>10.3f}"
                )
        if a.what in ("cost", "all"):
            try:
                r = bench_cost(a.objects, a.window, workdir)
            except RuntimeError as e:
                print(f"\nOperator cost: skipped ({e})")
            else:
                print(f"\nOperator cost, {int(r['objects'])} KRaftQuorum objects (real kube-apiserver)")
                print(
                    f"{'phase':<10}{'seconds':>10}{'API requests':>14}{'req/s':>10}{'CPU s':>10}{'CPU %':>8}"
                )
                for ph in ("setup", "steady"):
                    s = r[f"{ph}_seconds"]
                    print(
                        f"{ph:<10}{s:>10.1f}{r[f'{ph}_requests']:>14.0f}{r[f'{ph}_requests'] / s:>10.1f}"
                        f"{r[f'{ph}_cpu_seconds']:>10.2f}{100 * r[f'{ph}_cpu_seconds'] / s:>8.1f}"
                    )
    finally:
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"work directory kept: {workdir}")
    return 0


def main_real(a: argparse.Namespace) -> int:
    """``--real``: local mode and the real cluster in one invocation, printed side by side."""
    from bench.operator_real import KUBE_PHASES, PHASES, POD_PHASES
    from bench.operator_real import run as run_real

    workdir = Path(tempfile.mkdtemp(prefix="kk-bench-operator-"))
    try:
        local = bench_recovery(a.recoveries, a.stabilization_seconds, workdir) if a.what != "cost" else {}
        real, cost = run_real(a.recoveries, a.stabilization_seconds, a.objects, a.window, a.what,
                              a.volume_binding, a.tls)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if a.what != "cost":
        print(f"\nRecovery timing, {a.recoveries} replacements each, stabilisation "
              f"{a.stabilization_seconds:g} s (seconds; real: from `kubectl delete pod,pvc`, local: from the "
              "replaced node's first fetch)")
        print(f"{'phase':<16}{'real p50':>10}{'real p99':>10}{'share':>7}{'local p50':>11}{'local p99':>11}")
        total = statistics.median(real["total"]) if real.get("total") else 0.0
        for name in PHASES:
            r, lo = real.get(name) or [], local.get(name) or []
            cells = [f"{statistics.median(v):>10.3f}{pct(v, 99):>10.3f}" if v else f"{'-':>10}{'-':>10}"
                     for v in (r, lo)]
            part = r and total and name != "total"
            share = f"{100 * statistics.median(r) / total:>6.0f}%" if part else " " * 7
            print(f"{name:<16}{cells[0]}{share}{cells[1]}")
        if total:
            # The medians of the parts: Kubernetes' own work apart from the pod's start.
            kube = sum(statistics.median(real[p]) for p in KUBE_PHASES if real.get(p))
            pod = sum(statistics.median(real[p]) for p in POD_PHASES if real.get(p))
            print(f"real, to the first fetch: Kubernetes {kube:.2f} s ({100 * kube / total:.0f}%), "
                  f"the pod's own start {pod:.2f} s ({100 * pod / total:.0f}%); total p50 {total:.2f} s")
    if cost is not None:
        print(f"\nOperator cost on the real cluster, {int(cost['objects'])} KRaftQuorum objects "
              f"(3 with pods running)")
        print(f"setup: {cost['setup_seconds']:.1f} s, {cost['setup_requests']:.0f} API requests "
              f"(all clients), operator CPU {cost['setup_cpu_seconds']:.2f} s")
        print(f"steady ({cost['window']:g} s windows, running vs stopped): operator "
              f"{cost['steady_requests_per_s']:.2f} API requests/s "
              f"(others {cost['steady_other_requests_per_s']:.2f}/s), "
              f"operator CPU {cost['steady_cpu_percent']:.1f} %")
    return 0


def main_real_kafka(recoveries: int) -> int:
    """``recovery --real --kafka``: Kafka controller pods replaced on the real cluster."""
    from bench.kafka_real import KUBE_PHASES, OPERATOR_PHASES, PHASES, POD_PHASES
    from bench.kafka_real import run as run_kafka

    rows = run_kafka(recoveries)
    total = statistics.median(rows["total"])
    print(f"\nKafka controller pod replaced, {recoveries} replacements, stabilisation 0 (seconds, from "
          "`kubectl delete pvc,pod`)")
    print(f"{'phase':<18}{'p50':>8}{'share':>7}{'min':>8}{'max':>8}")
    for name in PHASES:
        v = rows[name]
        share = f"{100 * statistics.median(v) / total:>6.0f}%" if name != "total" else " " * 7
        print(f"{name:<18}{statistics.median(v):>8.2f}{share}{min(v):>8.2f}{max(v):>8.2f}")
    parts = {what: sum(statistics.median(rows[p]) for p in phases)
             for what, phases in (("Kubernetes", KUBE_PHASES), ("the pod's own start", POD_PHASES),
                                  ("the operator", OPERATOR_PHASES))}
    print("; ".join(f"{what} {s:.2f} s ({100 * s / total:.0f}%)" for what, s in parts.items())
          + f"; total p50 {total:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
