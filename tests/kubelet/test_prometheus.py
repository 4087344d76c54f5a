"""The chart's alerts in a real Prometheus (scripts/prometheus.sh) scraping the single-node
cluster: the operator pod and the quorum pods, found through the kube-apiserver (pod discovery,
the relabelling of the chart's PodMonitor), the quorum pods over https verified against the
quorum's CA. A follower's disk is replaced (`kubectl delete pvc,pod`) under writes:
KRaftKeeperQuorumDegraded fires while the old voter is gone and resolves once the operator
swapped in the new one; every metric the rules and the dashboard read is then in Prometheus.

Prometheus runs as a host process (it reaches the pods on the node's bridge), on loopback.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from quorum.localports import free_port
from testkit.polling import wait_until
from tests.alerts.promql import dashboard, dashboard_exprs, metric_names, rule_exprs, rule_groups, tool
from tests.kubelet.conftest import OPERATOR_NS, QUORUM, QUORUM_NS, NodeCluster, wait_available
from tests.kubelet.test_e2e import Writer, read_back, voter_uuids

pytestmark = [pytest.mark.k8s, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1200)]

KEY = f"{QUORUM_NS}/{QUORUM}"  # the operator metrics' `quorum` label
DEGRADED = "KRaftKeeperQuorumDegraded"
# The job the chart's rules expect for the operator: its metrics Service's name (release kraftkeeper).
OPERATOR_JOB = "kraftkeeper-metrics"


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        q = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{q}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]  # type: ignore[no-any-return]

    def alerts(self, name: str) -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["alerts"] if a["labels"].get("alertname") == name]

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _pod_job(name: str, ns: str, component: str, port: str, kubeconfig: Path) -> dict[str, Any]:
    """A scrape job over the pods of one component, labelled as the chart's monitors label them."""
    return {
        "job_name": name,
        "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": str(kubeconfig),
                                   "namespaces": {"names": [ns]}}],
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
             "regex": component, "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port, "action": "keep"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        ],
    }


