"""The operator's cost at rest: N KRaftQuorum objects reconciled by the operator against the test
kube-apiserver (:mod:`testkit.kubeapi`), its CPU seconds and API requests per second over a
window (``python -m bench.operator --cost``; :mod:`bench.operator` is the command line).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.operator_local import REPO, TRANSIENT, describe, local_cluster
from testkit.launchers import start_operator_run, stop_process
from testkit.polling import wait_until


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
        wait_until(
            "CRD served",
            lambda: kube.request("GET", "/apis/kraftkeeper.io/v1alpha1/kraftquorums")[0] == 200, timeout=60,
            interval=0.2, errors=TRANSIENT,
        )
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        kube.request(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )
        overrides = {f"{ns}/q{j}/{k}": f"127.0.0.1:{base + k + 1}" for j in range(n) for k in range(3)}
        eps = [f"127.0.0.1:{base + i}" for i in (1, 2, 3)]
        wait_until(
            "shared quorum leader", lambda: describe(eps)["leader_id"] > 0, timeout=120, interval=0.2,
            errors=TRANSIENT,
        )
        env = kube.env()
        env.update(
            KRAFTKEEPER_METRICS_PORT="0",
            KRAFTKEEPER_ENDPOINT_OVERRIDES=json.dumps(overrides),
            KRAFTKEEPER_RECONCILE_INTERVAL="2",
        )
        op = start_operator_run(env, ns, workdir / "operator-run.log")
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

            wait_until(f"{n} quorums Running", all_running, timeout=600, interval=1.0, errors=TRANSIENT)
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
            stop_process(op)
    return results
