"""The poll loop of the tests, which lives in :mod:`testkit.polling` (shared with the benches);
these names stay importable from here."""

from testkit.polling import T, async_wait_until, now, wait_until

__all__ = ["T", "async_wait_until", "now", "wait_until"]
