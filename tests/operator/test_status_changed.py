"""The operator writes a KRaftQuorum's status only when it changed, never for a timestamp alone."""

from __future__ import annotations

from typing import Any

from kraftkeeper_operator.core.status import status_changed


def cond(status: str, t: str) -> dict[str, Any]:
    return {"type": "Available", "status": status, "reason": "Quorum", "message": "ok",
            "lastTransitionTime": t}


def test_a_new_timestamp_alone_is_no_change() -> None:
    prev = {"phase": "Running", "leaderId": 1, "conditions": [cond("True", "t1")]}
    assert not status_changed(prev, {"phase": "Running", "leaderId": 1, "conditions": [cond("True", "t2")]})


def test_a_field_or_a_condition_change_is_a_change() -> None:
    prev = {"phase": "Running", "leaderId": 1, "conditions": [cond("True", "t1")]}
    assert status_changed(prev, {"phase": "Running", "leaderId": 2, "conditions": [cond("True", "t1")]})
    assert status_changed(prev, {"phase": "Running", "leaderId": 1, "conditions": [cond("False", "t1")]})
    assert status_changed({}, {"phase": "Running", "conditions": []})
