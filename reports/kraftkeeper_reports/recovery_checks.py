"""The recovery-level checks of the report, as Spark columns over one recovery's row of first
timestamps and counts (``transform._recovery_rows`` applies them): a step stamped before a step
it must follow (KIP-856's AddThenRemove or RemoveThenAdd), and each recovery-level problem as
(code, condition, message). ``EXCLUDING`` names the problems that take a recovery out of the
statistics; the others only annotate it (the module docstring of ``transform`` defines each).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from kraftkeeper_reports import events as ev
from kraftkeeper_reports.tables import TS_COL

__all__ = ["EXCLUDING", "fmt_ts", "order_violation", "problems", "violation"]


def order_violation(steps: list[str]) -> Column:
    """The first step stamped before a step it follows in ``steps`` (protocol order), as a
    message, or null. Step j violates the order when ts(j) < max(ts of steps 0..j-1); the message
    names it and the latest of its predecessors. Written with array functions, not one CASE per
    pair: a 21-way nested expression is too large for Spark's code generation and runs
    interpreted (much slower)."""
    names = F.array(*[F.lit(x) for x in steps])
    tsa = F.array(*[F.col(TS_COL[x]) for x in steps])
    viol = F.array(*[F.col(TS_COL[steps[j]]) < F.array_max(F.slice(tsa, 1, j)) for j in range(1, len(steps))])
    p = F.array_position(viol, True)  # 0: none; else the violating step's index (0-based) is p
    prev = F.array_max(F.slice(tsa, F.lit(1), p.cast("int")))
    i1 = F.array_position(F.slice(tsa, F.lit(1), p.cast("int")), prev).cast("int")
    j1 = (p + 1).cast("int")
    return F.when(
        p > 0,
        F.format_string(
            "%s at %s is %d ms before %s at %s",
            F.element_at(names, j1), fmt_ts(F.element_at(tsa, j1)), prev - F.element_at(tsa, j1),
            F.element_at(names, i1), fmt_ts(prev),
        ),
    )


def violation() -> Column:
    """KIP-856's AddThenRemove or RemoveThenAdd (Kafka refuses a second directory id per voter
    id, KIP-853; the watcher and auto-join) are both protocol orders; a recovery that fits
    neither is named by its first step out of KIP-856 order. The end itself must not precede
    detection (a negative total)."""
    add_first = list(ev.STEP_TYPES)
    remove_first = [*add_first[:2], *add_first[4:], *add_first[2:4]]
    violation = F.when(order_violation(remove_first).isNotNull(), order_violation(add_first))
    return F.when(
        F.col("t_end") < F.col("t_detected"),
        F.format_string("recovery ended %d ms before it was detected", F.col("t_detected") - F.col("t_end")),
    ).otherwise(violation)


EXCLUDING = ("missing_detection", "impossible_order", "conflicting_outcome", "incomplete_steps",
              "inconsistent_replica")


def problems() -> list[tuple[str, Column, Column]]:
    """The recovery-level problems as (code, condition, message), in the table's order."""
    # A milestone logged twice: its first one is used (a replica that caught up again is one of
    # those); the notes in between (fell behind, resumed) may recur freely.
    dup = F.greatest(*[F.col(f"n_{t}") for t in (*ev.STEP_TYPES, *ev.TERMINAL_TYPES, *ev.UNCLEAN_TYPES)]) > 1
    return [
        # An unclean recovery (KIP-704 style) has no replaced disk, so no detection event.
        ("missing_detection", F.col("t_detected").isNull() & F.col(TS_COL[ev.UNCLEAN_RECOVERY]).isNull(),
         F.lit(f"no {ev.DISK_REPLACEMENT_DETECTED} event")),
        ("impossible_order", F.col("order_violation").isNotNull(), F.col("order_violation")),
        ("conflicting_outcome", F.col("t_completed").isNotNull() & F.col("t_failed").isNotNull(),
         F.lit(f"both {ev.RECOVERY_COMPLETED} and {ev.RECOVERY_FAILED}")),
        ("incomplete_steps",
         F.col("t_completed").isNotNull()
         & (F.col("t_add_voter_committed").isNull() | F.col("t_remove_voter_committed").isNull()),
         F.lit(f"{ev.RECOVERY_COMPLETED} without {ev.ADD_VOTER_COMMITTED} and {ev.REMOVE_VOTER_COMMITTED}")),
        ("inconsistent_replica", F.col("replica_id") != F.col("replica_id_max"),
         F.format_string("replica_id varies from %d to %d", F.col("replica_id"), F.col("replica_id_max"))),
        ("event_after_end", F.col("n_after_end") > 0,
         F.format_string("%d event(s) after the recovery ended", F.col("n_after_end"))),
        ("duplicate_event", dup, F.lit("a step was logged more than once (first one used)")),
    ]


def fmt_ts(c: Column) -> Column:
    return F.date_format(F.timestamp_millis(c), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")
