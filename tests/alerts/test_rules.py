"""The chart's PrometheusRule under `promtool`: the rendered rules pass `promtool check rules`,
and `promtool test rules` runs rules_test.yaml over them, each alert seen firing (with its
labels and annotations) and not firing (before its `for`, and for a healthy quorum)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.alerts.promql import rule_groups, tool

HERE = Path(__file__).resolve().parent
ALERTS = {"KRaftKeeperNoLeader", "KRaftKeeperQuorumLost", "KRaftKeeperQuorumDegraded",
          "KRaftKeeperVoterLagging", "KRaftKeeperRecoveryStuck", "KRaftKeeperRecoveryFailed",
          "KRaftKeeperUncleanRecovery", "KRaftKeeperCertificateExpiring", "KRaftKeeperOperatorDown"}


def _promtool(tmp_path: Path, groups: dict[str, object]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups, sort_keys=False))
    shutil.copy(HERE / "rules_test.yaml", tmp_path / "rules_test.yaml")
    return subprocess.run([str(tool("promtool")), "test", "rules", "rules_test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_rules_pass_promtool_check(tmp_path: Path) -> None:
    groups = rule_groups()
    rules = [r for g in groups["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    for r in rules:
        assert r["labels"]["severity"] in ("warning", "critical"), r
        assert {"summary", "description", "runbook_url"} <= set(r["annotations"]), r
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups, sort_keys=False))
    proc = subprocess.run([str(tool("promtool")), "check", "rules", str(tmp_path / "rules.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in proc.stdout, proc.stdout


def test_each_alert_fires_and_stays_quiet_under_promtool(tmp_path: Path) -> None:
    tested = {line.split(":", 1)[1].strip() for line in (HERE / "rules_test.yaml").read_text().splitlines()
              if line.strip().startswith("alertname:")}
    assert tested == ALERTS, ALERTS ^ tested
    proc = _promtool(tmp_path, rule_groups())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout, proc.stdout


def test_promtool_catches_a_broken_rule(tmp_path: Path) -> None:
    """The cases can fail: with the degraded-quorum threshold turned around, promtool reports it."""
    groups = rule_groups()
    for g in groups["groups"]:
        for r in g["rules"]:
            if r["alert"] == "KRaftKeeperQuorumDegraded":
                r["expr"] = r["expr"].replace(" < ", " > ")
    proc = _promtool(tmp_path, groups)
    assert proc.returncode != 0
    assert "KRaftKeeperQuorumDegraded" in proc.stdout + proc.stderr


def test_alert_values_reach_the_rules() -> None:
    """`for`, thresholds, the operator's job and extra labels come from the chart's values."""
    groups = rule_groups("--set", "alerts.for.quorumDegraded=0s", "--set", "alerts.voterLagRecords=5",
                         "--set", "alerts.operatorJob=ops", "--set", "alerts.additionalLabels.team=storage",
                         "--set", "alerts.runbookBaseUrl=https://runbooks.example/kk")
    rules = {r["alert"]: r for g in groups["groups"] for r in g["rules"]}
    assert rules["KRaftKeeperQuorumDegraded"]["for"] == "0s"
    assert ") > 5\n" in rules["KRaftKeeperVoterLagging"]["expr"]
    assert rules["KRaftKeeperOperatorDown"]["expr"] == 'absent(up{job="ops"} == 1)'
    assert all(r["labels"]["team"] == "storage" for r in rules.values())
    assert rules["KRaftKeeperNoLeader"]["annotations"]["runbook_url"] == (
        "https://runbooks.example/kk#kraftkeepernoleader")


def test_every_runbook_is_a_heading_of_the_operator_guide() -> None:
    """runbook_url points at docs/operator.md#<alert in lower case>: that heading exists."""
    doc = (HERE.parents[1] / "docs" / "operator.md").read_text()
    headings = {line.lstrip("#").strip().lower() for line in doc.splitlines() if line.startswith("#")}
    for g in rule_groups()["groups"]:
        for r in g["rules"]:
            anchor = r["annotations"]["runbook_url"].split("#", 1)[1]
            assert anchor in headings, f"docs/operator.md lacks a heading {r['alert']} (runbook of the alert)"


def test_installer_check_names_what_is_missing(tmp_path: Path) -> None:
    script = HERE.parents[1] / "scripts" / "prometheus.sh"
    proc = subprocess.run([str(script), "check"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "KK_CACHE": str(tmp_path)})
    assert proc.returncode == 1
    assert f"missing: {tmp_path}/bin/prometheus, {tmp_path}/bin/promtool v0." in proc.stdout, proc.stdout
    proc = subprocess.run([str(script), "frobnicate"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("usage:"), proc.stderr
