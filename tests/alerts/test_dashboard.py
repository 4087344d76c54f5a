"""The Grafana dashboard shipped by the chart (a ConfigMap with the sidecar's label) and the
metric names every PromQL expression of it, and of the PrometheusRule, reads: each must be a
metric the operator or a node really exports. The names are collected from the operator's
metrics registry and from a real 3-node quorum over TLS (the certificate-expiry metric exists
only with TLS)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from kraftkeeper_operator.telemetry import OperatorMetrics
from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase

from quorum.security.tlsctx import client_context
from tests.alerts.promql import dashboard, dashboard_exprs, metric_names, render, rule_exprs, rule_groups
from tests.hostile.fakes import request
from tests.tlsfixtures import TlsCluster, make_tls_dir

# Prometheus' own series for every target.
SCRAPE_SERIES = {"up"}


def _names(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][\w:]*)(?:\{| )", text, re.M)}


def operator_metric_names() -> set[str]:
    m = OperatorMetrics()
    for attr in vars(m).values():
        if isinstance(attr, MetricWrapperBase):  # a child per metric, so every series renders
            attr.labels(*["x"] * len(attr._labelnames))
    return _names(generate_latest(m.registry).decode())


@pytest.fixture(scope="module")
def node_metric_names(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    tls = make_tls_dir(tmp_path_factory.mktemp("tls"))
    c = TlsCluster(tmp_path_factory.mktemp("nodes"), tls)
    c.up()
    try:
        c.state(60)
        c.call_as("rw.json", lambda q: q.put("k", b"v"))
        names: set[str] = set()
        for i in (1, 2, 3):
            status, body = request(c.endpoint(i), "GET", "/metrics", ctx=client_context(tls / "ca.crt"))
            assert status == 200, body
            names |= _names(body.decode() if isinstance(body, bytes) else str(body))
        yield names
    finally:
        c.stop()


def test_metric_names_of_an_expression() -> None:
    e = ('histogram_quantile(0.95, sum by (le, op) (rate(a_bucket{quorum=~"$x/$y"}[6h]))) - on (q) '
         'group_right () b > 1e3 and on (p) (c == 1) or absent(up{job="j"} == 1) offset 5m')
    assert metric_names(e) == {"a_bucket", "b", "c", "up"}


def test_dashboard_configmap_carries_the_sidecar_label() -> None:
    (cm,) = [d for d in render("--set", "dashboards.namespace=monitoring") if d["kind"] == "ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    dash = dashboard()
    assert dash["uid"] == "kraftkeeper-quorums" and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    # Off by default, like the PrometheusRule and the monitors (their CRDs may be absent).
    off = [d["kind"] for d in render("--set", "dashboards.enabled=false", "--set", "alerts.enabled=false")]
    assert "ConfigMap" not in off and "PrometheusRule" not in off


def test_every_expression_reads_metrics_that_exist(node_metric_names: set[str]) -> None:
    known = operator_metric_names() | node_metric_names | SCRAPE_SERIES
    assert "kraftkeeper_tls_certificate_expiry_timestamp_seconds" in node_metric_names
    assert "kraftkeeper_operator_oldest_recovery_started_timestamp_seconds" in known
    for where, exprs in (("dashboard", dashboard_exprs(dashboard())), ("rules", rule_exprs(rule_groups()))):
        assert exprs
        for e in exprs:
            unknown = metric_names(e) - known
            assert not unknown, f"{where}: {e!r} reads metrics nobody exports: {sorted(unknown)}"
