"""The SparkSession the report job runs on.

Local Spark (``local[*]``) by default, bound to loopback (SPARK_LOCAL_IP, spark.driver.host and
spark.driver.bindAddress = 127.0.0.1: the machines this runs on may have no other usable
interface, and Spark warns or binds a public one otherwise). Any cluster through ``master``
(``spark://...``, ``yarn``, ``k8s://...``); then the driver's address is left to Spark and the
caller's configuration.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from py4j.protocol import Py4JError  # type: ignore[import-untyped]
from pyspark import SparkContext
from pyspark.sql import SparkSession

LOOPBACK = "127.0.0.1"


# The JVM's exit status under -XX:+ExitOnOutOfMemoryError (HotSpot exits with 3).
EXIT_OUT_OF_MEMORY = 3


def driver_memory() -> str:
    """The driver's heap (KK_SPARK_DRIVER_MEMORY, default 4g)."""
    return os.environ.get("KK_SPARK_DRIVER_MEMORY", "4g")


def jvm_exit_code(wait_s: float = 0.0) -> int | None:
    """The exit status of the JVM this process started for Spark, or None while it runs (or when
    Spark was not started from here). ``wait_s``: how long to wait for it to end (a Python call
    can fail on the closed socket a moment before the process has exited)."""
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None) if gateway is not None else None
    if proc is None:
        return None
    try:
        return int(proc.wait(timeout=wait_s)) if wait_s > 0 else proc.poll()
    except subprocess.TimeoutExpired:
        return None


def jvm_failure(code: int) -> str:
    """What a dead JVM means for the user, in one sentence."""
    if code == EXIT_OUT_OF_MEMORY:
        return (f"Spark's JVM ran out of memory and exited (heap {driver_memory()}); give it more with "
                "KK_SPARK_DRIVER_MEMORY (e.g. 8g), or run on a cluster with --master")
    return f"Spark's JVM exited with status {code}"


@dataclass(frozen=True)
class JvmCosts:
    """CPU seconds the driver's JVM has spent since it started: in all, in its JIT compiler
    threads, and in its garbage collector's threads (HotSpot's thread names). In local mode the
    executors are threads of that JVM, so this is the whole job's."""

    cpu_s: float
    jit_s: float
    gc_s: float

    def line(self) -> str:
        return (f"driver JVM CPU since start {self.cpu_s:.1f} s, of it JIT compiler threads "
                f"{self.jit_s:.1f} s, GC threads {self.gc_s:.1f} s")


def _cpu_s(stat: str) -> float:
    """utime + stime of a /proc stat line, in seconds (fields after the parenthesised name,
    which may hold spaces)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def jvm_costs(spark: SparkSession) -> JvmCosts | None:
    """The driver JVM's CPU so far, from Linux's /proc (its threads by name: "C2 CompilerThre",
    "GC Thread#0", ...); None elsewhere. Threads that have ended are counted in the total only."""
    try:
        pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
        proc = Path(f"/proc/{pid}")
        total = _cpu_s((proc / "stat").read_text())
        jit = gc = 0.0
        for task in proc.joinpath("task").iterdir():
            try:
                name, stat = (task / "comm").read_text(), (task / "stat").read_text()
            except OSError:  # the thread ended meanwhile
                continue
            if name.startswith(("C1 Compiler", "C2 Compiler")):
                jit += _cpu_s(stat)
            elif name.startswith(("GC Thread", "VM Thread")):
                gc += _cpu_s(stat)
    except (Py4JError, OSError, ValueError, IndexError):  # not Linux, or the JVM is elsewhere
        return None
    return JvmCosts(total, jit, gc)


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
        # expression code): the parse of every line runs in one generated loop (the partial
        # aggregation in a second, transform._outside_codegen), invoked once per task, which
        # the JIT can only compile on-stack while it runs; small methods are called once per
        # line and compiled early, and the slow path's, rarely called, not at all. Measured at
        # 10 M events, fresh JVM (the bench): the one Spark job 105 s -> 64 s at 256, 61 s at 128.
        .config("spark.sql.codegen.methodSplitThreshold",
                os.environ.get("KK_SPARK_METHOD_SPLIT", "128"))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # The per-recovery rows come back as Arrow batches held in the driver's heap (10 M
        # events: 1.4 M rows): 2g ran out of memory there.
        .config("spark.driver.memory", driver_memory())
    )
    # The event parser's generated Java method is large (one CASE per rule of the event schema);
    # HotSpot leaves methods over 8000 bytes of bytecode interpreted unless told otherwise,
    # which made parsing ~5x slower.
    #
    # -XX:+ExitOnOutOfMemoryError: an OutOfMemoryError in a thread that serves a collect to
    # Python (or in the planner) leaves the JVM up with the Python side waiting on a socket that
    # never delivers: the job hung forever (seen when a plan grew too large, and on a collect too
    # large for the heap). Exiting closes the sockets, the Python call fails at once, and the
    # job reports it (``jvm_exit_code``). In local mode the executors are threads of this JVM,
    # so a task's OOM ends the job too, as it ends an executor process on a cluster.
    #
    # -XX:+UseParallelGC: the throughput collector, for a batch job whose only goal is to end
    # soon. With the default (G1) the one Spark job at 10 M events took 57-108 s from run to run
    # on 2 cores (its concurrent threads compete with the two task threads); with ParallelGC
    # 51.6-54.1 s (kraftkeeper report on the bench's input, one after the other, same machine).
    flags = ["-XX:-DontCompileHugeMethods", "-XX:+ExitOnOutOfMemoryError", "-XX:+UseParallelGC"]
    jvm = list(flags)
    log4j = os.environ.get("KK_SPARK_LOG4J", str(Path(__file__).with_name("log4j2.properties")))
    if Path(log4j).is_file():
        jvm.append(f"-Dlog4j2.configurationFile=file:{log4j}")
    builder = builder.config("spark.driver.extraJavaOptions", " ".join(jvm)).config(
        "spark.executor.extraJavaOptions", " ".join(flags)
    )
    if is_local(master):
        builder = builder.config("spark.driver.host", LOOPBACK).config("spark.driver.bindAddress", LOOPBACK)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
