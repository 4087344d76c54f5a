"""bench.write_profile's buckets: where a sampled stack is counted (pure, no cluster)."""

from __future__ import annotations

from pathlib import Path

from bench.write_profile import bucket_of, shares

_LOOP = "<module> (quorum/cli.py:9);run_node (quorum/runtime/run.py:226);run_forever (loop.c:33192)"


def test_uvloop_frames_are_the_event_loop_not_the_node_runtime() -> None:
    # uvloop's C frames name no package; they must not fall through to run_node above them
    assert bucket_of(_LOOP + ";uv_run (core.c:464);uv__stream_io (stream.c:1)") == "event loop"
    assert (
        bucket_of(_LOOP + ";task_step (_asynciomodule.c:1);FlowTransport.write (quorum/runtime/turns.py:59)")
        == "node runtime"
    )


def test_waits_and_handshakes_are_left_out_of_the_shares(tmp_path: Path) -> None:
    idle = _LOOP + ";uv_run (core.c:464);uv__io_poll (linux.c:1452);epoll_pwait (libc.so.6)"
    handshake = _LOOP + ";SSLObject.do_handshake (ssl.py:1);EVP_DigestVerifyFinal (libcrypto.so.3)"
    assert bucket_of(idle) == "idle"
    assert bucket_of(handshake) == "setup"
    raw = tmp_path / "leader-1c.txt"
    raw.write_text(f"{idle} 50\n{handshake} 30\n{_LOOP};uv_run (core.c:464) 20\n")
    counts, busy = shares(raw)
    assert busy == 20  # neither the waiting loop nor connection set-up is a write's cost
    assert counts["idle"] == 50 and counts["setup"] == 30 and counts["event loop"] == 20
