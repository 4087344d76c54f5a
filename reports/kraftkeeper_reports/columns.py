"""The per-recovery columns the report's small tables read (:class:`Columns`), as numpy arrays
taken once from the Spark job's Arrow rows, and the grouped statistics over them (count, exact
percentiles, min, mean, max per group) without a pandas frame per recovery; the tables themselves
are :mod:`kraftkeeper_reports.tables`. No pyspark import.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]


class Columns:
    """The per-recovery columns the small tables read, taken once from the Spark job's Arrow
    rows as numpy arrays: a string column as codes into its few distinct values (-1 for null),
    a number column as int64 with a validity mask. No per-recovery Python object is made: a
    pandas frame of the 1.4 M recoveries of 10 M events (with its string columns as Python
    strings) cost seconds and GiBs on the driver, and each table needs only a few columns."""

    def __init__(self, rec: pa.Table) -> None:
        self.rec = rec
        self._codes: dict[str, tuple[np.ndarray, list[Any]]] = {}
        self._ints: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        outcome, names = self.codes("outcome")
        self.completed = is_value(outcome, names, "completed")
        self.failed = is_value(outcome, names, "failed")

    def codes(self, name: str) -> tuple[np.ndarray, list[Any]]:
        """Codes (int64, -1 for null) into the column's distinct values (in first-seen order)."""
        if name not in self._codes:
            col = self.rec.column(name)
            values = pc.drop_null(pc.unique(col))
            codes = pc.fill_null(pc.index_in(col, value_set=values), -1).to_numpy()
            self._codes[name] = (codes.astype(np.int64), values.to_pylist())
        return self._codes[name]

    def ints(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """The column as int64 (nulls as 0) and its validity mask."""
        if name not in self._ints:
            col = self.rec.column(name)
            valid = col.is_valid().to_numpy(zero_copy_only=False)
            self._ints[name] = (pc.fill_null(col, 0).to_numpy().astype(np.int64, copy=False), valid)
        return self._ints[name]

    def durations(self, phase: str) -> tuple[np.ndarray, np.ndarray]:
        """The completed recoveries that have this phase: their row mask and durations (ms)."""
        ms, valid = self.ints(f"{phase}_ms")
        keep = self.completed & valid
        return keep, ms[keep]


PERCENTILES = (0.5, 0.9, 0.99)  # the percentiles every duration table shows


def is_value(codes: np.ndarray, names: list[Any], value: str) -> np.ndarray:
    return codes == names.index(value) if value in names else np.zeros(len(codes), dtype=bool)


def merge_labels(codes: np.ndarray, names: list[Any], null: Any) -> tuple[np.ndarray, list[Any]]:
    """Codes where null is the value ``null`` (a value equal to one of ``names`` shares its code)."""
    labels = [*names, null]
    uniq = list(dict.fromkeys(labels))
    remap = np.array([uniq.index(x) for x in labels], dtype=np.int64)
    return remap[np.where(codes < 0, len(names), codes)], uniq


def group_sort(codes: np.ndarray, ms: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """``ms`` (int64) sorted by group (``codes`` 0 .. n_groups-1) and within it, and each group's
    size. One int64 sort of code * span + ms when that fits (a sort per group, or pandas'
    grouped quantile that sorts once per percentile, took most of the driver's time)."""
    counts = np.bincount(codes, minlength=n_groups).astype(np.int64)
    if len(ms) == 0:
        return ms, counts
    if n_groups == 1:
        return np.sort(ms), counts
    lo = int(ms.min())
    span = int(ms.max()) - lo + 1
    if n_groups * span < 2**62:
        key = codes * span
        key -= lo
        key += ms  # code * span + (ms - lo), in place: no temporary of a million values
        key.sort()
        # Each group's offset off again (code * span - lo, repeated over the group's rows).
        key -= np.repeat(np.arange(n_groups, dtype=np.int64) * span - lo, counts)
        return key, counts
    return ms[np.lexsort((ms, codes))], counts


def quantiles(v: np.ndarray, counts: np.ndarray, q: float) -> np.ndarray:
    """The q-quantile of each group of sorted ``v`` (groups of ``counts`` values, in order),
    interpolating linearly between the two nearest ranks as numpy's default, pandas' grouped
    quantile and Spark's ``percentile`` do; NaN for an empty group. The arithmetic is pandas'
    (lo + (hi - lo) * fraction), so the values are the ones it gave to the last bit."""
    out = np.full(len(counts), np.nan)
    has = counts > 0
    n = counts[has]
    starts = (np.cumsum(counts) - counts)[has]
    pos = (n - 1) * q
    lo = np.floor(pos).astype("int64")
    hi = np.minimum(lo + 1, n - 1)
    below, above = v[starts + lo].astype("float64"), v[starts + hi].astype("float64")
    out[has] = below + (above - below) * (pos - lo)
    return out


def group_stats(
    codes: np.ndarray, ms: np.ndarray, n_groups: int, with_min_mean: bool
) -> dict[str, np.ndarray]:
    """Recoveries, [min,] the PERCENTILES, max [and mean] of ``ms`` per group of ``codes`` (rows
    of code -1 belong to no group), for the groups that have any row, as index "group"."""
    kept = codes >= 0
    if not kept.all():
        codes, ms = codes[kept], ms[kept]
    v, counts = group_sort(codes, ms, n_groups)
    has = counts > 0
    starts = (np.cumsum(counts) - counts)[has]
    last = starts + counts[has] - 1
    out: dict[str, np.ndarray] = {"group": np.flatnonzero(has), "recoveries": counts[has]}
    if with_min_mean:
        out["min_ms"] = v[starts]
    for p in PERCENTILES:
        out[f"p{round(p * 100)}_ms"] = quantiles(v, counts, p)[has]
    out["max_ms"] = v[last]
    if with_min_mean:
        # bincount adds each group's values in row order, as before (the same float sums).
        sums = np.bincount(codes, weights=ms.astype("float64"), minlength=n_groups)
        out["mean_ms"] = sums[has] / counts[has]
    return out


def labelled(stats: dict[str, np.ndarray], labels: dict[str, list[Any]]) -> pd.DataFrame:
    """A frame of ``group_stats`` output with its group numbers replaced by key columns."""
    g = stats.pop("group")
    keys = {k: np.array([v[i] for i in g], dtype=object) for k, v in labels.items()}
    return pd.DataFrame({**keys, **stats})


def group_percentile(s: Any, name: str, q: float) -> pd.Series:
    """Exact percentile per group (``s`` a SeriesGroupBy), linear interpolation between ranks
    (numpy's default, and Spark's ``percentile``)."""
    out: pd.Series = s.quantile(q).rename(name)
    return out


def rows_frame(rec: pa.Table, mask: np.ndarray, columns: list[str]) -> pd.DataFrame:
    """The rows of ``mask`` (few) as pandas, with the dtypes a frame of every row would give
    them: an integer column with a null in any recovery is float64 there (pandas' NaN)."""
    t = rec.select(columns).filter(pa.array(mask))
    df: pd.DataFrame = t.to_pandas()
    for c in columns:
        if rec.column(c).null_count and not t.column(c).null_count:
            if pa.types.is_integer(t.schema.field(c).type):
                df[c] = df[c].astype("float64")
            elif pa.types.is_boolean(t.schema.field(c).type):
                df[c] = df[c].astype(object)
    return df
