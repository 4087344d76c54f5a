"""ensure_local_pki: one call makes a local cluster's CA, node and admin certificates and the
admin client.json; a second call keeps them; expiring ones are re-issued; another cluster's
directory is refused."""

from __future__ import annotations

import datetime as dt
import json
import stat
from pathlib import Path

import pytest

from quorum.security.clientconfig import load_client_config
from quorum.security.pki import load_ca
from quorum.security.provision import ensure_local_pki, expires_within
from quorum.types import ErrorCode, KraftError


def test_first_call_issues_everything_second_keeps_it(tmp_path: Path) -> None:
    first = ensure_local_pki(tmp_path / "tls", "c1", [1, 2, 3], tmp_path / "client.json")
    assert set(first.issued) == {"ca.crt", "node-1.crt", "node-2.crt", "node-3.crt", "admin.crt"}
    assert first.node_args() == ["--tls-dir", str(tmp_path / "tls")]
    cfg = load_client_config(tmp_path / "client.json")
    assert cfg.ca_file == tmp_path / "tls" / "ca.crt" and cfg.cert_file == tmp_path / "tls" / "admin.crt"
    assert json.loads((tmp_path / "client.json").read_text())["ca_file"] == "tls/ca.crt"  # relative
    assert stat.S_IMODE((tmp_path / "client.json").stat().st_mode) == 0o600
    before = (tmp_path / "tls" / "node-2.crt").read_bytes()
    again = ensure_local_pki(tmp_path / "tls", "c1", [1, 2, 3, 4], tmp_path / "client.json")
    assert again.issued == ("node-4.crt",)
    assert (tmp_path / "tls" / "node-2.crt").read_bytes() == before
    assert load_ca(tmp_path / "tls").cluster_id == "c1"


def test_expiring_certificates_are_reissued(tmp_path: Path) -> None:
    ensure_local_pki(tmp_path, "c1", [1], tmp_path / "client.json")
    assert not expires_within(tmp_path / "node-1.crt", dt.timedelta(days=30))
    assert expires_within(tmp_path / "node-1.crt", dt.timedelta(days=400))
    renewed = ensure_local_pki(
        tmp_path, "c1", [1], tmp_path / "client.json", renew_within=dt.timedelta(days=400)
    )
    assert set(renewed.issued) == {"node-1.crt", "admin.crt"}
    assert expires_within(tmp_path / "missing.crt", dt.timedelta(0))


def test_another_clusters_directory_is_refused(tmp_path: Path) -> None:
    ensure_local_pki(tmp_path, "c1", [1], tmp_path / "client.json")
    with pytest.raises(KraftError) as e:
        ensure_local_pki(tmp_path, "c2", [1], tmp_path / "client.json")
    assert e.value.code is ErrorCode.INCONSISTENT_CLUSTER_ID and "c1" in e.value.message
