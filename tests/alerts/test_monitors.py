"""The chart's PodMonitor for the quorum pods: one per watched namespace, https on the client
port, and the `kraftquorum` label the node alerts group by."""

from __future__ import annotations

from typing import Any

import pytest

from tests.alerts.promql import render


def _monitors(*args: str) -> list[dict[str, Any]]:
    return [d for d in render("--set", "metrics.podMonitor.enabled=true", *args) if d["kind"] == "PodMonitor"]


def test_a_pod_monitor_per_watched_namespace_labels_the_quorum() -> None:
    mons = _monitors("--set", "operator.watchNamespaces={a,b}")
    assert sorted(m["metadata"]["namespace"] for m in mons) == ["a", "b"]
    for m in mons:
        spec = m["spec"]
        assert spec["namespaceSelector"] == {"matchNames": [m["metadata"]["namespace"]]}
        assert spec["selector"]["matchLabels"]["app.kubernetes.io/component"] == "quorum"
        (ep,) = spec["podMetricsEndpoints"]
        assert (ep["port"], ep["path"], ep["scheme"]) == ("client", "/metrics", "https")
        assert {"sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
                "targetLabel": "kraftquorum"} in ep["relabelings"]
    # Every namespace (cluster scope, nothing narrowed): one monitor in the release namespace.
    (one,) = _monitors("--set", "rbac.scope=cluster")
    assert one["metadata"]["namespace"] == "kk-system" and one["spec"]["namespaceSelector"] == {"any": True}
    # Verifying the quorum's certificate is a value away.
    (ver,) = _monitors("--set", "metrics.podMonitor.tlsConfig.insecureSkipVerify=false",
                       "--set", "metrics.podMonitor.tlsConfig.serverName=demo.kk-system.svc")
    assert ver["spec"]["podMetricsEndpoints"][0]["tlsConfig"] == {"insecureSkipVerify": False,
                                                                  "serverName": "demo.kk-system.svc"}


def test_dashboard_configmap_is_a_valid_kubernetes_object() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    (cm,) = [d for d in render() if d["kind"] == "ConfigMap"]
    kubernetes_validate.validate(cm, "1.30.0", strict=True)
