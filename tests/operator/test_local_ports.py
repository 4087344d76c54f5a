"""``kraftkeeper operator local``'s own port: bound before it is reported. ``--base-port 0`` chooses
a free block, listens on its first port and only then writes the block into ``cluster.json``
(so a test or script reading it never races another process for it); an explicit port that is
taken is refused at once, before any node is formatted."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest

from quorum.localports import free_port, port_is_free
from testkit.launchers import reported_base_port, start_operator_local, stop_process, tail_of
from testkit.polling import wait_until
from tests.operator.operator_nodes import engine_missing, kk


@pytest.mark.slow  # starts processes
def test_a_taken_operator_port_is_refused_before_anything_is_formatted(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", port))
        other.listen(1)
        out = kk("operator", "local", "--dir", str(tmp_path / "c"), "--base-port", str(port), "--insecure")
    assert out.returncode == 1, out
    assert out.stderr.startswith(f"UNAVAILABLE: operator port: 127.0.0.1:{port}:"), out.stderr
    assert "in use" in out.stderr
    assert not (tmp_path / "c" / "node-1").exists()


@pytest.mark.slow  # starts processes
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
def test_base_port_zero_reports_a_block_whose_port_is_already_held(tmp_path: Path) -> None:
    d = tmp_path / "c"
    log = tmp_path / "operator.log"
    extra = ["--insecure", "--no-recovery", "--interval", "0.3"]
    proc = start_operator_local(d, 1, 0, extra, log)
    try:
        base = reported_base_port(d, proc, log)
        # Written after the bind: the port is held the moment it is readable.
        assert not port_is_free(base), f"port {base} reported but not listening"
        cfg = json.loads((d / "cluster.json").read_text())
        assert cfg["base_port"] == base and cfg["nodes"] == 1

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{base}/healthz", timeout=5) as r:
                return r.status == 200

        wait_until("the operator serving /healthz on its reported port", healthy, 60, errors=(OSError,),
                   context=lambda: tail_of(log))
    finally:
        assert stop_process(proc) == 0, tail_of(log)
    # The directory keeps its block: started again with 0, it binds the recorded port.
    proc = start_operator_local(d, 1, 0, extra, log)
    try:
        wait_until("the operator listening again on its recorded port", lambda: not port_is_free(base), 60,
                   context=lambda: tail_of(log))
        assert json.loads((d / "cluster.json").read_text())["base_port"] == base
    finally:
        assert stop_process(proc) == 0, tail_of(log)
