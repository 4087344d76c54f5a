"""Operator benchmark, the real path (``python -m bench.operator --real``).

Runs on the single-node Kubernetes of ``scripts/k8s-node.sh`` (kubelet + containerd; started here
when it is not running and stopped again at the end) with the product image built by
``scripts/build-image.sh`` and imported into containerd, as tests/kubelet does, and the chart
installed as release ``kkbench`` in namespace ``kk-bench-system`` (namespace-scoped RBAC watching
``kk-bench`` and ``kk-bench-idle``; its own release, so a tests/kubelet operator is left alone).

``recovery``: K times (``--recoveries``, at least 10 for a p99 worth printing), ``kubectl delete
pod,pvc`` of replica 1, 2, 3, 1, ... of the 3-voter KRaftQuorum ``bench`` (the leader included
whenever it is the one picked), and the time from that command to ``recovery_completed``, split:

Kubernetes' part:

* old pod gone: the delete -> the old pod object gone (the kubelet stopped its node: SIGTERM, the
  node's graceful shutdown; volumes unmounted; the object removed);
* re-creation: -> the StatefulSet's new pod object (a new uid) first seen;
* volume: new pod -> its re-created claim ``Bound`` to a fresh local PV (the scheduler binds it:
  the StorageClass is WaitForFirstConsumer);
* container start: claim bound -> the node container's first log line (the kubelet's volume
  mounts, the sandbox and its network, any init container, the container's create and start);

the pod's own start, from the node container's log (``kubectl logs --timestamps``: the container
runtime's clock, nanoseconds):

* format: the container's first line (its shell's) -> the ``Formatted`` line, printed by the
  node's own process (``kraftkeeper start --format-cluster-id``): the interpreter's start, the
  storage code's imports and the new volume's format;
* node start: -> the node's ``listening on`` line (the rest of its imports, TLS, opening the log);
* first fetch: -> the new replica's first fetch (the leader's ``last_fetch_timestamp`` of the new
  (id, UUID));
* detection, stabilisation, deadline->add, add, commit->remove, remove: as in local mode
  (bench/operator.py), from the operator's own event log (``spec.eventLog.path`` on its /data
  volume, read with ``kubectl exec``).

The bench observes pods, claims and the leader's describe every ~50 ms from the host (pod IPs are
on the node's bridge). The ``bench`` quorum runs with ``spec.tls.mode: Disabled`` for that reason
only: the bench holds no admin credential of an Operator-mode CA. Every clock involved (the bench,
the nodes, the operator) is the host's clock.

``--tls`` (``run(..., tls=True)``): the same with TLS on (the default ``Operator`` mode). The
bench then cannot describe the quorum, so "first fetch" runs to the operator's detection (and
"detection" is 0). The new pod formats its volume with its spare certificate's UUID and starts
once (docs/operator.md "Certificates bound to the disk"); where a revision (or a quorum without a
spare) takes the old path instead, the new pod's node refuses the old disk's certificate, the
operator issues one for the new disk and deletes the pod once, and the pod phases are those of
the pod that then starts ("container start" includes the first one).

``cost``: 100 KRaftQuorum objects (``--objects``): the 3 in ``kk-bench`` have pods running (3
voters each); the others are in ``kk-bench-idle``, where a ResourceQuota of 0 pods keeps their
StatefulSets empty (the operator still reconciles every object on every pass). Setup: time, API
requests and operator CPU from the first create until every object has a status and the 3 live
ones are Available. Steady state: windows of ``--window`` seconds, alternately with the operator
running and stopped (SIGSTOP of its process on the host, SIGCONT after; the windows are shorter
than its liveness probe's 60 s), so the kube-apiserver's ``apiserver_request_total`` delta of the
stopped windows (kubelet, controllers, this bench) can be subtracted from that of the running ones.

Re-used local PersistentVolumes (``scripts/k8s-node.sh`` makes 32, each used once) are recycled
here: a Released volume of the bench's namespaces is emptied and made Available again.
"""

from __future__ import annotations

import json
import signal
import statistics
import sys
import time
import urllib.error
import urllib.request
from contextlib import suppress
from typing import Any, TypeVar

from kraftkeeper_reports import vocabulary as ev
from kraftkeeper_reports.events import parse_ts_ms

from bench.kubenode import (
    IMAGE,
    NS_IDLE,
    NS_LIVE,
    OP_NS,
    RELEASE,
    Kube,
    immediate_class,
    install,
    node_cluster,
    recycle_pvs,
    uninstall,
)
from bench.operator_local import ts_ms
from quorum.timefmt import now_ms
from testkit.polling import wait_until

