"""meta.properties: format, load, the KIP-856 storage-UUID upgrade, and malformed files."""

from __future__ import annotations

import base64
import logging
import os
import uuid
from pathlib import Path

import pytest

from quorum import types
from quorum.properties import parse_properties
from quorum.storage.meta import (
    META_FILE,
    format_dir,
    load_meta,
    render_properties,
)
from quorum.types import ErrorCode, KraftError


def test_format_then_load_round_trips(tmp_path: Path) -> None:
    d = tmp_path / "data" / "node1"  # created, parents included
    meta = format_dir(d, "cluster-A", 1)
    assert str(uuid.UUID(meta.storage_uuid)) == meta.storage_uuid  # canonical form
    loaded = load_meta(d)
    assert loaded == meta
    assert loaded.replica_key.id == 1 and loaded.replica_key.uuid == meta.storage_uuid
    text = (d / META_FILE).read_text()
    assert "version=1" in text and "cluster.id=cluster-A" in text and "node.id=1" in text
    assert f"directory.id={meta.storage_uuid}" in text


def test_each_format_gets_a_new_uuid(tmp_path: Path) -> None:
    a = format_dir(tmp_path / "a", "c", 1)
    b = format_dir(tmp_path / "b", "c", 1)
    assert a.storage_uuid != b.storage_uuid


def test_refuses_formatted_dir_and_keeps_identity(tmp_path: Path) -> None:
    meta = format_dir(tmp_path, "c", 3)
    before = (tmp_path / META_FILE).read_bytes()
    with pytest.raises(KraftError) as e:
        format_dir(tmp_path, "c", 3)
    assert e.value.code is ErrorCode.ALREADY_FORMATTED
    assert (tmp_path / META_FILE).read_bytes() == before
    # --ignore-formatted keeps the existing identity, never a fresh UUID
    assert format_dir(tmp_path, "c", 3, ignore_formatted=True).storage_uuid == meta.storage_uuid
    with pytest.raises(KraftError) as e2:
        format_dir(tmp_path, "other", 3, ignore_formatted=True)
    assert e2.value.code is ErrorCode.ALREADY_FORMATTED and "other" in e2.value.message
    assert (tmp_path / META_FILE).read_bytes() == before


@pytest.mark.parametrize("cluster_id", ["", "has space", "x" * 129, "a/b", "é"])
def test_format_rejects_bad_cluster_id(tmp_path: Path, cluster_id: str) -> None:
    with pytest.raises(KraftError) as e:
        format_dir(tmp_path / "d", cluster_id, 1)
    assert e.value.code is ErrorCode.INVALID_REQUEST and "cluster id" in e.value.message
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("node_id", [-1, 2**31, True, "1"])
def test_format_rejects_bad_node_id(tmp_path: Path, node_id: object) -> None:
    with pytest.raises(KraftError) as e:
        format_dir(tmp_path / "d", "c", node_id)  # type: ignore[arg-type]
    assert e.value.code is ErrorCode.INVALID_REQUEST and "node id" in e.value.message


def test_format_refuses_a_file_path(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(KraftError) as e:
        format_dir(f, "c", 1)
    assert e.value.code is ErrorCode.INVALID_REQUEST
    assert f.read_text() == "x"


def test_load_unformatted_is_not_formatted(tmp_path: Path) -> None:
    for d in (tmp_path, tmp_path / "missing"):
        with pytest.raises(KraftError) as e:
            load_meta(d)
        assert e.value.code is ErrorCode.NOT_FORMATTED
        assert str(e.value).startswith("NOT_FORMATTED: ")


def test_missing_uuid_is_generated_and_file_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / META_FILE).write_text("#old\nversion=1\ncluster.id=c\nnode.id=7\nsome.other=keep me\n")
    with caplog.at_level(logging.WARNING, logger="quorum.storage.meta"):
        meta = load_meta(tmp_path)
    assert meta.node_id == 7 and meta.cluster_id == "c"
    uuid.UUID(meta.storage_uuid)
    assert "no storage UUID" in caplog.text
    text = (tmp_path / META_FILE).read_text()
    assert f"directory.id={meta.storage_uuid}" in text and "some.other=keep me" in text
    assert load_meta(tmp_path).storage_uuid == meta.storage_uuid  # stable from now on
    assert [p.name for p in tmp_path.iterdir()] == [META_FILE]  # no temp file left behind