@pytest.fixture(scope="module")
def prometheus(node_cluster: NodeCluster, quorum_ns: str, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Prometheus]:
    binary = tool("prometheus")
    d = tmp_path_factory.mktemp("prometheus")
    secret = node_cluster.get_json("secret", f"{QUORUM}-tls", "-n", QUORUM_NS)
    assert secret is not None, f"Secret {QUORUM}-tls (the quorum's CA) is missing"
    (d / "ca.crt").write_bytes(base64.b64decode(secret["data"]["ca.crt"]))
    # The chart's rules as a user installs them, with the degraded-quorum alert at once (for: 0s)
    # and evaluated every second: a replaced disk is healed within seconds here.
    (d / "rules.yaml").write_text(yaml.safe_dump(
        rule_groups("--set", "alerts.for.quorumDegraded=0s", release="kraftkeeper"), sort_keys=False))
    operator = _pod_job(OPERATOR_JOB, OPERATOR_NS, "operator", "metrics", node_cluster.kubeconfig)
    quorums = _pod_job("kraftkeeper-quorums", QUORUM_NS, "quorum", "client", node_cluster.kubeconfig)
    instance = "__meta_kubernetes_pod_label_app_kubernetes_io_instance"
    quorums["relabel_configs"].append({"source_labels": [instance], "target_label": "kraftquorum"})
    quorums["scheme"] = "https"
    # The node certificates name the quorum's Service (NAME.NAMESPACE.svc), not the pod IPs.
    quorums["tls_config"] = {"ca_file": str(d / "ca.crt"), "server_name": f"{QUORUM}.{QUORUM_NS}.svc"}
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(d / "rules.yaml")],
        "scrape_configs": [operator, quorums],
    }
    (d / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()  # outside the ephemeral range, probed as Prometheus binds (localports)
    log = d / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(binary), f"--config.file={d / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={d / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=out, stderr=subprocess.STDOUT)
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        def targets_up() -> bool:
            assert proc.poll() is None, f"prometheus exited:\n{prom.tail()}"
            try:
                up = {(r["metric"]["job"], r["metric"]["pod"]) for r in prom.query("up == 1")}
            except OSError:
                return False
            return len([j for j, _ in up if j == OPERATOR_JOB]) == 1 and len(up) == 4

        wait_until("Prometheus scraping the operator and 3 quorum pods", targets_up, 120, interval=1.0,
                   context=lambda: json.dumps(prom.api("targets")["activeTargets"], indent=1)[-4000:])
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _degraded_firing(prom: Prometheus) -> bool:
    return any(a["state"] == "firing" and a["labels"].get("quorum") == KEY for a in prom.alerts(DEGRADED))


def test_degraded_quorum_alert_fires_during_a_replaced_disk_and_resolves(
        node_cluster: NodeCluster, prometheus: Prometheus) -> None:
    c, prom = node_cluster, prometheus
    st = wait_available(c)
    # The stabilisation period the sample asks for (10 s): the window in which the old voter is
    # gone and the new one not yet promoted, whatever an earlier test set.
    c.kubectl("patch", "kraftquorum", QUORUM, "-n", QUORUM_NS, "--type=merge",
              "-p", json.dumps({"spec": {"recovery": {"stabilizationSeconds": 10}}}))
    c.wait_for("Prometheus sees 3 of 3 voters live and no degraded-quorum alert", lambda: (
        [r["value"][1] for r in prom.query(f'kraftkeeper_operator_live_voters{{quorum="{KEY}"}}')] == ["3"]
        and not prom.alerts(DEGRADED)), timeout=60, context=prom.tail)
    follower = next(i for i in sorted(voter_uuids(st)) if i != st["leaderId"])
    old_uuid = voter_uuids(st)[follower]
    recoveries_before = len(st.get("recoveries") or [])
    writer = Writer(c, "prom")
    writer.wait_acked(0, "the writer's first acknowledged write")

    pod = f"{QUORUM}-{follower - 1}"
    start = time.monotonic()
    c.kubectl("delete", "pvc", f"data-{pod}", "-n", QUORUM_NS, "--wait=false")
    c.kubectl("delete", "pod", pod, "-n", QUORUM_NS, "--wait=false")
    c.wait_for(f"{DEGRADED} firing for {KEY}", lambda: _degraded_firing(prom), timeout=180, interval=0.25,
               context=lambda: f"{json.dumps(prom.alerts(DEGRADED))}\n{c.describe()}")
    fired = time.monotonic() - start
    (alert,) = [a for a in prom.alerts(DEGRADED) if a["labels"].get("quorum") == KEY]
    assert alert["labels"]["severity"] == "warning"
    assert alert["annotations"]["runbook_url"].endswith("#kraftkeeperquorumdegraded")

    def recovered() -> dict[str, Any] | None:
        s = c.quorum().get("status") or {}
        done = [r for r in (s.get("recoveries") or [])[recoveries_before:]
                if r.get("result") == "Succeeded" and r.get("oldUuid") == old_uuid]
        return done[-1] if done else None

    c.wait_for(f"the recovery of replica {follower} Succeeded", recovered, timeout=300, context=c.describe)
    succeeded = time.monotonic() - start
    c.wait_for(f"{DEGRADED} resolved", lambda: not _degraded_firing(prom), timeout=120, interval=0.25,
               context=lambda: json.dumps(prom.alerts(DEGRADED)))
    resolved = time.monotonic() - start
    print(f"\n{DEGRADED}: firing {fired:.2f} s after `kubectl delete pvc,pod`, recovery Succeeded at "
          f"{succeeded:.2f} s, alert resolved at {resolved:.2f} s (scrape and rule interval 1 s)")
    assert voter_uuids(c.quorum()["status"]).get(follower) != old_uuid

    writer.wait_acked(len(writer.acked()), "a write acknowledged after the recovery")
    read_back(c, writer.stop())
    # Every metric the rules and the dashboard read is really scraped (the recovery just made
    # the series of its histograms, the writer the committed-writes counter).
    present = {r["metric"]["__name__"]
               for r in prom.query('group by (__name__) ({__name__=~"kraftkeeper_.+|up"})')}
    exprs = rule_exprs(rule_groups()) + dashboard_exprs(dashboard())
    wanted = set().union(*(metric_names(e) for e in exprs))
    assert not wanted - present, sorted(wanted - present)
