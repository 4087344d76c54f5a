"""The report job on a real Spark standalone cluster: a master and two workers started from the
PySpark distribution's own classes (``bin/spark-class org.apache.spark.deploy.master.Master``,
``...deploy.worker.Worker``) on 127.0.0.1, one cluster for the module. ``kraftkeeper report
--master spark://...`` writes the same tables, the same ingested state and the same summary as
``local[*]`` on the same input."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from testkit.polling import wait_until
from tests.engine.cluster import free_ports
from tests.reports.test_ingest import rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]

TABLES = ("phase_stats", "outcomes", "failures", "daily", "slowest", "bad_input", "unclean", "in_progress",
          "failed_recoveries")


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A standalone master and two one-core workers on loopback; yields the master URL and the
    configuration directory a driver needs (its shared secret)."""
    from tests.reports.conftest import java_major

    if java_major() < 17:
        pytest.skip("needs Java 17+ for Spark (scripts/install-system.sh install)")
    home = _spark_home()
    work = tmp_path_factory.mktemp("spark-standalone")
    port, ui, w1, w2 = free_ports(4)
    # Authenticated (Spark's shared-secret RPC authentication): the master, the workers and the
    # report's driver read it from the same spark-defaults.conf (SPARK_CONF_DIR).
    conf = work / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        f"spark.authenticate true\nspark.authenticate.secret {secrets.token_hex(16)}\n"
        # No unauthenticated REST submission server (on by default on the master).
        "spark.master.rest.enabled false\n")
    (conf / "spark-defaults.conf").chmod(0o600)
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1",
           "SPARK_LOG_DIR": str(work), "SPARK_WORKER_DIR": str(work / "work"), "SPARK_CONF_DIR": str(conf)}
    cls = str(home / "bin" / "spark-class")
    procs = [subprocess.Popen(
        [cls, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(ui)], env=env, stdout=open(work / "master.log", "w"), stderr=subprocess.STDOUT)]
    url = f"spark://127.0.0.1:{port}"
    for wport in (w1, w2):
        procs.append(subprocess.Popen(
            [cls, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1",
             "--memory", "1500m", "--webui-port", str(wport)],
            env=env, stdout=open(work / f"worker-{wport}.log", "w"), stderr=subprocess.STDOUT))

    def alive() -> int | None:
        for p in procs:
            assert p.poll() is None, f"a Spark daemon exited ({p.args[1]}); logs in {work}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as r:
                n = int(json.load(r).get("aliveworkers", 0))
        except OSError:
            return None
        return n if n == 2 else None

    try:
        wait_until("the standalone master with two live workers", alive, 600)
        yield url, conf
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_report_on_the_standalone_cluster_equals_local(
    spark: Any, spark_cluster: tuple[str, Path], tmp_path: Path,
) -> None:
    from kraftkeeper_reports.generate import generate
    from kraftkeeper_reports.job import run_report

    from tests.reports.test_attention import write_log

    src = tmp_path / "events"
    generate(src, events=1_200, clusters=2, days=3, seed=5, malformed_rate=0.01)
    write_log(src / "operator")  # an unclean recovery, a failed and a running one too
    local = tmp_path / "local"
    run_report([str(src)], str(local), engine="spark")  # Spark on both sides, not in process
    remote = tmp_path / "remote"
    r = subprocess.run(
        [sys.executable, "-m", "kraftkeeper_reports.job", "--events", str(src), "--out", str(remote),
         "--master", spark_cluster[0], "--engine", "spark"],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_CONF_DIR": str(spark_cluster[1])})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == str((remote / "report.html").resolve())
    assert rows(remote / "state") == rows(local / "state")

    def summary(d: Path) -> dict[str, Any]:
        return dict(json.loads((d / "tables" / "summary.json").read_text()))

    assert summary(remote) == summary(local)
    assert summary(local)["unclean"] == 1
    for name in TABLES:
        a = pd.read_csv(local / "tables" / f"{name}.csv")
        b = pd.read_csv(remote / "tables" / f"{name}.csv")
        if name == "bad_input":
            # The first two examples of a reason are picked by hash (the same anywhere); a third,
            # and the message shown (some name the line's value), come from any one line, which
            # depends on how the input was split among the tasks.
            a["examples"], b["examples"] = (t["examples"].str.split(" [|] ").str[:2] for t in (a, b))
            a, b = a.drop(columns=["message"]), b.drop(columns=["message"])
        pd.testing.assert_frame_equal(a, b, check_dtype=False, obj=name)
    rec = [pd.read_parquet(d / "tables" / "recoveries.parquet").sort_values(["cluster", "recovery_id"])
           .reset_index(drop=True) for d in (local, remote)]
    pd.testing.assert_frame_equal(rec[0], rec[1], check_dtype=False)