def test_accepts_kip856_storage_id_key(tmp_path: Path) -> None:
    u = "0F2C1D7E-26D3-4C5A-9E43-1B7A9E0A1C11"
    (tmp_path / META_FILE).write_text(f"version=1\ncluster.id=c\nnode.id=2\nstorage.id={u}\n")
    assert load_meta(tmp_path).storage_uuid == u.lower()
    # both keys: accepted when they agree
    (tmp_path / META_FILE).write_text(
        f"version=1\ncluster.id=c\nnode.id=2\nstorage.id={u}\ndirectory.id={u.lower()}\n"
    )
    assert load_meta(tmp_path).storage_uuid == u.lower()


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ("cluster.id=c\nnode.id=1\n", "version"),
        ("version=2\ncluster.id=c\nnode.id=1\n", "version"),
        ("version=1\nnode.id=1\n", "cluster.id"),
        ("version=1\ncluster.id=bad id!\nnode.id=1\n", "cluster.id"),
        ("version=1\ncluster.id=c\n", "node.id"),
        ("version=1\ncluster.id=c\nnode.id=one\n", "node.id"),
        ("version=1\ncluster.id=c\nnode.id=-5\n", "node.id"),
        ("version=1\ncluster.id=c\nnode.id=1\ndirectory.id=not-a-uuid\n", "directory.id"),
        (
            "version=1\ncluster.id=c\nnode.id=1\ndirectory.id=0f2c1d7e-26d3-4c5a-9e43-1b7a9e0a1c11\n"
            "storage.id=1f2c1d7e-26d3-4c5a-9e43-1b7a9e0a1c11\n",
            "disagree",
        ),
    ],
)
def test_malformed_meta_names_the_field_and_is_left_alone(tmp_path: Path, content: str, field: str) -> None:
    path = tmp_path / META_FILE
    path.write_text(content)
    with pytest.raises(KraftError) as e:
        load_meta(tmp_path)
    assert e.value.code is ErrorCode.CORRUPT_LOG
    assert field in e.value.message and str(path) in e.value.message
    assert path.read_text() == content  # nothing rewritten


def test_binary_garbage_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / META_FILE).write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(KraftError) as e:
        load_meta(tmp_path)
    assert e.value.code is ErrorCode.CORRUPT_LOG and "UTF-8" in e.value.message


def test_rendered_properties_read_back() -> None:
    props = {"version": "1", "weird key": "a=b", "multi": "l1\nl2"}
    assert parse_properties(render_properties(props).decode()) == props


def test_meta_file_is_the_nodes_alone(tmp_path: Path) -> None:
    format_dir(tmp_path / "d", "c", 1)
    assert os.stat(tmp_path / "d" / META_FILE).st_mode & 0o777 == 0o600
    assert os.stat(tmp_path / "d").st_mode & 0o777 == 0o700


def test_a_storage_uuid_never_reads_as_an_option_in_kafka_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka's tools take ``--controller-directory-id -Gk6...`` for an option: an id whose base64url
    text starts with '-' is drawn again, as Kafka's own generator does."""
    dash = uuid.UUID(bytes=b"\xf8" + bytes(15))  # top six bits 62: '-'
    plain = uuid.UUID(bytes=b"\x10" + bytes(15))
    assert base64.urlsafe_b64encode(dash.bytes).decode().startswith("-")
    draws = iter([dash, dash, plain])
    monkeypatch.setattr(types._uuid, "uuid4", lambda: next(draws))
    assert types.new_storage_uuid() == str(plain)
