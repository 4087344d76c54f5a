"""The recovery report in the cluster: the chart's report CronJob (``report.enabled``) run on the
real kubelet after a disk replacement, its report.html read back the documented one-command way
(``kubectl exec deploy/kraftkeeper -c operator -- cat /data/report/report.html``).

The job's image is built by ``scripts/build-image.sh report`` (cached: the base tarball and the
wheels) and imported into the node's containerd like the product image.
"""

from __future__ import annotations

import html
import os
import subprocess
import time

import pytest

from tests.kubelet.conftest import NODE_SH, OPERATOR_NS, REPO, NodeCluster, wait_available
from tests.kubelet.test_e2e import _replace_disk, voter_uuids

pytestmark = [pytest.mark.k8s, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

REPORT_IMAGE = "kraftkeeper-report:kubelet-test"
CRONJOB = "kraftkeeper-report"


def _report_image() -> None:
    build = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), "report"], capture_output=True,
                           text=True, timeout=1800, env={**os.environ, "KK_REPORT_IMAGE": REPORT_IMAGE})
    assert build.returncode == 0, f"scripts/build-image.sh report failed:\n{build.stderr[-4000:]}"
    load = subprocess.run(["bash", str(NODE_SH), "load-image", REPORT_IMAGE], capture_output=True, text=True,
                          timeout=900)
    assert load.returncode == 0, f"importing {REPORT_IMAGE} into containerd failed:\n{load.stderr[-4000:]}"


def _job_done(c: NodeCluster, job: str) -> str | None:
    st = (c.get_json("job", job, "-n", OPERATOR_NS) or {}).get("status") or {}
    conds = {x.get("type"): x.get("status") for x in st.get("conditions") or []}
    if conds.get("Complete") == "True":
        return "Complete"
    if conds.get("Failed") == "True":
        logs = c.kubectl("logs", "-n", OPERATOR_NS, f"job/{job}", "--tail=80", check=False)
        raise AssertionError(f"the report job {job} failed:\n{logs.stdout[-6000:]}{logs.stderr[-2000:]}")
    return None


def test_in_cluster_report_shows_the_disk_replacement(node_cluster: NodeCluster, quorum_ns: str,
                                                       operator_release: str) -> None:
    c = node_cluster
    t0 = time.monotonic()
    _report_image()
    t_image = time.monotonic() - t0
    repo, tag = REPORT_IMAGE.rsplit(":", 1)
    try:
        _run_report(c, repo, tag, t0, t_image)
    finally:
        # The tests after this one run without the CronJob (its schedule could fire among them).
        c.helm("upgrade", "kraftkeeper", str(REPO / "charts" / "kraftkeeper"), "--namespace", OPERATOR_NS,
               "--reuse-values", "--set", "report.enabled=false", "--wait", "--timeout", "3m")


def _run_report(c: NodeCluster, repo: str, tag: str, t0: float, t_image: float) -> None:
    c.helm("upgrade", "kraftkeeper", str(REPO / "charts" / "kraftkeeper"), "--namespace", OPERATOR_NS,
           "--reuse-values", "--set", "report.enabled=true", "--set", f"report.image.repository={repo}",
           "--set", f"report.image.tag={tag}", "--set", "report.image.pullPolicy=Never",
           "--set", "report.master=local[1]", "--set", "report.resources.requests.cpu=100m",
           "--wait", "--timeout", "3m")
    assert c.get_json("cronjob", CRONJOB, "-n", OPERATOR_NS) is not None

    st = wait_available(c)
    follower = next(i for i in sorted(voter_uuids(st)) if i != st["leaderId"])
    rec = _replace_disk(c, follower - 1, "report")

    t1 = time.monotonic()
    job = f"report-{int(time.time())}"
    c.kubectl("create", "job", f"--from=cronjob/{CRONJOB}", job, "-n", OPERATOR_NS)
    c.wait_for(f"the report job {job} to complete", lambda: _job_done(c, job), timeout=600, interval=2.0,
               context=c.describe)
    t_job = time.monotonic() - t1
    # The documented one command (docs/reports.md, the chart's NOTES.txt).
    page = c.kubectl("exec", "-n", OPERATOR_NS, "deploy/kraftkeeper", "-c", "operator", "--",
                     "cat", "/data/report/report.html").stdout
    text = html.unescape(page)
    assert "<html" in page.lower(), page[:500]
    assert str(rec["recoveryId"]) in text, f"recovery {rec['recoveryId']} not in the report:\n{text[:3000]}"
    assert "unclean" in text.lower()  # the data-loss section is there (and says none happened)
    print(f"report image build+import {t_image:.1f}s; report job {t_job:.1f}s; "
          f"whole test {time.monotonic() - t0:.1f}s")
