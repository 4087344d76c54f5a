"""CLI and configuration input checks that need no running node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quorum.core.config import MAX_FETCH_BYTES, CoreConfig
from quorum.runtime import wire
from quorum.runtime.config import load_config, parse_voters
from quorum.types import ErrorCode, KraftError
from tests.engine.cluster import run_cli


def test_parse_voters_ok() -> None:
    assert parse_voters("1@127.0.0.1:9091, 2@h:9092") == {1: "127.0.0.1:9091", 2: "h:9092"}


@pytest.mark.parametrize("text", ["", "1@h", "x@h:1", "1@h:0", "1@h:1,1@h:2", "1h:1", "1@:5"])
def test_parse_voters_rejects(text: str) -> None:
    with pytest.raises(KraftError) as e:
        parse_voters(text)
    assert e.value.code is ErrorCode.INVALID_REQUEST


def test_config_file(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"log": {"fsync": False}, "raft": {"election_timeout_ms": 300}}))
    cfg = load_config(str(p))
    assert cfg.fsync is False and cfg.raft["election_timeout_ms"] == 300
    t = tmp_path / "c.toml"
    t.write_text("[snapshot]\nmax_bytes = 1000\n")
    assert load_config(str(t)).snapshot_bytes == 1000


@pytest.mark.parametrize(
    "body,needle",
    [
        ('{"log": {"fsink": true}}', "log.fsink"),
        ('{"raft": {"election_timeout_ms": -5}}', "election_timeout_ms"),
        ('{"log": {"fsync": "yes"}}', "log.fsync"),
        ("[1]", "top level"),
        ("{nope", "does not parse"),
    ],
)
def test_config_file_errors_name_the_problem(tmp_path: Path, body: str, needle: str) -> None:
    p = tmp_path / "c.json"
    p.write_text(body)
    with pytest.raises(KraftError) as e:
        load_config(str(p))
    assert e.value.code is ErrorCode.INVALID_REQUEST and needle in e.value.message


def test_cli_errors_are_one_line_with_code(tmp_path: Path) -> None:
    p = run_cli("kv", "get", "--bootstrap", "nonsense", "k", check=False)
    assert p.returncode != 0
    assert p.stderr.strip().splitlines()[-1].startswith("INVALID_REQUEST:")
    p = run_cli(
        "quorum", "add-voter", "--bootstrap", "127.0.0.1:9", "--id", "3", "--uuid", "not-a-uuid", check=False
    )
    assert p.returncode != 0 and p.stderr.startswith("INVALID_REQUEST:") and "not-a-uuid" in p.stderr
    p = run_cli("quorum", "describe", "--bootstrap", "127.0.0.1:9", "--timeout", "1", check=False)
    assert p.returncode != 0 and p.stderr.startswith("UNAVAILABLE:")
    p = run_cli("frobnicate", check=False)
    assert p.returncode == 2 and "INVALID_REQUEST" in p.stderr


def test_format_replacement_flag_is_recorded(tmp_path: Path) -> None:
    from quorum.storage import load_meta

    run_cli("format", "--dir", str(tmp_path / "a"), "--cluster-id", "c", "--node-id", "1")
    run_cli(
        "format",
        "--dir",
        str(tmp_path / "b"),
        "--cluster-id",
        "c",
        "--node-id",
        "1",
        "--no-initial-controllers",
    )
    assert load_meta(tmp_path / "a").initial_bootstrap is True
    assert load_meta(tmp_path / "b").initial_bootstrap is False
    assert "bootstrap.initial=false" in (tmp_path / "b" / "meta.properties").read_text()


@pytest.mark.parametrize("field", ["fetch_max_bytes", "catchup_fetch_max_bytes", "snapshot_chunk_bytes"])
def test_fetch_sizes_above_the_wire_limit_are_refused(tmp_path: Path, field: str) -> None:
    # The wire refuses a MaxBytes above wire.MAX_BYTES: a node asking for more would never
    # catch up, so the configuration is refused first, naming the field.
    assert MAX_FETCH_BYTES == wire.MAX_BYTES
    CoreConfig(**{field: wire.MAX_BYTES})  # the limit itself is allowed
    with pytest.raises(ValueError, match=f"CoreConfig.{field} must be at most {wire.MAX_BYTES}"):
        CoreConfig(**{field: wire.MAX_BYTES + 1})
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"raft": {field: wire.MAX_BYTES + 1}}))
    with pytest.raises(KraftError) as e:
        load_config(str(p))
    assert e.value.code is ErrorCode.INVALID_REQUEST and field in e.value.message


def test_start_formats_its_volume_first_and_refuses_another_nodes(tmp_path: Path) -> None:
    """``start --format-cluster-id`` (the pods' one process) is ``format --ignore-formatted``
    then the node: an empty volume gets its identity; a volume of another node fails the start."""
    from quorum.storage import load_meta

    new = tmp_path / "new"
    # --listen is invalid on purpose: the volume is prepared, then the start fails without serving.
    p = run_cli("start", "--format-cluster-id", "c", "--format-node-id", "2", "--no-initial-controllers",
                "--dir", str(new), "--listen", "nonsense", "--voters", "1@127.0.0.1:9", check=False)
    assert p.returncode != 0 and "--listen" in p.stderr, p.stderr
    assert f"Formatted {new} for cluster c node 2" in p.stdout
    assert load_meta(new).node_id == 2 and load_meta(new).initial_bootstrap is False
    before = (new / "meta.properties").read_text()
    p = run_cli("start", "--format-cluster-id", "c", "--format-node-id", "3", "--dir", str(new),
                "--listen", "127.0.0.1:9", "--voters", "1@127.0.0.1:9", check=False)
    assert p.returncode != 0 and p.stderr.startswith("ALREADY_FORMATTED:") and "node 2" in p.stderr, p.stderr
    assert (new / "meta.properties").read_text() == before
    p = run_cli("start", "--format-node-id", "3", "--dir", str(new), "--listen", "127.0.0.1:9",
                "--voters", "1@127.0.0.1:9", check=False)
    assert p.returncode != 0 and "need --format-cluster-id" in p.stderr, p.stderr
