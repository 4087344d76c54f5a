"""A client command without credentials against a TLS node (the default wherever we start one)
says that the node speaks TLS and which option or variable gives the credentials, at once,
instead of "cannot reach any address (...: Server disconnected)" after its whole timeout."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from quorum.client import speaks_tls
from quorum.localports import free_port
from quorum.security.clientconfig import ENV_VAR
from testkit.polling import wait_until
from testkit.tls import CLUSTER, make_tls_dir

KK = [sys.executable, "-m", "quorum.cli"]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KK, *args], capture_output=True, text=True, timeout=90, env=env)


@pytest.fixture
def tls_node(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """One real ``kraftkeeper start --tls-dir`` node (a quorum of one); yields its address and
    the TLS directory."""
    tls = make_tls_dir(tmp_path / "tls", nodes=(1,))
    data = tmp_path / "n1"
    r = _cli("format", "--dir", str(data), "--cluster-id", CLUSTER, "--node-id", "1")
    assert r.returncode == 0, r.stderr
    ep = f"127.0.0.1:{free_port()}"
    log = (tmp_path / "n1.log").open("wb")
    proc = subprocess.Popen(
        [*KK, "start", "--dir", str(data), "--listen", ep, "--voters", f"1@{ep}", "--tls-dir", str(tls)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        up = lambda: proc.poll() is None and asyncio.run(speaks_tls(ep, 2))  # noqa: E731
        wait_until("the node's TLS listener", up, 60)
        yield ep, tls
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.mark.slow  # a real node process
def test_no_client_config_names_the_option_and_the_variable(tls_node: tuple[str, Path]) -> None:
    ep, tls = tls_node
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    # --timeout 60: a retry loop would end with "cannot reach" only after it
    r = _cli("kv", "put", "--bootstrap", ep, "--timeout", "60", "greeting", "hello", env=env)
    assert r.returncode == 1
    assert r.stderr.startswith(f"UNAVAILABLE: {ep} speaks TLS"), r.stderr
    assert "--client-config" in r.stderr and ENV_VAR in r.stderr
    assert r.stderr.count("\n") == 1  # one line
    # The same command with the credentials works: it was only the missing client config.
    ok = _cli("kv", "put", "--bootstrap", ep, "--client-config", str(tls / "admin.json"), "greeting", "hello")
    assert ok.returncode == 0, ok.stderr


async def test_a_plaintext_node_is_not_taken_for_tls() -> None:
    app = web.Application()
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        assert not await speaks_tls(f"127.0.0.1:{runner.addresses[0][1]}", 5)
    finally:
        await runner.cleanup()
    assert not await speaks_tls(f"127.0.0.1:{free_port()}", 5)  # nothing listens
