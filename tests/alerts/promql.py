"""What the alerting tests need around PromQL and the chart: the chart's PrometheusRule and
dashboard rendered by helm, the metric names an expression reads, and the cached promtool /
prometheus binaries (scripts/prometheus.sh)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kraftkeeper"
CACHE_BIN = Path(os.environ.get("KK_CACHE", str(Path.home() / ".cache" / "kraftkeeper"))) / "bin"

# Words of PromQL that are neither metrics nor functions (aggregations and functions are told
# apart by the parenthesis that follows them).
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                       "group_left", "group_right", "inf", "nan"})
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: strings, label matchers, ranges and label
    lists removed, every identifier left that is not a keyword or a function call."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = _LABEL_LISTS.sub(" ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", s):
        if s[m.end():].lstrip().startswith("(") or m.group(0).lower() in _KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def tool(name: str) -> Path:
    """A binary of scripts/prometheus.sh (or helm of scripts/k8s-testenv.sh); the test fails
    under ./dev.sh test (KK_NODE_TESTS=1, everything was installed) and skips elsewhere."""
    path = CACHE_BIN / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        reason = (f"{path} is not installed (run scripts/prometheus.sh install and "
                  "scripts/k8s-testenv.sh install)")
        if os.environ.get("KK_NODE_TESTS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def render(*args: str, release: str = "kk") -> list[dict[str, Any]]:
    proc = subprocess.run([str(tool("helm")), "template", release, str(CHART), "--namespace", "kk-system",
                           "--set", "alerts.enabled=true", "--set", "dashboards.enabled=true", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def rule_groups(*args: str, release: str = "kk") -> dict[str, Any]:
    """The PrometheusRule's groups as a Prometheus rules file ({"groups": [...]})."""
    (rule,) = [d for d in render(*args, release=release) if d["kind"] == "PrometheusRule"]
    return {"groups": rule["spec"]["groups"]}


def dashboard(*args: str) -> dict[str, Any]:
    (cm,) = [d for d in render(*args)
             if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    return json.loads(cm["data"]["kraftkeeper.json"])  # type: ignore[no-any-return]


def dashboard_exprs(dash: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def rule_exprs(groups: dict[str, Any]) -> list[str]:
    return [r["expr"] for g in groups["groups"] for r in g["rules"]]
