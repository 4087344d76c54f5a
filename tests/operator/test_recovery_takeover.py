"""A recovery starts only when the voter with that id went quiet before the observer (recovery.py,
the last invariant of its docstring; the takeover defect).

The views are the ones captured from real Kafka 4.4 controllers (tests/kafka/test_takeover.py and
the k8s Kafka test), directory ids as canonical UUIDs, timestamps on the leader's clock."""

from __future__ import annotations

import dataclasses
from typing import Any

from kraftkeeper_operator.core.recovery import Order, Phase, QuorumView, RecoveryBook, RecoveryPolicy

POLICY = RecoveryPolicy(stabilization_seconds=0, order=Order.REMOVE_THEN_ADD)  # window 5 s


def rep(i: int, uuid: str, leo: int, lag: int, fetch: int, caught: int) -> dict[str, Any]:
    return {
        "id": i,
        "uuid": uuid,
        "endpoint": None,
        "log_end_offset": leo,
        "lag": lag,
        "last_fetch_timestamp": fetch,
        "last_caught_up_timestamp": caught,
    }


def view(leader: int, hw: int, voters: list[dict[str, Any]], observers: list[dict[str, Any]]) -> QuorumView:
    return QuorumView.from_describe(
        {
            "leader_id": leader,
            "leader_epoch": 1,
            "high_watermark": hw,
            "voters": voters,
            "observers": observers,
        }
    )


# After a recovery of controller 1: voter 1 is the new, healed directory; Kafka's leader still lists
# the removed one as an observer (log end 3, lag 23), its last fetch 4.6 s ago: live by the 5 s
# window. A controller that did not run that recovery took it for a new disk of voter 1 and
# waited for it to catch up until timeoutSeconds.
HEALED_NOW = 1795472785837
HEALED_OLD = "3f188e39-dc7b-4d97-8c0c-e2915d2e299f"
HEALED = view(
    3,
    26,
    [
        rep(1, "f42443e4-4892-990b-7893-2858d1049153", 25, 1, 1795472785811, 1795472785783),
        rep(2, "2c51471e-461b-490a-b927-d366543f047c", 26, 0, 1795472785830, 1795472785830),
        rep(3, "dfbf0c95-8138-45b4-ab47-7a9cdea6f074", 26, 0, 1795472785837, 1795472785837),
    ],
    [rep(1, HEALED_OLD, 3, 23, 1795472781211, 1795472781196)],
)

# A real replacement of controller 1 (k8s Kafka test): the killed voter's last fetch is 4.4 s old,
# still live by the window, but older than the new disk's first fetch.
REPLACED_NOW = 1795472676485
REPLACED_OLD, REPLACED_NEW = "068e5dac-6276-4f77-9bc7-a86d1aa0ed98", "0890a9e6-54ee-94ba-599e-e883b7ee5748"
REPLACED = view(
    2,
    32,
    [
        rep(1, REPLACED_OLD, 23, 9, 1795472672097, 1795472671622),
        rep(2, "6eb4c58e-5f0c-46d4-b3fa-6ff5564c526d", 32, 0, 1795472676487, 1795472676487),
        rep(3, "be2d798b-ca84-4324-9dd6-1342fe96aa7c", 32, 0, 1795472676125, 1795472676125),
    ],
    [rep(1, REPLACED_NEW, 0, 32, 1795472676376, -1)],
)


def test_the_removed_directory_is_no_new_disk_for_a_controller_without_its_record() -> None:
    book = RecoveryBook(POLICY)  # a new owner: no completed record retires the old directory
    assert HEALED.is_live(HEALED.observers[0], HEALED_NOW, 5000)  # the window alone would take it
    assert book.observe(HEALED, HEALED_NOW) == []
    assert book.active() == [] and book.next_action(HEALED, HEALED_NOW) is None
    assert book.note is not None
    assert f"observer {HEALED_OLD} is no new disk" in book.note and "fetched after it" in book.note


def test_a_real_replacement_is_still_detected_while_the_old_voter_is_in_the_window() -> None:
    book = RecoveryBook(POLICY)
    assert REPLACED.is_live(REPLACED.voters[0], REPLACED_NOW, 5000)
    events = book.observe(REPLACED, REPLACED_NOW)
    assert [e.type for e in events][:1] == ["disk_replacement_detected"]
    (rec,) = book.active()
    assert (rec.replica_id, rec.old_uuid, rec.new_uuid) == (1, REPLACED_OLD, REPLACED_NEW)
    assert rec.phase in (Phase.STABILIZING, Phase.CAUGHT_UP)


def test_an_observer_of_the_leaders_id_is_never_a_replacement() -> None:
    # The same leftover, but controller 1 leads: whatever the timestamps say, it is running.
    voters = tuple(dataclasses.replace(v, last_fetch_ms=-1) if v.id == 1 else v for v in HEALED.voters)
    leader1 = dataclasses.replace(HEALED, leader_id=1, voters=voters)
    book = RecoveryBook(POLICY)
    assert book.observe(leader1, HEALED_NOW) == [] and book.active() == []
    assert book.note is not None and "leads, still live" in book.note


def test_a_voter_the_leader_never_heard_from_counts_as_quiet() -> None:
    # A new leader elected after the kill has no fetch from the old directory (-1): the new disk's
    # fetch is the later one, so the replacement is detected.
    voters = tuple(
        dataclasses.replace(v, last_fetch_ms=-1, last_caught_up_ms=-1) if v.id == 1 else v
        for v in REPLACED.voters
    )
    quiet = dataclasses.replace(REPLACED, voters=voters)
    book = RecoveryBook(POLICY)
    assert [e.type for e in book.observe(quiet, REPLACED_NOW)][:1] == ["disk_replacement_detected"]