T = TypeVar("T")
KUBE_PHASES = ("old pod gone", "re-creation", "volume", "container start")
POD_PHASES = ("format", "node start", "first fetch")
PHASES = (*KUBE_PHASES, *POD_PHASES, "detection", "stabilisation", "deadline->add", "add",
          "commit->remove", "remove", "total")


# Errors count as "not yet" while waiting here: a pod restarting, the leader moving.
TRANSIENT = (Exception,)


def quorum(name: str, stabilization: float, tls: bool, storage_class: str | None = None) -> dict[str, Any]:
    storage: dict[str, Any] = {"size": "128Mi"}
    if storage_class:
        storage["storageClassName"] = storage_class
    spec: dict[str, Any] = {
        "voters": 3, "image": IMAGE, "imagePullPolicy": "Never", "storage": storage,
        "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "recovery": {"enabled": True, "order": "AddThenRemove", "stabilizationSeconds": round(stabilization),
                     "timeoutSeconds": 600},
        "eventLog": {"path": f"/data/events/{name}.jsonl"},
    }
    if not tls:
        spec["tls"] = {"mode": "Disabled"}
    return {"apiVersion": "kraftkeeper.io/v1alpha1", "kind": "KRaftQuorum", "metadata": {"name": name},
            "spec": spec}


def status(k: Kube, ns: str, name: str) -> dict[str, Any]:
    obj = k.get(f"/apis/kraftkeeper.io/v1alpha1/namespaces/{ns}/kraftquorums/{name}")
    return obj.get("status") or {}


def available(st: dict[str, Any]) -> bool:
    conds = {c.get("type"): c.get("status") for c in st.get("conditions") or []}
    vs = st.get("voters") or []
    return conds.get("Available") == "True" and len(vs) == 3 and all(v.get("uuid") for v in vs)


def operator_events(k: Kube, name: str) -> list[dict[str, Any]]:
    out = k.kubectl("exec", "-n", OP_NS, f"deploy/{RELEASE}-kraftkeeper", "--", "python", "-c",
                    f"import sys; sys.stdout.write(open('/data/events/{name}.jsonl').read())")
    return [json.loads(x) for x in out.splitlines() if x.strip()]


class Observer:
    """First-seen times (host ms) of the new pod, its bound claim and the new replica's first fetch."""

    def __init__(self, k: Kube, name: str, ordinal: int, old_pod_uid: str, old_pvc_uid: str,
                 tls: bool = False) -> None:
        self.k, self.name, self.ordinal, self.tls = k, name, ordinal, tls
        self.old_pod_uid, self.old_pvc_uid = old_pod_uid, old_pvc_uid
        self.old_gone: int | None = None
        self.pod_seen: int | None = None
        self.bound_seen: int | None = None
        self.first_fetch: int | None = None
        self.new_uuid: str | None = None

    def _describe(self) -> dict[str, Any] | None:
        pods = self.k.get(f"/api/v1/namespaces/{NS_LIVE}/pods"
                          "?labelSelector=app.kubernetes.io/component%3Dquorum")
        for p in pods["items"]:
            ip = p.get("status", {}).get("podIP")
            if not ip:
                continue
            with suppress(Exception), urllib.request.urlopen(f"http://{ip}:9093/v1/quorum/describe",
                                                             timeout=1) as r:
                return json.loads(r.read())  # type: ignore[no-any-return]
        return None

    def step(self, old_uuid: str) -> bool:
        t = now_ms()
        pod_name, pvc_name = f"{self.name}-{self.ordinal}", f"data-{self.name}-{self.ordinal}"
        if self.pod_seen is None:
            try:
                p = self.k.get(f"/api/v1/namespaces/{NS_LIVE}/pods/{pod_name}")
            except urllib.error.HTTPError as e:
                if e.code == 404 and self.old_gone is None:
                    self.old_gone = t
            except Exception:  # transient
                pass
            else:
                if p["metadata"]["uid"] != self.old_pod_uid:
                    self.old_gone = self.old_gone if self.old_gone is not None else t
                    self.pod_seen = t
        if self.pod_seen is not None and self.bound_seen is None:
            with suppress(Exception):
                c = self.k.get(f"/api/v1/namespaces/{NS_LIVE}/persistentvolumeclaims/{pvc_name}")
                if c["metadata"]["uid"] != self.old_pvc_uid and c.get("status", {}).get("phase") == "Bound":
                    self.bound_seen = t
        if self.tls:  # no describe without a credential: the operator's record says the rest
            return self.bound_seen is not None
        if self.bound_seen is not None and self.first_fetch is None:
            d = self._describe()
            for o in (d or {}).get("observers", []) + (d or {}).get("voters", []):
                if o["id"] == self.ordinal + 1 and o.get("uuid") not in (None, "", old_uuid) \
                        and o.get("last_fetch_timestamp", -1) >= 0:
                    self.first_fetch, self.new_uuid = int(o["last_fetch_timestamp"]), str(o["uuid"])
        return self.first_fetch is not None


