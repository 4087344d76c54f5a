"""A small Prometheus text-format registry for the node (no client library, so the engine's
image stays small).

Names follow KIP-595's raft metrics (``current-leader``, ``high-watermark``, ...) and KIP-856's
(``number-of-voters``, ``pending-add-voter``, ...), rendered in Prometheus style:
``kraftkeeper_current_leader``.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

# Latency buckets in seconds, fine at the low end where commits live.
DEFAULT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Histogram:
    help: str
    buckets: tuple[float, ...] = DEFAULT_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.n += 1


class Registry:
    """Gauges and counters set by name; histograms observed by name."""

    def __init__(self, prefix: str = "kraftkeeper") -> None:
        self.prefix = prefix
        self.gauges: dict[str, tuple[str, float]] = {}
        self.counters: dict[str, tuple[str, float]] = {}
        self.histograms: dict[str, Histogram] = {}
        self.states: dict[str, tuple[str, str]] = {}  # enum gauges: name -> (help, current state)

    def set(self, name: str, value: float, help: str = "") -> None:
        old = self.gauges.get(name)
        self.gauges[name] = (help or (old[0] if old else name), float(value))

    def inc(self, name: str, by: float = 1.0, help: str = "") -> None:
        old = self.counters.get(name)
        self.counters[name] = (help or (old[0] if old else name), (old[1] if old else 0.0) + by)

    def set_state(self, name: str, state: str, help: str = "") -> None:
        """An enum gauge (KIP-595 ``current-state``): rendered as ``name{state="..."} 1``."""
        self.states[name] = (help or name, state)

    def histogram(self, name: str, help: str) -> Histogram:
        h = self.histograms.get(name)
        if h is None:
            h = self.histograms[name] = Histogram(help)
        return h

    def _n(self, name: str) -> str:
        return f"{self.prefix}_{name}".replace("-", "_")

    def render(self) -> str:
        out: list[str] = []
        for name, (help, v) in sorted(self.gauges.items()):
            n = self._n(name)
            out += [f"# HELP {n} {help}", f"# TYPE {n} gauge", f"{n} {_fmt(v)}"]
        for name, (help, state) in sorted(self.states.items()):
            n = self._n(name)
            out += [f"# HELP {n} {help}", f"# TYPE {n} gauge", f'{n}{{state="{state}"}} 1']
        for name, (help, v) in sorted(self.counters.items()):
            n = self._n(name) + "_total"
            out += [f"# HELP {n} {help}", f"# TYPE {n} counter", f"{n} {_fmt(v)}"]
        for name, h in sorted(self.histograms.items()):
            n = self._n(name)
            out += [f"# HELP {n} {h.help}", f"# TYPE {n} histogram"]
            acc = 0
            for b, c in zip(h.buckets, h.counts, strict=True):
                acc += c
                out.append(f'{n}_bucket{{le="{_fmt(b)}"}} {acc}')
            out += [f'{n}_bucket{{le="+Inf"}} {h.n}', f"{n}_sum {_fmt(h.total)}", f"{n}_count {h.n}"]
        return "\n".join(out) + "\n"


def _fmt(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(v)
