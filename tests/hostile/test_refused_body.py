"""A refused request costs the node no more than its answer (no request may wedge a node):
three real node processes with TLS, and a client that sends a large body slowly after a
head the node refuses (401 without credentials, 413 by Content-Length with them). The node
answers with ``Connection: close`` and closes the connection without reading the rest: the
client can push no more than the sockets' buffers after the answer, and the connection ends in
a reset instead of being drained. The node serves meanwhile."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator

import pytest

from quorum.security.tlsctx import client_context
from testkit.polling import wait_until
from tests.hostile.fakes import http_metrics
from tests.tlsfixtures import TlsCluster, make_tls_dir

pytestmark = pytest.mark.slow

BODY = 256 * 1024 * 1024  # what the client announces: far more than any drain could read
# After the answer, what the client can still push without the node reading: its own send
# buffer (tcp_wmem max 4 MiB) and the node's receive window of a socket nobody reads (about
# 128 KiB to a few MiB). A node that drains reads everything sent during its linger instead.
ACCEPTED_AFTER_ANSWER_MAX = 16 * 1024 * 1024
CHUNK = b"x" * 65536


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    tls = make_tls_dir(tmp_path_factory.mktemp("tls"))
    c = TlsCluster(tmp_path_factory.mktemp("nodes"), tls)
    c.up()
    try:
        c.state(60)
        yield c
    finally:
        c.stop()


def _refused_upload(port: int, ctx: ssl.SSLContext, head: bytes) -> tuple[bytes, int, str]:
    """Send ``head`` and a first body chunk, wait for the answer (the slow sender), then push
    the rest of the body. Returns the answer's head, the body bytes the connection accepted
    after the answer, and how the connection ended."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(head)
        s.sendall(CHUNK[:4096])
        answer = b""
        while b"\r\n\r\n" not in answer:
            more = s.recv(4096)  # the 30 s socket timeout bounds a node that never answers
            assert more, f"closed before a whole answer: {answer!r}"
            answer += more
        accepted = 0
        try:
            while accepted < BODY:
                s.sendall(CHUNK)
                accepted += len(CHUNK)
            ended = "open: the node read the whole body"
        except (ConnectionError, ssl.SSLError) as e:  # reset, broken pipe, or the TLS layer's view
            ended = f"closed ({type(e).__name__})"
        except TimeoutError:
            ended = "open: the node neither read nor closed for 30 s"
        return answer.split(b"\r\n\r\n", 1)[0], accepted, ended


@pytest.mark.parametrize(
    ("who", "status"),
    [("nobody", b" 401 "), ("readwrite token", b" 413 ")],
)
def test_refused_large_body_is_answered_and_not_read(cluster: TlsCluster, who: str, status: bytes) -> None:
    leader = cluster.state()["leader_id"]
    ep, port = cluster.endpoint(leader), cluster.ports[leader]
    auth = b""
    if who == "readwrite token":
        auth = b"Authorization: Bearer " + (cluster.tls / "rw.token").read_bytes().strip() + b"\r\n"
    head = (
        f"PUT /v1/kv/refused HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {BODY}\r\n".encode()
        + auth
        + b"\r\n"
    )
    ctx = client_context(cluster.tls / "ca.crt")
    metrics_ctx = client_context(cluster.tls / "ca.crt", cluster.tls / "admin.crt", cluster.tls / "admin.key")
    # each follower fetches over one peer stream, which the leader counts apart from clients
    wait_until("the followers' peer streams", lambda: http_metrics(ep, metrics_ctx)["peer_streams"] == 2, 30)
    before = _client_connections(ep, metrics_ctx)
    answer, accepted, ended = _refused_upload(port, ctx, head)
    assert answer.startswith(b"HTTP/1.1") and status in answer.split(b"\r\n")[0], answer
    assert b"connection: close" in answer.lower(), answer
    assert ended.startswith("closed"), ended
    assert accepted < ACCEPTED_AFTER_ANSWER_MAX, f"{accepted} bytes accepted after the answer: drained"
    # the node serves, and its connection count comes back
    assert cluster.call_as("rw.json", lambda q: q.put("after-refusal", b"ok")) >= 0
    assert cluster.call_as("read.json", lambda q: q.get("after-refusal")) == b"ok"
    wait_until(
        "the refused connection to go",
        lambda: _client_connections(ep, metrics_ctx) <= before,
        30,
        errors=(Exception,),
    )


def _client_connections(endpoint: str, ctx: ssl.SSLContext) -> float:
    """Open connections that are not peer streams (the followers' streams to the leader come
    and go with elections and reconnects, independently of this test's clients)."""
    m = http_metrics(endpoint, ctx)
    return m["connections"] - m["peer_streams"]
