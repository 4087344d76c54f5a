"""A local cluster's directory (cluster.json, node directories, the bootstrap flag) and
`kraftkeeper cluster replace-disk` without a supervisor: refusals of bad directories and nodes,
and the formats replace-disk and the first start make."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from kraftkeeper_operator.local.cluster import ClusterLayout
from kraftkeeper_operator.local.operator import local_main, replace_disk_main

from quorum.storage.meta import load_meta


def test_replace_disk_refuses_a_directory_that_is_not_a_local_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "keep.txt").write_text("precious")
    assert replace_disk_main(["--dir", str(tmp_path), "--node", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("INVALID_REQUEST:") and "cluster.json" in err
    assert (tmp_path / "keep.txt").read_text() == "precious"  # nothing touched


def test_replace_disk_refuses_an_unknown_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ClusterLayout.load_or_create(tmp_path, 3, 20000)
    assert replace_disk_main(["--dir", str(tmp_path), "--node", "4"]) == 2
    assert "--node 4" in capsys.readouterr().err
    assert not (tmp_path / "control" / "node-4.hold").exists()


@pytest.mark.slow  # starts processes
def test_replace_disk_without_supervisor_gives_a_new_storage_uuid_formatted_as_a_replacement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = ClusterLayout.load_or_create(tmp_path, 3, 20000)
    layout.bootstrap()
    first = load_meta(layout.data_dir(2)).storage_uuid
    # The first formatting of a new cluster is the initial one: bootstrap voters.
    assert all(load_meta(layout.data_dir(i)).initial_bootstrap for i in (1, 2, 3))
    (layout.data_dir(2) / "junk").write_text("old log")
    assert replace_disk_main(["--dir", str(tmp_path), "--node", "2"]) == 0
    new = capsys.readouterr().out.strip().splitlines()[-1]
    assert new != first and len(new) == 36
    assert not (layout.data_dir(2) / "junk").exists()
    meta = load_meta(layout.data_dir(2))
    assert meta.storage_uuid == new and meta.node_id == 2 and meta.cluster_id == layout.cluster_id
    # A replacement disk never counts itself a uuid-less bootstrap voter (format
    # --no-initial-controllers): two empty replaced disks must not be able to elect each other.
    assert meta.initial_bootstrap is False
    assert "bootstrap.initial=false" in (layout.data_dir(2) / "meta.properties").read_text()
    assert load_meta(layout.data_dir(1)).initial_bootstrap  # the others are untouched
    assert not layout.hold_file(2).exists()


def test_replace_disk_refuses_a_cluster_that_never_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ClusterLayout.load_or_create(tmp_path, 3, 20000)
    assert replace_disk_main(["--dir", str(tmp_path), "--node", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("INVALID_REQUEST:") and "never been started" in err
    assert not (tmp_path / "node-2").exists() and not (tmp_path / "control" / "node-2.hold").exists()


@pytest.mark.slow  # starts processes
def test_bootstrap_is_recorded_and_later_formats_are_replacements(tmp_path: Path) -> None:
    layout = ClusterLayout.load_or_create(tmp_path, 3, 20000)
    assert json.loads((tmp_path / "cluster.json").read_text())["bootstrapped"] is False
    assert not ClusterLayout.load(tmp_path).bootstrapped
    layout.bootstrap()
    # What a restarted supervisor reads back.
    again = ClusterLayout.load(tmp_path)
    assert again.bootstrapped and json.loads((tmp_path / "cluster.json").read_text())["bootstrapped"] is True
    uuids = {i: load_meta(again.data_dir(i)).storage_uuid for i in (1, 2, 3)}
    again.bootstrap()  # a no-op now: nothing re-formatted
    assert {i: load_meta(again.data_dir(i)).storage_uuid for i in (1, 2, 3)} == uuids
    # A directory wiped by hand is formatted by the supervisor as a replacement disk.
    shutil.rmtree(again.data_dir(3))
    new = again.ensure_formatted(3)
    assert new is not None and new != uuids[3]
    assert load_meta(again.data_dir(3)).initial_bootstrap is False
    assert again.ensure_formatted(1) is None
    with pytest.raises(ValueError, match="bootstrapped already"):
        again.format(3, initial=True)


@pytest.mark.slow  # starts processes
def test_cluster_json_without_the_flag_counts_as_bootstrapped_once_formatted(tmp_path: Path) -> None:
    layout = ClusterLayout.load_or_create(tmp_path, 3, 20000)
    legacy = {"cluster_id": layout.cluster_id, "nodes": 3, "base_port": 20000}
    (tmp_path / "cluster.json").write_text(json.dumps(legacy))
    assert not ClusterLayout.load(tmp_path).bootstrapped  # nothing formatted: a new cluster
    layout.format(1, initial=True)
    assert ClusterLayout.load(tmp_path).bootstrapped  # nodes may have run: no more initial formats


def test_damaged_cluster_json_is_reported_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cluster.json").write_text('{"nodes": 3}')
    assert replace_disk_main(["--dir", str(tmp_path), "--node", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("INVALID_REQUEST:") and "cluster.json is damaged" in err
    assert local_main(["--dir", str(tmp_path)]) == 2
    assert "cluster.json is damaged" in capsys.readouterr().err
    assert (tmp_path / "cluster.json").read_text() == '{"nodes": 3}'


@pytest.mark.slow  # starts processes
def test_replace_disk_refuses_while_held_and_gives_up_on_a_supervisor_that_never_stops_the_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = ClusterLayout.load_or_create(tmp_path, 3, 20000)
    layout.bootstrap()
    uuid = load_meta(layout.data_dir(1)).storage_uuid
    layout.hold_file(1).write_text(f"{os.getpid()}\n")
    assert replace_disk_main(["--dir", str(tmp_path), "--node", "1"]) == 2
    assert "already being replaced" in capsys.readouterr().err
    assert uuid in (layout.data_dir(1) / "meta.properties").read_text()
    layout.hold_file(1).unlink()
    # A live process that is no supervisor (this test's own) never writes the stopped file.
    (layout.control() / "supervisor.pid").write_text(f"{os.getpid()}\n")
    assert replace_disk_main(["--dir", str(tmp_path), "--node", "1", "--timeout", "0.2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("UNAVAILABLE: timed out after 0.2 s waiting for the supervisor"), err
    assert "to stop node 1 (last: False)" in err
    # Nothing replaced, and the node is free for the next attempt.
    assert load_meta(layout.data_dir(1)).storage_uuid == uuid and not layout.hold_file(1).exists()
