"""bench.write_trace's timeline: one write followed across the leader and the follower whose
acknowledging Fetch left first (pure, no cluster)."""

from __future__ import annotations

from pathlib import Path

from bench.write_trace import PATH, hops, load, report

LEADER, FAST, SLOW = 10, 20, 30


def _write(t0: int, events: list[tuple[int, int, str]]) -> None:
    """One write along PATH, 1 µs per hop; the slow follower acknowledges last."""
    t = t0
    for role, tag, _what in PATH:
        pid = LEADER if role == "L" else FAST
        events.append((t, pid, tag))
        if role == "F":
            events.append((t + 500, SLOW, tag))  # the other follower, later on every hop
        t += 1000


def test_each_hop_is_timed_on_the_follower_that_acknowledged_first(tmp_path: Path) -> None:
    events: list[tuple[int, int, str]] = []
    for w in range(6):
        _write(w * 100_000, events)
    for pid in (LEADER, FAST, SLOW):
        lines = [f"{ns} {tag}" + (" commit=3" if tag == "begin" else "") for ns, p, tag in events if p == pid]
        (tmp_path / f"t.{pid}").write_text("\n".join(lines) + "\n")
    loaded, leader = load(tmp_path)
    assert leader == LEADER and len(loaded) == len(events)
    per_hop = hops(loaded, leader)
    assert len(per_hop) == len(PATH) - 1
    # the first 3 writes are skipped (connections opening); each hop took 1 µs
    assert all(h == [1.0, 1.0, 1.0] for h in per_hop), per_hop
    assert "3 writes followed" in report(loaded, leader)