def pod_start_marks(k: Kube, pod: str) -> tuple[int, int, int]:
    """Host-clock ms of the node container's first log line, the node's first line (the end of
    the volume's preparation) and its ``listening on`` line, from the runtime's log timestamps."""
    out = k.kubectl("logs", "-n", NS_LIVE, pod, "-c", "node", "--timestamps")
    lines = [(parse_ts_ms(ln.split(" ", 1)[0]), ln.split(" ", 1)[1] if " " in ln else "")
             for ln in out.splitlines() if ln.strip()]
    marks = [(t, text) for t, text in lines if t is not None]
    first = marks[0][0]
    listening = next(t for t, text in marks if "listening on" in text)
    # The node's own first line: the first one after format's output that the node logged.
    prep_end = next((t for t, text in marks if "Formatted" in text or "formatted" in text), first)
    return first, prep_end, listening


def one_replacement(k: Kube, i: int, stabilization: float, tls: bool = False) -> dict[str, float]:
    name = "bench"
    def ready() -> dict[str, Any] | None:
        s = status(k, NS_LIVE, name)
        return s if available(s) else None

    st = wait_until("quorum bench Available", ready, timeout=300, interval=0.5, errors=TRANSIENT)
    ordinal = i % 3
    old_uuid = next(str(v["uuid"]) for v in st["voters"] if int(v["id"]) == ordinal + 1)
    done_before = len(st.get("recoveries") or [])
    recycle_pvs(k)
    pod = k.get(f"/api/v1/namespaces/{NS_LIVE}/pods/{name}-{ordinal}")
    pvc = k.get(f"/api/v1/namespaces/{NS_LIVE}/persistentvolumeclaims/data-{name}-{ordinal}")
    obs = Observer(k, name, ordinal, pod["metadata"]["uid"], pvc["metadata"]["uid"], tls)
    t0 = now_ms()
    k.kubectl("delete", "-n", NS_LIVE, f"pvc/data-{name}-{ordinal}", f"pod/{name}-{ordinal}", "--wait=false")
    wait_until(
        f"first fetch of replacement {i + 1}", lambda: obs.step(old_uuid), timeout=300, interval=0.05,
        errors=TRANSIENT,
    )

    def succeeded() -> dict[str, Any] | None:
        recs = (status(k, NS_LIVE, name).get("recoveries") or [])[done_before:]
        ok = [r for r in recs if r.get("result") == "Succeeded" and r.get("oldUuid") == old_uuid
              and (obs.tls or r.get("newUuid") == obs.new_uuid)]
        return ok[-1] if ok else None

    rec = wait_until(f"recovery {i + 1} Succeeded", succeeded, timeout=600, interval=0.5, errors=TRANSIENT)
    evs = [e for e in operator_events(k, name) if e.get("recovery_id") == rec["recoveryId"]]
    at = {e["type"]: ts_ms(e) for e in evs}
    first = {e["type"]: ts_ms(e) for e in reversed(evs)}
    caught = next(e for e in evs if e["type"] == ev.REPLICA_CAUGHT_UP)
    deadline = int(caught["detail"]["stable_since_ms"]) + round(stabilization * 1000)
    if tls:
        obs.first_fetch = first[ev.DISK_REPLACEMENT_DETECTED]
    assert obs.pod_seen is not None and obs.bound_seen is not None and obs.first_fetch is not None
    assert obs.old_gone is not None
    started, prepared, listening = pod_start_marks(k, f"{name}-{ordinal}")
    return {
        "old pod gone": (obs.old_gone - t0) / 1000,
        "re-creation": (obs.pod_seen - obs.old_gone) / 1000,
        "volume": (obs.bound_seen - obs.pod_seen) / 1000,
        "container start": (started - obs.bound_seen) / 1000,
        "format": (prepared - started) / 1000,
        "node start": (listening - prepared) / 1000,
        "first fetch": (obs.first_fetch - listening) / 1000,
        "detection": (first[ev.DISK_REPLACEMENT_DETECTED] - obs.first_fetch) / 1000,
        "stabilisation": (at[ev.REPLICA_CAUGHT_UP] - first[ev.DISK_REPLACEMENT_DETECTED]) / 1000,
        "deadline->add": (first[ev.ADD_VOTER_STARTED] - deadline) / 1000,
        "add": (at[ev.ADD_VOTER_COMMITTED] - at[ev.ADD_VOTER_STARTED]) / 1000,
        "commit->remove": (first[ev.REMOVE_VOTER_STARTED] - at[ev.ADD_VOTER_COMMITTED]) / 1000,
        "remove": (at[ev.REMOVE_VOTER_COMMITTED] - at[ev.REMOVE_VOTER_STARTED]) / 1000,
        "total": (at[ev.RECOVERY_COMPLETED] - t0) / 1000,
    }


