"""The one cluster-id rule (quorum.types) holds wherever a cluster id enters: ``format``,
meta.properties read back, a request between nodes, the CA's subject."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorum.runtime.wire import _cluster
from quorum.security.pki import init_ca
from quorum.storage.meta import decode_meta, format_dir
from quorum.types import ErrorCode, KraftError, is_cluster_id, validate_cluster_id

GOOD = ["a", "cluster-A", "x.y_z-1", "MkU3OEVBNTcwNTJENDM2Qk", "a" * 128]
BAD = ["", "a" * 129, "has space", "slash/no", "new\nline", "trailing\n", "é", "a:b"]


@pytest.mark.parametrize("cid", GOOD)
def test_a_valid_id_passes_everywhere(cid: str, tmp_path: Path) -> None:
    assert is_cluster_id(cid) and validate_cluster_id(cid) == cid
    assert format_dir(tmp_path / "d", cid, 1, fsync=False).cluster_id == cid
    assert decode_meta(f"version=1\ncluster.id={cid}\nnode.id=1\n".encode(), "m")[0] == cid
    assert _cluster({"cluster_id": cid}, "cluster_id", "Vote") == cid


@pytest.mark.parametrize("cid", BAD)
def test_an_invalid_id_is_refused_everywhere(cid: str, tmp_path: Path) -> None:
    assert not is_cluster_id(cid)
    for entry in (
        lambda: validate_cluster_id(cid),
        lambda: format_dir(tmp_path / "d", cid, 1, fsync=False),
        lambda: init_ca(tmp_path / "ca", cid),
    ):
        with pytest.raises(KraftError, match="invalid cluster id") as e:
            entry()
        assert e.value.code is ErrorCode.INVALID_REQUEST
    assert not (tmp_path / "d").exists() and not (tmp_path / "ca").exists()  # nothing written
    if not is_cluster_id(cid.strip()):  # meta.properties values are read stripped, as Kafka reads them
        escaped = cid.replace("\n", "\\n")
        with pytest.raises(KraftError, match=r"cluster\.id") as e:
            decode_meta(f"version=1\ncluster.id={escaped}\nnode.id=1\n".encode(), "m")
        assert e.value.code is ErrorCode.CORRUPT_LOG
    with pytest.raises(KraftError, match="cluster_id") as e:
        _cluster({"cluster_id": cid}, "cluster_id", "Vote")
    assert e.value.code is ErrorCode.INVALID_REQUEST


def test_a_non_string_is_not_an_id() -> None:
    assert not is_cluster_id(None) and not is_cluster_id(7)
