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
``scripts/k8s-node.sh install``.

Run from the repository root: ``python -m bench.operator [recovery|cost|all] [options]``; the
Apache Kafka rows: ``python -m bench.operator kafka [options]`` (bench/kafka_recovery.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from quorum.localports import free_port_range

if __package__ in (None, ""):
    # Run as a file (`python bench/operator.py`): import `bench` from the repository root, and keep
    # this directory off the path, where operator.py would shadow the standard library's module.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from kraftkeeper_reports import vocabulary as ev

from bench import kafka_recovery
from testkit.polling import wait_until

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def poll(what: str, fn: Callable[[], T | None], timeout: float, every: float = 0.05) -> T:
    # Errors are transient here: a node restarting, the leader moving.
    return wait_until(what, fn, timeout, every, errors=(Exception,))




def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


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
    base = free_port_range(nodes + 1)
    log = d.parent / "operator-local.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quorum.cli",
            "operator",
            "local",
            "--dir",
            str(d),
            "--nodes",
            str(nodes),
            "--base-port",
            str(base),
            *extra,
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


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


# ---------------------------------------------------------------------------------------------


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
        poll(
            "a leader with 3 known voters",
            lambda: (x := describe(eps)) and len(x["voters"]) == 3 and all(v["uuid"] for v in x["voters"]),
            timeout=120,
            every=0.2,
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

            fetched = poll(f"first fetch of ({node}, {new})", first_fetch, timeout=120, every=0.02)

            def completed(new: str = new) -> list[dict[str, Any]] | None:
                evs = read_events(d)
                done = [e for e in evs if e["type"] == ev.RECOVERY_COMPLETED and e["new_uuid"] == new]
                if not done:
                    return None
                rid = done[0]["recovery_id"]
                return [e for e in evs if e["recovery_id"] == rid]

            evs = poll(f"recovery {i + 1} completed", completed, timeout=300, every=0.1)
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


# ---------------------------------------------------------------------------------------------


def _api_requests(kube: Any) -> float:
    st, text = kube.request("GET", "/metrics", accept="text/plain")
    if st != 200:
        raise RuntimeError(f"kube-apiserver /metrics: {st}")
    total = 0.0
    for line in str(text).splitlines():
        if line.startswith("apiserver_request_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@contextmanager
def kube_apiserver() -> Iterator[Any]:
    """etcd + kube-apiserver, started as the tests start them (:mod:`testkit.kubeapi`)."""
    from testkit.kubeapi import KubeApiMissing, start_kube_apiserver

    try:
        cm = start_kube_apiserver()
        env = cm.__enter__()
    except KubeApiMissing as e:
        raise RuntimeError(f"test kube-apiserver unavailable: {e}") from None
    try:
        yield env
    finally:
        cm.__exit__(None, None, None)


def bench_cost(n: int, window: float, workdir: Path) -> dict[str, float]:
    import psutil
    import yaml

    results: dict[str, float] = {}
    with (
        kube_apiserver() as kube,
        local_cluster(workdir / "shared-quorum", 3, ["--no-recovery", "--insecure"]) as (base, _),
    ):
        crd = yaml.safe_load((REPO / "crds" / "kraftquorums.kraftkeeper.io.yaml").read_text())
        st, body = kube.apply(crd)
        assert st in (200, 201), body
        poll(
            "CRD served",
            lambda: kube.request("GET", "/apis/kraftkeeper.io/v1alpha1/kraftquorums")[0] == 200,
            timeout=60,
            every=0.2,
        )
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        kube.request(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )
        overrides = {f"{ns}/q{j}/{k}": f"127.0.0.1:{base + k + 1}" for j in range(n) for k in range(3)}
        eps = [f"127.0.0.1:{base + i}" for i in (1, 2, 3)]
        poll("shared quorum leader", lambda: describe(eps)["leader_id"] > 0, timeout=120, every=0.2)
        env = kube.env()
        env.update(
            KRAFTKEEPER_METRICS_PORT="0",
            KRAFTKEEPER_ENDPOINT_OVERRIDES=json.dumps(overrides),
            KRAFTKEEPER_RECONCILE_INTERVAL="2",
        )
        log = workdir / "operator-run.log"
        op = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "quorum.cli",
                "operator",
                "run",
                "--standalone",
                "--namespace",
                ns,
                "--quiet",
            ],
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            ps = psutil.Process(op.pid)
            time.sleep(0.5)  # let the interpreter start before sampling (no assertion depends on it)
            req0, cpu0, t0 = _api_requests(kube), sum(ps.cpu_times()[:2]), time.monotonic()
            bench_requests = 1
            for j in range(n):
                st, body = kube.request(
                    "POST",
                    f"/apis/kraftkeeper.io/v1alpha1/namespaces/{ns}/kraftquorums",
                    {
                        "apiVersion": "kraftkeeper.io/v1alpha1",
                        "kind": "KRaftQuorum",
                        "metadata": {"name": f"q{j}"},
                        # Plaintext like the shared quorum they all resolve to (--insecure).
                        "spec": {"voters": 3, "recovery": {"stabilizationSeconds": 5},
                                 "tls": {"mode": "Disabled"}},
                    },
                )
                assert st == 201, body
                bench_requests += 1

            def all_running() -> bool:
                nonlocal bench_requests
                bench_requests += 1
                st, lst = kube.request("GET", f"/apis/kraftkeeper.io/v1alpha1/namespaces/{ns}/kraftquorums")
                items = lst.get("items", []) if st == 200 else []
                return len(items) == n and all(
                    (i.get("status") or {}).get("phase") == "Running" for i in items
                )

            poll(f"{n} quorums Running", all_running, timeout=600, every=1.0)
            req1, cpu1, t1 = _api_requests(kube), sum(ps.cpu_times()[:2]), time.monotonic()
            results["setup_seconds"] = t1 - t0
            results["setup_requests"] = req1 - req0 - bench_requests
            results["setup_cpu_seconds"] = cpu1 - cpu0
            time.sleep(window)  # the steady-state window being measured (nothing polls during it)
            req2, cpu2, t2 = _api_requests(kube), sum(ps.cpu_times()[:2]), time.monotonic()
            results["steady_seconds"] = t2 - t1
            results["steady_requests"] = req2 - req1 - 1
            results["steady_cpu_seconds"] = cpu2 - cpu1
            results["objects"] = n
        finally:
            op.send_signal(signal.SIGTERM)
            try:
                op.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(op.pid, signal.SIGKILL)
                op.wait()
    return results


# ---------------------------------------------------------------------------------------------


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
    a = p.parse_args(argv)
    if a.recoveries < 1 or a.objects < 1:
        p.error("--recoveries and --objects must be >= 1")
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
        real, cost = run_real(a.recoveries, a.stabilization_seconds, a.objects, a.window, a.what)
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


if __name__ == "__main__":
    raise SystemExit(main())
