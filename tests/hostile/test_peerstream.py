"""The hostile suite against the peer stream (``quorum.runtime.peerstream``): three real TLS
node processes that talk to each other over streams, and an attacker who opens one with every
kind of wrong credential, impersonates another replica on a valid stream, and sends malformed
and oversized frames. Every test ends with the streams in use, the committed keys intact and
the voter set unchanged."""

from __future__ import annotations

import asyncio
import ssl
import struct
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from quorum.core import messages as m
from quorum.runtime import wire
from quorum.runtime.peerstream import MAX_REQUEST_FRAME, RPCS, STREAM_PATH, SUBPROTOCOL
from quorum.security.pki import peer_hostname
from quorum.security.tlsctx import client_context
from testkit.polling import wait_until
from tests.hostile.fakes import assert_intact, frame
from tests.hostile.tlsattack import KEYS, ctx_as, running_tls_cluster
from tests.tlsfixtures import CLUSTER, TlsCluster

pytestmark = pytest.mark.slow

HEAD = struct.Struct("<cHI")


# A cluster as the TLS half's (three TLS nodes, its committed KEYS), this module's own: its checks
# read the nodes' logs, which the TLS half's attacks would fill.
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    yield from running_tls_cluster(tmp_path_factory)


async def _open(c: TlsCluster, node: int, who: str, **kw: Any) -> tuple[aiohttp.ClientSession, Any]:
    s = aiohttp.ClientSession()
    try:
        ws = await s.ws_connect(
            f"wss://{c.endpoint(node)}{STREAM_PATH}",
            protocols=(SUBPROTOCOL,),
            ssl=ctx_as(c, who),
            server_hostname=peer_hostname(CLUSTER, node),
            **kw,
        )
    except BaseException:
        await s.close()
        raise
    return s, ws


def _upgrade_refusal(c: TlsCluster, node: int, who: str) -> str:
    async def go() -> str:
        try:
            s, ws = await _open(c, node, who)
        except aiohttp.WSServerHandshakeError as e:
            return str(e.status)
        except (aiohttp.ClientConnectionError, ssl.SSLError, ConnectionError):
            return "tls"
        await ws.close()
        await s.close()
        return "accepted"

    return asyncio.run(go())


def _state(c: TlsCluster) -> dict[str, Any]:
    return c.state(60)


def _intact(c: TlsCluster, before: dict[str, Any]) -> None:
    assert_intact(
        before,
        _state(c),
        [c.endpoint(i) for i in c.procs],
        KEYS,
        lambda k: c.call_as("read.json", lambda q: q.get(k)),
        lambda k, v: c.call_as("rw.json", lambda q: q.put(k, v)),
        ctx=client_context(c.tls / "ca.crt"),
    )


def test_nodes_talk_over_streams(cluster: TlsCluster) -> None:
    # every node accepted a stream from each of its peers (the log line of serve_stream)
    for i in cluster.procs:
        wait_until(
            f"node {i} serving a stream", lambda i=i: "peer stream from replica" in cluster.log_text(i), 30,
            errors=(Exception,),
        )
    text = "".join(cluster.log_text(i) for i in cluster.procs)
    assert "per-request HTTP" not in text


def test_upgrade_refused_without_a_peer_certificate(cluster: TlsCluster) -> None:
    before = _state(cluster)
    leader = before["leader_id"]
    seen = {
        who: _upgrade_refusal(cluster, leader, who)
        for who in ("none", "foreign", "other-ca", "expired", "read")
    }
    assert seen["none"] == "401" and seen["foreign"] == "401", seen
    assert seen["read"] == "403", seen  # a client certificate is not a peer's
    assert seen["other-ca"] == "tls" and seen["expired"] in ("tls", "401"), seen
    _intact(cluster, before)


def _exchange(c: TlsCluster, node: int, frames: list[Any], **kw: Any) -> list[Any]:
    """Send ``frames`` (bytes: binary, str: text) on a stream opened as replica 3; the
    answers and the close code, in order, until the stream closes or goes quiet for 5 s."""

    async def go() -> list[Any]:
        s, ws = await _open(c, node, "node-3", **kw)
        out: list[Any] = []
        try:
            for f in frames:
                if isinstance(f, str):
                    await ws.send_str(f)
                else:
                    await ws.send_bytes(f)
            while True:
                try:
                    msg = await ws.receive(timeout=5)
                except TimeoutError:
                    break
                if msg.type is aiohttp.WSMsgType.BINARY:
                    kind, status, rid = HEAD.unpack_from(msg.data, 0)
                    out.append((kind, status, rid, msg.data[HEAD.size :]))
                    if len(out) >= len(frames):
                        break
                else:
                    out.append(("closed", ws.close_code))
                    break
        finally:
            await ws.close()
            await s.close()
        return out

    return asyncio.run(go())


