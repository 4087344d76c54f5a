"""The safety guards of a voter change, and when they can next change their answer: pure
functions of the leader's view, one recovery's record, the policy and the time (recovery.py's
:class:`~.recovery.RecoveryBook` calls them before every step).

* :func:`guard_add` / :func:`guard_remove`: the one voter change that is safe now for a recovery,
  or the reason it is not (the new replica not caught up or not stable yet, the old one still
  running, too few live voters for the resulting set: consul#4017, ZooKeeper operator #575);
* :func:`old_gone`: the old (id, UUID) no longer runs;
* :func:`wake_at_ms`: the next instant one of these answers can change with nothing new observed,
  so the controller looks again right then (no idle waits).
"""

from __future__ import annotations

from collections.abc import Iterable

from .policy import RecoveryPolicy
from .records import Action, ActionKind, Phase, Recovery
from .view import QuorumView, Replica, majority

# Silence of an old (id, UUID) that, while its replacement fetches, means the old process is gone
# (old_gone): twice the engine's default fetch_max_wait_ms (500 ms), within which a live follower
# sends its next Fetch.
SUPERSEDED_SILENCE_MS = 1_000


def _window_ms(policy: RecoveryPolicy) -> int:
    return int(policy.live_window_seconds * 1000)


def caught_up(view: QuorumView, r: Replica | None, policy: RecoveryPolicy, now_ms: int) -> bool:
    """Lag within ``maxLag`` and a recent fetch."""
    if r is None:
        return False
    return 0 <= r.lag <= policy.max_lag and view.is_live(r, now_ms, _window_ms(policy))


def old_gone(view: QuorumView, rec: Recovery, old: Replica, policy: RecoveryPolicy, now_ms: int) -> bool:
    """The old (id, UUID) of a recovery no longer runs. Either it has not fetched within the live
    window, or it has been silent since its replacement became caught up, for at least
    :data:`SUPERSEDED_SILENCE_MS` (a live follower fetches at least every ``fetch_max_wait_ms``, so
    that much silence while another process of the same id fetches means the old one is gone).
    The second rule lets AddVoter start at the stabilisation deadline instead of a live window
    later; a live old process keeps fetching, so it keeps blocking (two processes, one id)."""
    window = _window_ms(policy)
    if not view.is_live(old, now_ms, window):
        return True
    if old.id == view.leader_id and old.uuid == view.leader_uuid():
        return False
    since = rec.caught_up_since_ms
    silence = min(window, SUPERSEDED_SILENCE_MS)
    return since is not None and 0 <= old.last_fetch_ms < since and now_ms - old.last_fetch_ms >= silence


def _old_voter(view: QuorumView, rec: Recovery) -> Replica | None:
    return next((v for v in view.voters if v.id == rec.replica_id and v.uuid == rec.old_uuid), None)


def guard_add(
    view: QuorumView, rec: Recovery, policy: RecoveryPolicy, now_ms: int, *, require_stable: bool
) -> Action | str:
    """AddVoter(id, new) if it is safe now, else why not."""
    new = next((o for o in view.observers if o.id == rec.replica_id and o.uuid == rec.new_uuid), None)
    if not caught_up(view, new, policy, now_ms):
        return f"replica ({rec.replica_id}, {rec.new_uuid}) is not caught up"
    if require_stable and rec.phase is not Phase.CAUGHT_UP and rec.phase is not Phase.ADDING:
        return f"replica {rec.replica_id} still stabilising"
    old = _old_voter(view, rec)
    if old is not None and not old_gone(view, rec, old, policy, now_ms):
        return f"old voter ({rec.replica_id}, {rec.old_uuid}) is still live: two processes share id"
    # The majority of the new set must be live by the sharper rule (view.live_for_change), the
    # old voter not counted (it is gone, or not a voter at all), the new one counted (caught up).
    old_key = (rec.replica_id, rec.old_uuid)
    live = len(view.change_live_voters(now_ms, _window_ms(policy), exclude=old_key)) + 1
    n = len(view.voters) + 1
    if live < majority(n):
        return f"unsafe: AddVoter would leave {live} live of {n} voters"
    return Action(ActionKind.ADD_VOTER, rec.replica_id, rec.new_uuid, rec.recovery_id)


def guard_remove(view: QuorumView, rec: Recovery, policy: RecoveryPolicy, now_ms: int) -> Action | str | None:
    """RemoveVoter(id, old) if it is safe now, else why not; None if the old one is no voter."""
    old = _old_voter(view, rec)
    if old is None:
        return None
    if not old_gone(view, rec, old, policy, now_ms):
        return f"old voter ({rec.replica_id}, {rec.old_uuid}) is still live: not removing it"
    # Counted over the voters that remain, by the sharper rule (view.live_for_change).
    live = len(view.change_live_voters(now_ms, _window_ms(policy), exclude=(old.id, old.uuid)))
    n = len(view.voters) - 1
    if n < 1 or live < majority(n):
        return f"unsafe: RemoveVoter would leave {live} live of {n} voters"
    return Action(ActionKind.REMOVE_VOTER, rec.replica_id, rec.old_uuid, rec.recovery_id)


def wake_at_ms(
    active: Iterable[Recovery], view: QuorumView | None, policy: RecoveryPolicy, now_ms: int
) -> int | None:
    """The earliest future instant at which a decision about the ``active`` recoveries can change
    with nothing new observed: a stabilisation deadline, the moment an old voter counts as gone,
    the end of a retry back-off, a recovery timeout. None if there is none."""
    if view is None:
        return None
    window = _window_ms(policy)
    stab_ms = int(policy.stabilization_seconds * 1000)
    silence = min(window, SUPERSEDED_SILENCE_MS)
    times: list[int] = []
    for rec in active:
        if rec.retry_at_ms is not None:
            times.append(rec.retry_at_ms)
        if rec.phase in (Phase.STABILIZING, Phase.CAUGHT_UP):
            times.append(rec.detected_ms + int(policy.timeout_seconds * 1000) + 1)
            if rec.caught_up_since_ms is not None:
                times.append(rec.caught_up_since_ms + stab_ms)
        old = _old_voter(view, rec)
        if old is not None and old.last_fetch_ms >= 0:
            times += [old.last_fetch_ms + silence, old.last_fetch_ms + window + 1]
    future = [t for t in times if t > now_ms]
    return min(future) if future else None
