"""The quorum-state file (KIP-856 QuorumStateData) and its in-memory twin."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorum.storage.memory import MemoryQuorumStateStore
from quorum.storage.quorum_state import QUORUM_STATE_FILE, QuorumStateStore
from quorum.types import ErrorCode, KraftError, QuorumState

VOTED = "00000000-0000-4000-8000-000000000002"


@pytest.fixture(params=["file", "memory"])
def store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[QuorumStateStore | MemoryQuorumStateStore]:
    yield QuorumStateStore(tmp_path, "c1") if request.param == "file" else MemoryQuorumStateStore("c1")


def test_default_then_round_trip(store: QuorumStateStore | MemoryQuorumStateStore) -> None:
    assert store.load() == QuorumState(cluster_id="c1")
    s = QuorumState("c1", leader_id=2, leader_epoch=7, voted_id=2, voted_uuid=VOTED, applied_offset=99)
    store.save(s)
    assert store.load() == s
    store.save(QuorumState("c1", leader_epoch=8))
    assert store.load() == QuorumState("c1", leader_epoch=8)


@pytest.mark.parametrize(
    "bad",
    [
        QuorumState("c1", leader_epoch=-2),
        QuorumState("c1", voted_id=2**31),
        QuorumState("c1", voted_uuid="nope"),
        QuorumState("c1", applied_offset=-1),
        QuorumState("c1", leader_id="1"),  # type: ignore[arg-type]
    ],
)
def test_invalid_state_is_refused_and_old_kept(
    store: QuorumStateStore | MemoryQuorumStateStore, bad: QuorumState
) -> None:
    good = QuorumState("c1", leader_epoch=3)
    store.save(good)
    with pytest.raises(KraftError) as e:
        store.save(bad)
    assert e.value.code is ErrorCode.INVALID_REQUEST
    assert store.load() == good


def test_foreign_cluster_is_refused(store: QuorumStateStore | MemoryQuorumStateStore) -> None:
    with pytest.raises(KraftError) as e:
        store.save(QuorumState("other"))
    assert e.value.code is ErrorCode.INCONSISTENT_CLUSTER_ID


def test_file_format(tmp_path: Path) -> None:
    QuorumStateStore(tmp_path, "c1").save(QuorumState("c1", 1, 5, 1, VOTED.upper(), 10))
    d = json.loads((tmp_path / QUORUM_STATE_FILE).read_text())
    assert d == {
        "cluster_id": "c1",
        "leader_id": 1,
        "leader_epoch": 5,
        "voted_id": 1,
        "voted_uuid": VOTED.upper(),
        "applied_offset": 10,
        "data_version": 1,
    }
    assert QuorumStateStore(tmp_path, "c1").load().voted_uuid == VOTED  # canonical on load
    with pytest.raises(KraftError) as e:
        QuorumStateStore(tmp_path, "c2").load()
    assert e.value.code is ErrorCode.INCONSISTENT_CLUSTER_ID


@pytest.mark.parametrize(
    ("content", "word"),
    [
        (b"", "JSON"),
        (b'{"cluster_id": "c1", "leader_epo', "JSON"),
        (b"[1, 2]", "object"),
        (b"\xff\xfe", "JSON"),
        (b'{"leader_epoch": 1, "applied_offset": 0}', "cluster_id"),
        (b'{"cluster_id": "c1"}', "applied_offset"),
        (b'{"cluster_id": "c1", "applied_offset": 0, "leader_epoch": "x"}', "leader_epoch"),
        (b'{"cluster_id": "c1", "applied_offset": 0, "voted_uuid": 5}', "voted_uuid"),
        (b'{"cluster_id": "c1", "applied_offset": 0, "data_version": 9}', "data_version"),
    ],
)
def test_corrupt_file_names_the_file(tmp_path: Path, content: bytes, word: str) -> None:
    path = tmp_path / QUORUM_STATE_FILE
    path.write_bytes(content)
    with pytest.raises(KraftError) as e:
        QuorumStateStore(tmp_path, "c1").load()
    assert e.value.code is ErrorCode.CORRUPT_LOG
    assert str(path) in e.value.message and word in e.value.message
    assert path.read_bytes() == content


def test_kip595_version0_file_is_read(tmp_path: Path) -> None:
    (tmp_path / QUORUM_STATE_FILE).write_text('{"cluster_id": "c1", "leader_epoch": 4, "applied_offset": 0}')
    assert QuorumStateStore(tmp_path, "c1").load() == QuorumState("c1", leader_epoch=4)


def test_load_checks_the_callers_cluster(store: QuorumStateStore | MemoryQuorumStateStore) -> None:
    store.save(QuorumState("c1", leader_epoch=2))
    assert store.load("c1").leader_epoch == 2
    with pytest.raises(KraftError) as e:
        store.load("c2")
    assert e.value.code is ErrorCode.INCONSISTENT_CLUSTER_ID
