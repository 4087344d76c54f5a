"""quorum.timefmt: the one RFC 3339 format, written and read back."""

from __future__ import annotations

import pytest

from quorum.timefmt import now_ms, parse_rfc3339, rfc3339


def test_seconds_and_millis_forms_read_back() -> None:
    ms = 1_795_923_946_123  # 2026-11-29T03:45:46.123Z
    assert rfc3339(ms) == "2026-11-29T03:45:46Z"
    assert rfc3339(ms, millis=True) == "2026-11-29T03:45:46.123Z"
    assert parse_rfc3339(rfc3339(ms, millis=True)) == ms
    assert parse_rfc3339(rfc3339(ms)) == ms - 123
    assert parse_rfc3339("2026-11-29T04:45:46.123+01:00") == ms


def test_now_is_now() -> None:
    before = now_ms()
    stamp = parse_rfc3339(rfc3339(millis=True))
    assert before <= stamp <= now_ms()


@pytest.mark.parametrize("bad", ["", "yesterday", "2026-11-29T03:45:46", "2026-13-01T00:00:00Z"])
def test_bad_stamps_are_refused_by_name(bad: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_rfc3339(bad)
