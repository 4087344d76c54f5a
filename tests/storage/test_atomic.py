"""atomic_write: the target holds the old or the new bytes, never a mix, no temp files left."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorum.storage.atomic import atomic_write, ensure_dir, fsync_dir


def test_creates_and_replaces(tmp_path: Path) -> None:
    p = tmp_path / "f"
    atomic_write(p, b"one")
    assert p.read_bytes() == b"one"
    atomic_write(p, b"two" * 100_000)
    assert p.read_bytes() == b"two" * 100_000
    atomic_write(p, b"")
    assert p.read_bytes() == b""
    assert [x.name for x in tmp_path.iterdir()] == ["f"]


def test_failed_write_keeps_old_content_and_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "f"
    atomic_write(p, b"committed")
    with pytest.raises(TypeError):
        atomic_write(p, "not bytes")  # type: ignore[arg-type]
    assert p.read_bytes() == b"committed"
    assert [x.name for x in tmp_path.iterdir()] == ["f"]


def test_missing_directory_is_an_error_not_a_partial_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "nope" / "f", b"x")
    assert list(tmp_path.iterdir()) == []


def test_fsync_dir_works_and_rejects_files(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        fsync_dir(tmp_path / "f")


def test_ensure_dir_creates_nested(tmp_path: Path) -> None:
    ensure_dir(tmp_path / "a" / "b" / "c")
    assert (tmp_path / "a" / "b" / "c").is_dir()
    ensure_dir(tmp_path / "a")  # existing: fine
    (tmp_path / "f").write_text("x")
    with pytest.raises(OSError):
        ensure_dir(tmp_path / "f" / "sub")
