"""Node configuration: defaults, the ``--config`` file (JSON or TOML) and ``--voters``.

File layout (every key optional; an unknown key is an error naming it)::

    {"log": {"fsync": true, "segment_bytes": 67108864, "unflushed_in_memory": false},
     "raft": {"election_timeout_ms": 1000, "fetch_timeout_ms": 2000, "request_timeout_ms": 2000,
              "fetch_max_wait_ms": 500, "catch_up_max_lag": 100, "catch_up_recent_ms": 2000,
              "add_voter_timeout_ms": 30000, "pre_vote": true},
     "snapshot": {"max_bytes": 67108864},
     "client": {"write_timeout_ms": 10000}}

``log.unflushed_in_memory`` is for TESTS ONLY (the power-loss process tests): the log keeps
written-but-unflushed bytes in process memory and writes them to its files only when it
flushes, so a SIGKILL loses exactly what was not fsynced, as a power cut would. It is off unless
set to ``true`` explicitly, and the node logs a warning at start when it is on.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from typing import Any

from quorum.core.config import CoreConfig
from quorum.types import ErrorCode, KraftError

_RAFT_KEYS = {
    "election_timeout_ms",
    "election_backoff_max_ms",
    "fetch_timeout_ms",
    "request_timeout_ms",
    "fetch_max_wait_ms",
    "fetch_max_bytes",
    "snapshot_chunk_bytes",
    "catchup_fetch_max_bytes",
    "catchup_flush_bytes",
    "catch_up_max_lag",
    "catch_up_recent_ms",
    "add_voter_timeout_ms",
    "pre_vote",
    "max_batch_records",
}


@dataclass
class NodeConfig:
    fsync: bool = True  # fsync every batch before it counts toward the high watermark
    segment_bytes: int = 64 * 1024 * 1024
    snapshot_bytes: int = 64 * 1024 * 1024  # log bytes applied since the last snapshot
    write_timeout_ms: int = 10000
    tick_ms: int = 10
    unflushed_in_memory: bool = False  # test-only power-loss mode (module docstring)
    raft: dict[str, Any] = field(default_factory=dict)

    def log_options(self) -> dict[str, Any]:
        """Keyword options for ``quorum.storage.open_storage`` beyond fsync and segment size."""
        return {"unflushed_in_memory": True} if self.unflushed_in_memory else {}

    def core_config(
        self, voters: dict[int, str], local_endpoint: str, initial_bootstrap: bool = True
    ) -> CoreConfig:
        try:
            return CoreConfig(
                bootstrap_voters=dict(voters),
                local_endpoint=local_endpoint,
                initial_bootstrap=initial_bootstrap,
                **self.raft,
            )
        except (TypeError, ValueError) as e:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"config raft: {e}") from None


def _expect(section: str, key: str, value: Any, kind: type) -> Any:
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise KraftError(
            ErrorCode.INVALID_REQUEST, f"config {section}.{key}: expected {kind.__name__}, got {value!r}"
        )
    if kind is int and value <= 0:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"config {section}.{key}: must be positive, got {value}")
    return value


def load_config(path: str | None) -> NodeConfig:
    cfg = NodeConfig()
    if path is None:
        return cfg
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"cannot read config {path}: {e.strerror}") from None
    try:
        obj = tomllib.loads(raw.decode()) if path.endswith(".toml") else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"config {path} does not parse: {e}") from None
    if not isinstance(obj, dict):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"config {path}: top level must be an object")
    for section, body in obj.items():
        if not isinstance(body, dict):
            raise KraftError(ErrorCode.INVALID_REQUEST, f"config section {section!r} must be an object")
        for key, value in body.items():
            if section == "log" and key == "fsync":
                cfg.fsync = _expect(section, key, value, bool)
            elif section == "log" and key == "unflushed_in_memory":
                cfg.unflushed_in_memory = _expect(section, key, value, bool)
            elif section == "log" and key == "segment_bytes":
                cfg.segment_bytes = _expect(section, key, value, int)
            elif section == "snapshot" and key == "max_bytes":
                cfg.snapshot_bytes = _expect(section, key, value, int)
            elif section == "client" and key == "write_timeout_ms":
                cfg.write_timeout_ms = _expect(section, key, value, int)
            elif section == "raft" and key in _RAFT_KEYS:
                cfg.raft[key] = _expect(section, key, value, bool if key == "pre_vote" else int)
            else:
                raise KraftError(ErrorCode.INVALID_REQUEST, f"config {path}: unknown key {section}.{key}")
    cfg.core_config({}, "127.0.0.1:1")  # validate the raft section now, not at start
    return dataclasses.replace(cfg)


def parse_voters(text: str) -> dict[int, str]:
    """``"1@h:p,2@h:p"`` (controller.quorum.voters) into {id: endpoint}; INVALID_REQUEST naming
    the bad entry otherwise."""
    out: dict[int, str] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        sid, at, ep = item.partition("@")
        host, colon, port = ep.rpartition(":")
        if (
            not at
            or not sid.strip().isdigit()
            or not colon
            or not host
            or not port.isdigit()
            or not 0 < int(port) < 65536
        ):
            raise KraftError(ErrorCode.INVALID_REQUEST, f"--voters entry {item!r}: expected ID@HOST:PORT")
        vid = int(sid)
        if vid in out:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"--voters lists id {vid} twice")
        out[vid] = ep
    if not out:
        raise KraftError(ErrorCode.INVALID_REQUEST, "--voters is empty")
    return out
