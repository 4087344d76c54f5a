"""The report's Spark session when the JVM runs out of memory: it exits (it used to stay up with
the Python side waiting forever on the collect's socket), and the job says why in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

# A value far larger than the heap, built in the JVM (the optimizer folds the constant while
# planning, in the thread that serves the Python call: where the hang was).
CHILD = """
from pyspark.sql import functions as F
from kraftkeeper_reports.job import failure_line
from kraftkeeper_reports.session import build_session, jvm_exit_code
spark = build_session("local[1]")
try:
    spark.range(1).select(F.repeat(F.lit("x"), 1_500_000_000).alias("s")).toArrow()
except Exception as e:
    print("LINE", failure_line(e))
    print("CODE", jvm_exit_code(wait_s=30))
else:
    print("NO ERROR")
"""


def test_out_of_memory_ends_the_jvm_and_the_job_says_so(tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="needs PySpark (pip install -e '.[spark]')")
    env = dict(os.environ, KK_SPARK_DRIVER_MEMORY="1g", SPARK_LOCAL_IP="127.0.0.1")
    # The timeout only turns a regression (the old hang) into a failure instead of a stuck run.
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    out = r.stdout
    assert "CODE 3" in out, (out, r.stderr[-3000:])
    line = next(x for x in out.splitlines() if x.startswith("LINE "))
    assert "ran out of memory" in line and "heap 1g" in line and "KK_SPARK_DRIVER_MEMORY" in line, line


def test_failure_line_of_a_live_jvm_is_the_exception() -> None:
    from kraftkeeper_reports.job import failure_line
    from kraftkeeper_reports.session import jvm_failure

    # No JVM was started by this test process: the exception itself is the line.
    assert failure_line(ValueError("bad thing\nmore")) == "ValueError: bad thing"
    assert "ran out of memory" in jvm_failure(3)
    assert jvm_failure(1) == "Spark's JVM exited with status 1"


def test_jvm_costs_of_a_live_session(spark: object) -> None:
    """The driver JVM's CPU, JIT and GC time, as the job's timing line reports them
    (KK_REPORT_TIMINGS=1): a session that has run a query has spent CPU and compiled code."""
    from kraftkeeper_reports.session import jvm_costs

    spark.range(100_000).selectExpr("sum(id * 2)").collect()  # type: ignore[attr-defined]
    costs = jvm_costs(spark)  # type: ignore[arg-type]
    assert costs is not None
    assert costs.cpu_s > 0 and costs.jit_s > 0 and costs.gc_s >= 0
    assert costs.jit_s + costs.gc_s <= costs.cpu_s  # parts of the process's CPU, in seconds
    line = costs.line()
    assert f"since start {costs.cpu_s:.1f} s" in line and f"JIT compiler threads {costs.jit_s:.1f} s" in line
