"""The one unclean-recovery survivor rule (kraftkeeper_operator/core/survivor.py): Raft's election
order over (last epoch, end offset), the log-state answer's validation, and the probe that asks
a node for it. The process-level tests (local mode and against a kube-apiserver) are in
test_local.py and tests/k8s/test_operator_unclean.py."""

from __future__ import annotations

import json

import pytest
from kraftkeeper_operator.core.survivor import (
    LOG_STATE_PATH,
    LogState,
    LogStateError,
    choose_survivor,
    parse_log_state,
    probe_log_state,
)


def test_higher_last_epoch_wins_over_a_longer_stale_log() -> None:
    # Replica 1 led epoch 4 and appended 500 records nobody else has (never committed); replica 2
    # followed the epoch-5 leader, which committed a few records: a Raft election picks 2.
    stale, fresh = LogState(1, 4, 1_500), LogState(2, 5, 1_010)
    assert choose_survivor([stale, fresh]) == fresh
    assert choose_survivor([fresh, stale]) == fresh  # order of the candidates does not matter


def test_same_last_epoch_the_longer_log_wins() -> None:
    a, b = LogState(3, 7, 90), LogState(1, 7, 120)
    assert choose_survivor([a, b]) == b


def test_full_tie_takes_the_lower_id_and_nothing_gives_none() -> None:
    a, b, c = LogState(3, 7, 90), LogState(2, 7, 90), LogState(4, 7, 90)
    assert choose_survivor([a, b, c]) == b
    assert choose_survivor([]) is None
    assert choose_survivor([LogState(5, 0, 0)]) == LogState(5, 0, 0)  # an empty log still is one


def test_log_state_answer_is_parsed_and_bad_ones_name_the_field() -> None:
    ok = {"node_id": 2, "last_epoch": 5, "end_offset": 10, "high_watermark": 8, "role": "follower"}
    assert parse_log_state(ok) == LogState(2, 5, 10, 8)
    assert parse_log_state({"node_id": 2, "last_epoch": 0, "end_offset": 0}).high_watermark == -1
    for bad, field in (
        ({"last_epoch": 5, "end_offset": 10}, "node_id"),
        ({"node_id": 2, "last_epoch": "5", "end_offset": 10}, "last_epoch"),
        ({"node_id": 2, "last_epoch": 5, "end_offset": True}, "end_offset"),
    ):
        with pytest.raises(LogStateError, match=field):
            parse_log_state(bad)
    with pytest.raises(LogStateError, match="negative"):
        parse_log_state({"node_id": 2, "last_epoch": 5, "end_offset": -1})
    with pytest.raises(LogStateError, match="object"):
        parse_log_state([1, 2])  # type: ignore[arg-type]


class FakeNodes:
    """Answers ``node_get`` like nodes would: per endpoint a (status, body) or an exception."""

    def __init__(self, answers: dict[str, tuple[int, bytes] | Exception]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, str]] = []

    async def node_get(self, endpoint: str, path: str) -> tuple[int, bytes]:
        self.asked.append((endpoint, path))
        a = self.answers[endpoint]
        if isinstance(a, Exception):
            raise a
        return a


async def test_probe_reports_the_state_or_why_there_is_none() -> None:
    good = json.dumps({"node_id": 1, "last_epoch": 3, "end_offset": 40}).encode()
    nodes = FakeNodes(
        {
            "a:1": (200, good),
            "b:2": (503, b"starting"),
            "c:3": ConnectionRefusedError("refused"),
            "d:4": (200, b"{not json"),
            "e:5": (200, b'{"node_id": 5}'),
        }
    )
    p = await probe_log_state(nodes, 0, "a:1")
    assert p.state == LogState(1, 3, 40) and p.error is None and p.node_id == 1
    assert nodes.asked == [("a:1", LOG_STATE_PATH)]
    p = await probe_log_state(nodes, 1, "b:2")
    assert p.state is None and p.error is not None and "503" in p.error
    p = await probe_log_state(nodes, 2, "c:3")
    assert p.state is None and p.error is not None and "refused" in p.error
    p = await probe_log_state(nodes, 3, "d:4")
    assert p.state is None and p.error is not None and "JSON" in p.error
    p = await probe_log_state(nodes, 4, "e:5")
    assert p.state is None and p.error is not None and "last_epoch" in p.error