def _req(rpc: str, rid: int, msg: Any) -> bytes:
    return HEAD.pack(b"Q", RPCS.index(rpc), rid) + wire.encode(msg)


def test_impersonation_on_a_valid_stream_is_refused(cluster: TlsCluster) -> None:
    before = _state(cluster)
    leader, epoch = before["leader_id"], before["leader_epoch"]
    as2 = m.FetchRequest(1, CLUSTER, 2, None, epoch, 10**6, epoch, 0, 1024, "127.0.0.1:1")
    vote = m.VoteRequest(1, CLUSTER, 2, None, epoch + 5, leader, None, epoch, 10**6)
    bqe = m.BeginQuorumEpochRequest(1, CLUSTER, 2, epoch + 5, leader, None, None, "127.0.0.1:1")
    out = _exchange(
        cluster, leader, [_req("fetch", 1, as2), _req("vote", 2, vote), _req("begin_quorum_epoch", 3, bqe)]
    )
    assert [(k, s, r) for k, s, r, _ in out] == [(b"A", 403, 1), (b"A", 403, 2), (b"A", 403, 3)], out
    assert all(b"PERMISSION_DENIED" in body for *_, body in out)
    # replica 3 speaking for itself is answered (it is a voter)
    own = m.FetchRequest(1, CLUSTER, 3, None, epoch, 0, 0, 0, 1024)
    (answer,) = _exchange(cluster, leader, [_req("fetch", 9, own)])
    assert answer[:3] == (b"A", 0, 9)
    assert isinstance(wire.decode(m.FetchResponse, answer[3]), m.FetchResponse)
    _intact(cluster, before)


def test_malformed_frames_close_the_stream(cluster: TlsCluster) -> None:
    before = _state(cluster)
    leader, epoch = before["leader_id"], before["leader_epoch"]
    ok = m.FetchRequest(1, CLUSTER, 3, None, epoch, 0, 0, 0, 1024)
    bad_body = HEAD.pack(b"Q", RPCS.index("fetch"), 1) + frame(b'{"replica_id": 3}')
    leo = max(v["log_end_offset"] for v in before["voters"])
    long_poll = m.FetchRequest(1, CLUSTER, 3, None, epoch, leo, epoch, 5000, 1024)
    # a body that does not decode is answered 400 and the stream stays open
    out = _exchange(cluster, leader, [bad_body, _req("fetch", 2, ok)])
    assert [(k, s, r) for k, s, r, _ in out] == [(b"A", 400, 1), (b"A", 0, 2)], out
    assert b"INVALID_REQUEST" in out[0][3] and b"missing field" in out[0][3]
    cases: list[tuple[list[Any], int]] = [
        (["a text frame"], aiohttp.WSCloseCode.UNSUPPORTED_DATA),
        ([b"Q\x00"], aiohttp.WSCloseCode.POLICY_VIOLATION),  # shorter than a frame head
        ([HEAD.pack(b"A", 0, 1)], aiohttp.WSCloseCode.POLICY_VIOLATION),  # an answer sent as request
        ([HEAD.pack(b"Q", 99, 1)], aiohttp.WSCloseCode.POLICY_VIOLATION),  # unknown RPC
        # the same id twice while the first (a long-poll) is in flight
        ([_req("fetch", 5, long_poll)] * 2, aiohttp.WSCloseCode.POLICY_VIOLATION),
        # larger than a request can be: refused before it is buffered whole (aiohttp's reader
        # stops at max_msg_size and drops the connection, 1009 or 1006 as the client sees it)
        ([b"Q" + b"\x00" * (MAX_REQUEST_FRAME + 10)], aiohttp.WSCloseCode.MESSAGE_TOO_BIG),
    ]
    for frames, code in cases:
        got = _exchange(cluster, leader, frames)
        want = (
            {code, aiohttp.WSCloseCode.ABNORMAL_CLOSURE}
            if code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
            else {code}
        )
        assert got and got[-1][0] == "closed" and got[-1][1] in want, (frames[0][:20], got)
    _intact(cluster, before)
