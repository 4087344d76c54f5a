"""The history checks of the power-loss tests (``tests.powerloss.history``) on small made-up
histories: each check passes a correct history and names what is wrong in a broken one."""

from __future__ import annotations

from tests.powerloss.history import Op, check_registers, duplicate_offsets, linearizable, stale_reads


def put(value: str, start: float, end: float | None, offset: int | None = None) -> Op:
    return Op("put", value.split("#")[0], value, start, end, offset)


def get(key: str, value: str | None, start: float, end: float) -> Op:
    return Op("get", key, value, start, end)


def test_sequential_and_concurrent_histories_are_linearizable() -> None:
    h = [put("k#1", 0, 1, 10), get("k", "k#1", 2, 3), put("k#2", 4, 5, 11), get("k", "k#2", 6, 7)]
    assert linearizable(h) and not stale_reads(h)
    # A read overlapping a write may see either value.
    h = [put("k#1", 0, 1), put("k#2", 2, 6), get("k", "k#1", 3, 4), get("k", "k#2", 4.5, 5)]
    assert linearizable(h)
    assert linearizable([get("k", None, 0, 1), put("k#1", 2, 3)])


def test_a_stale_read_is_found() -> None:
    h = [put("k#1", 0, 1, 10), put("k#2", 2, 3, 11), get("k", "k#1", 4, 5)]
    assert not linearizable(h)
    assert stale_reads(h) == [
        "k: a read at 4.000 returned 'k#1', older than 'k#2' acknowledged at 3.000 (offset 11)"
    ]
    assert "k: not linearizable (3 operations)" in check_registers(h)[0]


def test_a_lost_write_is_found() -> None:
    h = [put("k#1", 0, 1, 10), get("k", None, 2, 3)]
    assert not linearizable(h)
    assert "found nothing" in stale_reads(h)[0]


def test_a_read_going_back_in_time_is_found() -> None:
    # Both values acknowledged and read, but a later read sees the older one again.
    h = [put("k#1", 0, 1), put("k#2", 0.5, 5), get("k", "k#2", 2, 3), get("k", "k#1", 3.5, 4)]
    assert not linearizable(h)


def test_indeterminate_writes() -> None:
    # Never seen: it may never have happened.
    assert linearizable([put("k#1", 0, 1), put("k#2", 2, None), get("k", "k#1", 5, 6)])
    # Seen: it happened, at any time after it started, even long after.
    h = [put("k#1", 0, 1), put("k#2", 0.5, None), get("k", "k#1", 5, 6), get("k", "k#2", 7, 8)]
    assert linearizable(h)
    # But not before it started.
    assert not linearizable([get("k", "k#2", 0, 1), put("k#2", 2, None)])
    # Once seen, a later read cannot go back before it.
    h = [put("k#1", 0, 1), put("k#2", 2, None), get("k", "k#2", 3, 4), get("k", "k#1", 5, 6)]
    assert not linearizable(h)


def test_two_acknowledged_writes_at_one_offset() -> None:
    h = [put("a#1", 0, 1, 7), put("b#2", 2, 3, 7)]
    assert duplicate_offsets(h) == ["offset 7 acknowledged twice: 'a#1' and 'b#2'"]
