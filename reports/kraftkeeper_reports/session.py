"""The SparkSession the report job runs on.

Local Spark (``local[*]``) by default, bound to loopback (SPARK_LOCAL_IP, spark.driver.host and
spark.driver.bindAddress = 127.0.0.1: the machines this runs on may have no other usable
interface, and Spark warns or binds a public one otherwise). Any cluster through ``master``
(``spark://...``, ``yarn``, ``k8s://...``); then the driver's address is left to Spark and the
caller's configuration.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

LOOPBACK = "127.0.0.1"


def is_local(master: str | None) -> bool:
    return master is None or master == "local" or master.startswith("local[")


def build_session(master: str | None = None, app_name: str = "kraftkeeper-report") -> SparkSession:
    """Get (or create) the session. Settings every run needs:

    * UTC session time zone: event timestamps are UTC and days in the trend are UTC days;
    * ANSI mode off, so a failed cast yields null (the job counts bad values, it never aborts);
    * Arrow for toPandas (the small tables; no line goes through Python: ``parse`` runs in the JVM);
    * small shuffles: the per-recovery tables are small next to the event log.
    """
    if is_local(master):
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    # Python workers must run the interpreter that has this package (a venv), not "python3".
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    shuffle = str(max(2, os.cpu_count() or 2)) if is_local(master) else "64"
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master or "local[*]")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.ansi.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # Few shuffle partitions: after parsing, the data is one row per recovery; adaptive
        # execution (on by default) coalesces further when partitions are tiny.
        .config("spark.sql.shuffle.partitions", os.environ.get("KK_SPARK_SHUFFLE_PARTITIONS", shuffle))
        # The per-recovery aggregation (collect_list) runs in Spark's object hash aggregate,
        # which sorts the rest of its input once a task holds 128 groups (the default): a task
        # holds ~65k recoveries at 10 M events. Measured ~12% less CPU for that step.
        .config("spark.sql.objectHashAggregate.sortBased.fallbackThreshold", "65536")
        # Generated code in smaller methods (Spark's default splits at 1024 characters of
        # expression code): the parse and the partial aggregation of every line run in one
        # generated loop, invoked once per task, which the JIT can only compile on-stack while
        # it runs; small methods are called once per line and compiled early, and the slow
        # path's, rarely called, not at all. Measured at 10 M events, fresh JVM (the bench):
        # the one Spark job 105 s -> 64 s at 256, 61 s at 128.
        .config("spark.sql.codegen.methodSplitThreshold",
                os.environ.get("KK_SPARK_METHOD_SPLIT", "128"))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # The per-recovery rows come back as Arrow batches held in the driver's heap (10 M
        # events: 1.4 M rows): 2g ran out of memory there.
        .config("spark.driver.memory", os.environ.get("KK_SPARK_DRIVER_MEMORY", "4g"))
    )
    # The event parser's generated Java method is large (one CASE per rule of the event schema);
    # HotSpot leaves methods over 8000 bytes of bytecode interpreted unless told otherwise,
    # which made parsing ~5x slower.
    jvm = ["-XX:-DontCompileHugeMethods"]
    log4j = os.environ.get("KK_SPARK_LOG4J", str(Path(__file__).with_name("log4j2.properties")))
    if Path(log4j).is_file():
        jvm.append(f"-Dlog4j2.configurationFile=file:{log4j}")
    builder = builder.config("spark.driver.extraJavaOptions", " ".join(jvm)).config(
        "spark.executor.extraJavaOptions", "-XX:-DontCompileHugeMethods"
    )
    if is_local(master):
        builder = builder.config("spark.driver.host", LOOPBACK).config("spark.driver.bindAddress", LOOPBACK)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
