"""The damaged-log rules of the Kubernetes operator (damage.py), as pure functions: which pods
stopped on a damaged log, and when the rest of the quorum is healthy enough to take that disk for
lost."""

from __future__ import annotations

import time
from typing import Any

from kraftkeeper_operator.core.rotation import healthy_majority_without
from kraftkeeper_operator.core.view import QuorumView, Replica
from kraftkeeper_operator.k8s.damage import damaged_pods

LINE = "CORRUPT_LOG: /data/kraft/x/00000000000000000000.log: damaged batch at position 9 (offset 2)"


def _pod(name: str, message: str) -> dict[str, Any]:
    node = {"name": "node", "lastState": {"terminated": {"exitCode": 1, "message": message}}}
    return {"metadata": {"name": name, "uid": f"u-{name}"}, "status": {"containerStatuses": [node]}}


def test_damaged_pods_are_named_with_their_corrupt_log_line() -> None:
    pods = [
        _pod("q-0", f"kraftkeeper: preparing q-0\n{LINE}\n"),
        _pod("q-1", "INVALID_REQUEST: other"),
        _pod("other-2", LINE),
    ]
    assert damaged_pods(pods, "q") == {1: ("q-0", "u-q-0", LINE)}


def test_a_healthy_majority_without_the_damaged_replica() -> None:
    now = int(time.time() * 1000)

    def view(leader: int, *fresh: int) -> QuorumView:
        voters = tuple(
            Replica(i, f"u{i}", lag=0, last_fetch_ms=now if i in fresh else now - 60_000) for i in (1, 2, 3)
        )
        return QuorumView(leader, 5, 100, voters)

    assert healthy_majority_without(view(1, 2), 3, 100, now, 5000)  # leader 1 and follower 2
    assert not healthy_majority_without(view(1), 3, 100, now, 5000)  # 2 is silent too
    assert not healthy_majority_without(view(3, 1, 2), 3, 100, now, 5000)  # the damaged one leads?
    assert not healthy_majority_without(view(0, 1, 2), 3, 100, now, 5000)  # no leader
    assert not healthy_majority_without(None, 3, 100, now, 5000)