def operator_process(k: Kube) -> Any:
    import psutil

    want = f"--namespace={NS_LIVE}"
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if "operator" in cmd and "run" in cmd and want in cmd:
            return p
    raise RuntimeError("the bench operator's process is not visible on the host")


def bench_cost(k: Kube, objects: int, window: float, rounds: int = 2) -> dict[str, float]:
    """Setup and steady-state cost of ``objects`` KRaftQuorums (3 with pods running)."""
    op = operator_process(k)

    def cpu() -> float:
        return float(sum(op.cpu_times()[:2]))

    req0, cpu0, t0 = k.api_requests(), cpu(), time.monotonic()
    for j in range(objects - 3):
        obj = quorum(f"idle-{j}", 10, tls=True)
        obj["metadata"]["namespace"] = NS_IDLE
        k.apply(obj)
    for name in ("live-2", "live-3"):
        obj = quorum(name, 10, tls=True)
        obj["metadata"]["namespace"] = NS_LIVE
        k.apply(obj)

    def settled() -> bool:
        idle = k.get(f"/apis/kraftkeeper.io/v1alpha1/namespaces/{NS_IDLE}/kraftquorums")["items"]
        live = [status(k, NS_LIVE, n) for n in ("bench", "live-2", "live-3")]
        return len(idle) == objects - 3 and all((i.get("status") or {}).get("phase") for i in idle) \
            and all(available(s) for s in live)

    wait_until(
        f"{objects} objects reconciled, 3 quorums Available", settled, timeout=900, interval=2.0,
        errors=TRANSIENT,
    )
    r: dict[str, float] = {"objects": objects, "setup_seconds": time.monotonic() - t0,
                           "setup_requests": k.api_requests() - req0, "setup_cpu_seconds": cpu() - cpu0}
    on_req: list[float] = []
    off_req: list[float] = []
    on_cpu: list[float] = []
    for _ in range(rounds):
        for running in (True, False):
            if not running:
                op.send_signal(signal.SIGSTOP)
            try:
                a, c0 = k.api_requests(), cpu()
                time.sleep(window)  # the window being measured; nothing is waited for
                b, c1 = k.api_requests(), cpu()
            finally:
                if not running:
                    op.send_signal(signal.SIGCONT)
            (on_req if running else off_req).append((b - a) / window)
            if running:
                on_cpu.append((c1 - c0) / window)
    r["steady_requests_per_s"] = statistics.mean(on_req) - statistics.mean(off_req)
    r["steady_other_requests_per_s"] = statistics.mean(off_req)
    r["steady_cpu_percent"] = 100 * statistics.mean(on_cpu)
    r["window"] = window
    return r


def run(recoveries: int, stabilization: float, objects: int, window: float, what: str,
        binding: str = "WaitForFirstConsumer", tls: bool = False
        ) -> tuple[dict[str, list[float]], dict[str, float] | None]:
    """``binding`` ``Immediate``: the bench quorum's claims use :func:`immediate_class`, not the
    node's default WaitForFirstConsumer class. ``tls``: the bench quorum with TLS on (module
    docstring)."""
    rows: dict[str, list[float]] = {p: [] for p in PHASES}
    cost: dict[str, float] | None = None
    with node_cluster() as k:
        try:
            install(k)
            recycle_pvs(k)
            klass = immediate_class(k) if binding == "Immediate" else None
            obj = quorum("bench", stabilization, tls=tls, storage_class=klass)
            obj["metadata"]["namespace"] = NS_LIVE
            k.apply(obj)
            if what in ("recovery", "all"):
                for i in range(recoveries):
                    row = one_replacement(k, i, stabilization, tls)
                    for p in PHASES:
                        rows[p].append(row[p])
                    print(f"  real replacement {i + 1}/{recoveries}: replica {i % 3 + 1}, "
                          f"total {row['total']:.2f} s", file=sys.stderr)
            if what in ("cost", "all"):
                cost = bench_cost(k, objects, window)
        finally:
            uninstall(k)
    return rows, cost
