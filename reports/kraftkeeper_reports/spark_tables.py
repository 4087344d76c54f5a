"""The report's small tables written in Spark, one function per table, from the per-recovery
rows of :func:`kraftkeeper_reports.transform.sessionise` (phase statistics and histogram,
outcomes, failures, daily counts, the slowest recoveries, engines and orders compared) and the
bad-input table from the line and recovery problems. The job computes the same tables on the
driver (:mod:`kraftkeeper_reports.tables`, one Spark job instead of one per table); these
definitions stay beside it so the tests can compare the two.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kraftkeeper_reports.columns import PERCENTILES
from kraftkeeper_reports.intervals import (
    PHASES,
)
from kraftkeeper_reports.tables import (
    ALL_CLUSTERS,
    LINE_ACTION,
    RECOVERY_ACTION,
    TS_COL,
    UNSPECIFIED,
)


def recovery_problems(recoveries: DataFrame) -> DataFrame:
    """(level, code, example, message) for every recovery-level problem."""
    exploded = recoveries.where(F.size("problem_messages") > 0).select(
        "cluster", "recovery_id", F.explode("problem_messages").alias("pm")
    )
    code = F.substring_index("pm", ": ", 1)
    return exploded.select(
        F.lit("recovery").alias("level"),
        code.alias("code"),
        F.concat_ws(" ", F.col("cluster"), F.col("recovery_id"), F.lit("->"), F.col("pm")).alias("example"),
        F.col("pm").alias("message"),
    )


def bad_input(problems: DataFrame) -> DataFrame:
    """Counts by (level, reason, code) with up to three examples each, most frequent first.

    Examples are picked with min_by/max_by over a hash, so memory stays bounded whatever the
    number of bad lines (no collect_list of all of them)."""
    reason = F.substring_index("code", ":", 1)
    h = F.xxhash64("example")
    g = problems.withColumn("reason", reason).groupBy("level", "reason", "code").agg(
        F.count(F.lit(1)).alias("count"),
        F.min_by("example", h).alias("ex1"),
        F.max_by("example", h).alias("ex2"),
        F.first("example").alias("ex3"),
        F.first("message").alias("message"),
    )
    actions = {**LINE_ACTION, **RECOVERY_ACTION}
    action = F.coalesce(
        F.element_at(F.create_map(*[F.lit(x) for kv in actions.items() for x in kv]), F.col("reason")),
        F.lit("counted"),
    )
    return g.select(
        "level", "reason", "code", action.alias("action"), "count",
        F.array_distinct(F.filter(F.array("ex1", "ex2", "ex3"), lambda x: x.isNotNull())).alias("examples"),
        "message",
    ).orderBy(F.desc("count"), "level", "code")


def phase_long(recoveries: DataFrame, keys: tuple[str, ...] = ("cluster",)) -> DataFrame:
    """(*keys, phase, ms) for every completed recovery and phase."""
    stack = ", ".join(f"'{p}', {p}_ms" for p in PHASES)
    return (
        recoveries.where(F.col("outcome") == "completed")
        .select(*keys, F.expr(f"stack({len(PHASES)}, {stack}) as (phase, ms)"))
        .where(F.col("ms").isNotNull())
    )


def compare(recoveries: DataFrame) -> DataFrame:
    """Per (engine, order, phase) over completed recoveries: count, p50/p90/p99, max. Engine and
    order come from the events' ``detail`` (e.g. a Kafka quorum watched by the operator, or the
    RemoveThenAdd / AddThenRemove order); "(not logged)" where the events do not say."""
    long = phase_long(
        recoveries.withColumn("engine", F.coalesce("engine", F.lit(UNSPECIFIED)))
        .withColumn("order", F.coalesce("order", F.lit(UNSPECIFIED))),
        ("engine", "order"),
    )
    pct = F.percentile(F.col("ms").cast("double"), F.array(*[F.lit(p) for p in PERCENTILES]))
    return (
        long.groupBy("engine", "order", "phase")
        .agg(F.count(F.lit(1)).alias("recoveries"), pct.alias("pct"), F.max("ms").alias("max_ms"))
        .select("engine", "order", "phase", "recoveries",
                *[F.col("pct")[i].alias(f"p{round(p * 100)}_ms") for i, p in enumerate(PERCENTILES)],
                "max_ms")
        .orderBy("engine", "order", "phase")
    )


def phase_stats(recoveries: DataFrame) -> DataFrame:
    """p50/p90/p99/max per phase, per cluster and over all clusters (cluster = "(all)").

    One aggregation pass: rollup(phase, cluster) yields both levels (its grand total row,
    with phase null, is dropped)."""
    long = phase_long(recoveries)
    pct = F.percentile(F.col("ms").cast("double"), F.array(*[F.lit(p) for p in PERCENTILES]))
    g = long.rollup("phase", "cluster").agg(
        F.grouping("cluster").alias("g"),
        F.count(F.lit(1)).alias("recoveries"),
        F.min("ms").alias("min_ms"),
        pct.alias("pct"),
        F.max("ms").alias("max_ms"),
        F.avg("ms").alias("mean_ms"),
    )
    return (
        g.where(F.col("phase").isNotNull())
        .select(
            F.when(F.col("g") == 1, F.lit(ALL_CLUSTERS)).otherwise(F.col("cluster")).alias("cluster"),
            "phase", "recoveries", "min_ms",
            *[F.col("pct")[i].alias(f"p{round(p * 100)}_ms") for i, p in enumerate(PERCENTILES)],
            "max_ms", "mean_ms",
        )
        .orderBy("phase", "cluster")
    )


def phase_histogram(recoveries: DataFrame, bins_per_decade: int = 10) -> DataFrame:
    """Counts of each phase's durations in logarithmic bins (for the distribution plots):
    (phase, bin_lo_ms, bin_hi_ms, count). Durations of 0 ms fall in the first bin."""
    long = phase_long(recoveries)
    b = F.floor(F.log10(F.greatest(F.col("ms").cast("double"), F.lit(1.0))) * bins_per_decade)
    return (
        long.withColumn("bin", b)
        .groupBy("phase", "bin")
        .agg(F.count(F.lit(1)).alias("count"))
        .select(
            "phase",
            F.pow(F.lit(10.0), F.col("bin") / bins_per_decade).alias("bin_lo_ms"),
            F.pow(F.lit(10.0), (F.col("bin") + 1) / bins_per_decade).alias("bin_hi_ms"),
            "count",
        )
        .orderBy("phase", "bin_lo_ms")
    )


def outcomes(recoveries: DataFrame) -> DataFrame:
    """Recoveries by cluster and outcome (completed / failed / in_progress / invalid)."""
    return recoveries.groupBy("cluster", "outcome").agg(F.count(F.lit(1)).alias("recoveries")).orderBy(
        "cluster", "outcome"
    )


def failures(recoveries: DataFrame) -> DataFrame:
    """Failed recoveries by reason (and cluster, with "(all)"), with the median time to give up."""
    failed = recoveries.where(F.col("outcome") == "failed")

    def agg(df: DataFrame, keys: list[str]) -> DataFrame:
        return df.groupBy(*keys).agg(
            F.count(F.lit(1)).alias("failures"),
            F.percentile(F.col("give_up_ms").cast("double"), F.lit(0.5)).alias("p50_give_up_ms"),
        )

    per = agg(failed, ["cluster", "failure_reason"])
    overall = agg(failed, ["failure_reason"]).withColumn("cluster", F.lit(ALL_CLUSTERS))
    return per.unionByName(overall).orderBy(F.desc("failures"))


def daily(recoveries: DataFrame) -> DataFrame:
    """Per UTC day (of detection): recoveries, completed, failed, failure rate, p50/p90 total."""
    return (
        recoveries.where(F.col("outcome").isin("completed", "failed"))
        .groupBy("date")
        .agg(
            F.count(F.lit(1)).alias("recoveries"),
            F.sum(F.when(F.col("outcome") == "completed", 1).otherwise(0)).alias("completed"),
            F.sum(F.when(F.col("outcome") == "failed", 1).otherwise(0)).alias("failed"),
            F.percentile(F.col("total_ms").cast("double"), F.array(F.lit(0.5), F.lit(0.9))).alias("pct"),
        )
        .select(
            "date", "recoveries", "completed", "failed",
            (F.col("failed") / F.col("recoveries")).alias("failure_rate"),
            F.col("pct")[0].alias("p50_total_ms"),
            F.col("pct")[1].alias("p90_total_ms"),
        )
        .orderBy("date")
    )


def slowest(recoveries: DataFrame, n: int = 20) -> DataFrame:
    """The n slowest completed recoveries with their timelines (every step's timestamp)."""
    return (
        recoveries.where(F.col("outcome") == "completed")
        .orderBy(F.desc("total_ms"), "cluster", "recovery_id")
        .limit(n)
        .select("cluster", "recovery_id", "replica_id", "date", "engine", "order", *TS_COL.values(),
                *[f"{p}_ms" for p in PHASES])
    )
