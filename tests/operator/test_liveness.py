"""The sharper liveness of voter changes (view.py ``live_for_change``) and the guards that use it:
a voter killed a moment ago still counts live for status (the policy's window) but not toward
the majority that must commit a change, so the controller does not start a RemoveVoter or AddVoter
that cannot commit."""

from __future__ import annotations

from itertools import product

import pytest
from kraftkeeper_operator.core.guards import guard_add, guard_remove
from kraftkeeper_operator.core.recovery import (
    Order,
    Phase,
    QuorumView,
    Recovery,
    RecoveryBook,
    RecoveryPolicy,
    Replica,
)
from kraftkeeper_operator.core.view import CHANGE_FETCH_SILENCE_MS, live_for_change

NOW = 1_700_000_000_000
WINDOW = 5_000
OLD, NEW = "00000000-0000-4000-8000-000000000003", "00000000-0000-4000-8000-0000000000a3"


def uid(i: int) -> str:
    return f"00000000-0000-4000-8000-00000000000{i}"


def rep(
    i: int, *, fetch_ago: int | None = 100, caught_ago: int | None = 100, u: str | None = None
) -> Replica:
    return Replica(
        i,
        u or uid(i),
        lag=0,
        last_fetch_ms=NOW - fetch_ago if fetch_ago is not None else -1,
        last_caught_up_ms=NOW - caught_ago if caught_ago is not None else -1,
    )


@pytest.mark.parametrize(
    ("fetch_ago", "caught_ago", "live"),
    [
        (100, 100, True),  # fetching and caught up
        (1_400, 1_400, True),  # within three fetch long-polls
        (CHANGE_FETCH_SILENCE_MS + 1, 100, False),  # killed 1.5 s ago: still in the window, not live
        (3_000, 3_000, False),
        (100, None, True),  # caught-up time not reported: only the fetch rule
        (100, 4_999, True),
        (100, WINDOW + 1, False),  # fetching but not caught up for a whole window: falling behind
        (None, None, False),  # never fetched
    ],
)
def test_live_for_change_table(fetch_ago: int | None, caught_ago: int | None, live: bool) -> None:
    r = rep(2, fetch_ago=fetch_ago, caught_ago=caught_ago)
    assert live_for_change(r, is_leader=False, now_ms=NOW, window_ms=WINDOW) is live
    # The leader always counts, whatever the timestamps say about its own entry.
    assert live_for_change(r, is_leader=True, now_ms=NOW, window_ms=WINDOW)


def test_live_for_change_is_never_more_permissive_than_the_status_rule() -> None:
    """The docstring's invariant, over a grid of timestamps and windows."""
    agos = [None, 0, 499, 1_000, 1_499, 1_500, 1_501, 2_000, 2_999, 3_000, 4_999, 5_000, 5_001, 60_000]
    for fetch_ago, caught_ago, window in product(agos, agos, [500, 1_000, 3_000, 5_000, 30_000]):
        r = rep(2, fetch_ago=fetch_ago, caught_ago=caught_ago)
        view = QuorumView(1, 7, 100, (rep(1), r))
        if view.live_for_change(r, NOW, window):
            assert view.is_live(r, NOW, window), (fetch_ago, caught_ago, window)


def _view(voters: tuple[Replica, ...], observers: tuple[Replica, ...] = ()) -> QuorumView:
    return QuorumView(1, 7, 100, voters, observers)


def _rec(phase: Phase) -> Recovery:
    return Recovery("r-1", 3, OLD, NEW, phase, NOW - 60_000, caught_up_since_ms=NOW - 30_000)


POLICY = RecoveryPolicy(stabilization_seconds=10, max_lag=10, live_window_seconds=WINDOW / 1000)


def test_remove_voter_is_refused_when_a_remaining_voter_was_just_killed() -> None:
    """RemoveThenAdd, 3 voters: removing (3, old) leaves {1, 2}, which needs both. Voter 2 was
    killed 2 s ago: live by the 5 s window (no QuorumLost), but RemoveVoter could not commit."""
    policy = RecoveryPolicy(
        order=Order.REMOVE_THEN_ADD, stabilization_seconds=10, max_lag=10, live_window_seconds=WINDOW / 1000
    )
    voters = (rep(1), rep(2, fetch_ago=2_000, caught_ago=2_000), rep(3, fetch_ago=60_000, u=OLD))
    view = _view(voters, (rep(3, u=NEW),))
    assert view.has_live_majority(NOW, WINDOW)  # status: the quorum has a live majority
    got = guard_remove(view, _rec(Phase.CAUGHT_UP), policy, NOW)
    assert isinstance(got, str) and "unsafe: RemoveVoter would leave 1 live of 2 voters" in got
    # The same with voter 2 fetching: allowed.
    ok = _view((rep(1), rep(2), rep(3, fetch_ago=60_000, u=OLD)), (rep(3, u=NEW),))
    assert not isinstance(guard_remove(ok, _rec(Phase.CAUGHT_UP), policy, NOW), str)


def test_the_controller_decision_refuses_and_says_why() -> None:
    """AddThenRemove after AddVoter: voters {1, 2, 4, 5, (3, old), (3, new)}... with 2 and 4
    killed a moment ago, removing (3, old) leaves 5 voters of which 1, 5 and (3, new) are live:
    3 of 5 is a majority, allowed; with 5 killed too it is not, and next_action says so."""
    rec = _rec(Phase.ADDED)
    book = RecoveryBook(POLICY, [rec])
    base = (
        rep(1),
        rep(2, fetch_ago=2_000),
        rep(4, fetch_ago=2_000),
        rep(3, fetch_ago=60_000, u=OLD),
        rep(3, u=NEW),
    )
    ok = _view((*base, rep(5)))
    action = book.next_action(ok, NOW)
    assert action is not None and action.uuid == OLD
    bad = _view((*base, rep(5, fetch_ago=1_600)))
    assert bad.has_live_majority(NOW, WINDOW)  # 5 of 6 fetched within the window
    assert book.next_action(bad, NOW) is None
    assert book.blocked is not None and "unsafe: RemoveVoter would leave 2 live of 5 voters" in book.blocked


def test_add_voter_counts_neither_the_old_voter_nor_a_just_killed_one() -> None:
    """AddThenRemove, 3 voters, (3, old) silent since its replacement caught up (gone by
    guards.old_gone, yet inside the window): AddVoter makes 4 voters, needing 3 live. Live for a
    change: leader 1 and the new one; voter 2 was killed 2 s ago. Refused; allowed with 2 fetching."""
    old = rep(3, fetch_ago=1_200, caught_ago=1_200, u=OLD)  # stopped 1.2 s ago (replaced)
    rec = Recovery("r-1", 3, OLD, NEW, Phase.CAUGHT_UP, NOW - 60_000, caught_up_since_ms=NOW - 1_100)
    bad = _view((rep(1), rep(2, fetch_ago=2_000), old), (rep(3, u=NEW),))
    got = guard_add(bad, rec, POLICY, NOW, require_stable=True)
    assert isinstance(got, str) and "unsafe: AddVoter would leave 2 live of 4 voters" in got
    good = _view((rep(1), rep(2), old), (rep(3, u=NEW),))
    assert not isinstance(guard_add(good, rec, POLICY, NOW, require_stable=True), str)
