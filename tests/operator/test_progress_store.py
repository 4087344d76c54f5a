"""The progress store port (core/progress.py) in a file and in memory: a round trip keeps records,
voter set, listeners and cluster name; the layouts written before the port still load; a damaged
store is refused naming it, by the stores and by the two commands that keep one
(``operator local``, ``operator watch``); a file write is all-or-nothing, also when the writing
process is killed mid-write. (The status store is tested against a real kube-apiserver in
tests/k8s/test_kafka_daemon_steps.py.) Pure and in-process: well under a few seconds."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kraftkeeper_operator.core.progress import Known, Progress, ProgressDamaged, ProgressStore
from kraftkeeper_operator.core.records import Phase, Recovery
from kraftkeeper_operator.kafka.watch import watch_main
from kraftkeeper_operator.local.operator import STATE_FILE, local_main
from kraftkeeper_operator.progressfile import FileProgressStore
from kraftkeeper_operator.testing.memory import MemoryProgressStore

from testkit.polling import wait_until

KNOWN = Known(
    voters=[(1, "uuid-a"), (2, "uuid-b")],
    listeners={2: [("CONTROLLER", "10.0.0.2", 9093)], 1: [("CONTROLLER", "10.0.0.1", 9093)]},
    cluster="c1",
)


def _records(n: int = 2) -> list[Recovery]:
    out = []
    for i in range(n):
        r = Recovery(f"r{i}", 3, f"old-{i}", f"new-{i}", Phase.REMOVED, 1_000 + i)
        r.remove_committed_ms = 2_000 + i
        out.append(r)
    return out


def _stores(tmp_path: Path) -> list[ProgressStore]:
    return [FileProgressStore(tmp_path / "state.json", lambda: KNOWN), MemoryProgressStore(lambda: KNOWN)]


def test_round_trip(tmp_path: Path) -> None:
    for store in _stores(tmp_path):
        assert asyncio.run(store.load()) == Progress()  # never saved: nothing
        recs = _records()
        asyncio.run(store.save([r.to_dict() for r in recs]))
        got = asyncio.run(store.load())
        assert got.records == recs, type(store).__name__
        assert got.known == KNOWN, type(store).__name__


def test_the_file_is_the_owners_alone(tmp_path: Path) -> None:
    store = FileProgressStore(tmp_path / "state.json")
    store.write([r.to_dict() for r in _records()])
    assert os.stat(store.path).st_mode & 0o777 == 0o600  # the records name storage UUIDs


def test_layouts_written_before_the_port_load(tmp_path: Path) -> None:
    recs = _records()
    old_local = tmp_path / "local.json"  # local mode: a bare list, later recoveries + voters
    old_local.write_text(json.dumps([r.to_dict() for r in recs]))
    assert FileProgressStore(old_local).read().records == recs
    old_watch = tmp_path / "watch.json"  # the Kafka watcher: cluster, records, listeners
    old_watch.write_text(
        json.dumps(
            {"cluster": "c1", "records": [r.to_dict() for r in recs], "listeners": {"1": [["C", "h", 1]]}}
        )
    )
    got = FileProgressStore(old_watch).read()
    assert got.records == recs and got.known.cluster == "c1" and got.known.listeners == {1: [("C", "h", 1)]}


DAMAGED = [
    "{not json",
    '"a string"',
    '{"recoveries": [{"recoveryId": "r"}]}',  # a record without its fields
    '{"recoveries": [], "voters": [[1]]}',
    '{"recoveries": [], "listeners": {"x": []}}',
]


@pytest.mark.parametrize("text", DAMAGED)
def test_a_damaged_store_is_refused_naming_it(tmp_path: Path, text: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(text)
    with pytest.raises(ProgressDamaged, match=f"{path} is damaged .*fix or move it by hand"):
        FileProgressStore(path).read()
    with pytest.raises(ProgressDamaged, match="the in-memory store is damaged"):
        asyncio.run(MemoryProgressStore(text=text).load())
    assert path.read_text() == text  # refused, not overwritten


def test_local_mode_refuses_a_damaged_state_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "c"
    d.mkdir()
    (d / STATE_FILE).write_text("{damaged")
    rc = local_main(["--dir", str(d), "--base-port", "0", "--insecure"])
    err = capsys.readouterr().err
    assert rc == 2 and f"INVALID_REQUEST: {d / STATE_FILE} is damaged" in err, err
    assert not (d / "control" / "supervisor.pid").exists()  # nothing started, the claim released
    assert (d / STATE_FILE).read_text() == "{damaged"


def test_watch_refuses_a_damaged_state_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = tmp_path / "events"
    events.mkdir()
    (events / "_watch-state.json").write_text('{"records": 3}')
    rc = watch_main(["--kafka-bootstrap-controllers", "127.0.0.1:9", "--events", str(events)])
    err = capsys.readouterr().err
    assert rc == 2 and f"INVALID_REQUEST: {events / '_watch-state.json'} is damaged" in err, err


def test_a_failed_write_leaves_the_old_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileProgressStore(tmp_path / "state.json", lambda: KNOWN)
    first = _records(1)
    store.write([r.to_dict() for r in first])

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError, match="No space"):
        store.write([r.to_dict() for r in _records(3)])
    monkeypatch.undo()
    assert store.read().records == first
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left behind


WRITER = """
import sys
from pathlib import Path
from kraftkeeper_operator.core.records import Phase, Recovery
from kraftkeeper_operator.progressfile import FileProgressStore

store = FileProgressStore(Path(sys.argv[1]))
n = 0
while True:
    n += 1
    one = Recovery("r", 3, "o" * 500, "n" * 500, Phase.REMOVED, n).to_dict()
    recs = [{**one, "recoveryId": f"r{i}"} for i in range(n % 200 + 1)]
    store.write(recs)
    if n == 20:
        Path(sys.argv[1] + ".ready").touch()
"""


@pytest.mark.slow  # starts a writer process
def test_a_writer_killed_mid_write_leaves_a_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    ready = Path(str(path) + ".ready")
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)])
    try:
        wait_until("the writer saved 20 times", ready.exists, 30)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    got = FileProgressStore(path).read()  # whole: old or new, never a mix
    assert 1 <= len(got.records) <= 200
    assert all(r.old_uuid == "o" * 500 for r in got.records)
