"""A retired identity after ``kraftkeeper cluster replace-disk``, with real processes
(``kraftkeeper operator local``, TLS on): node certificates name their disk's storage UUID, the
replaced disk gets a new one, and the old certificate, kept by an attacker, can neither speak
for the new disk nor, as the removed (id, old UUID), fetch, get a vote or move an epoch. A
current voter's Fetch from a higher epoch gets UNKNOWN_LEADER_EPOCH and the leader keeps
leading. Ends with the data and the voter set intact."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import struct
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509

from quorum.core import messages as m
from quorum.runtime import wire
from quorum.runtime.peerstream import RPCS, STREAM_PATH, SUBPROTOCOL
from quorum.security.pki import identity_from_cert, peer_hostname
from quorum.security.tlsctx import client_context
from quorum.storage.meta import load_meta
from testkit.polling import wait_until
from tests.hostile.fakes import rpc
from tests.operator.operator_nodes import LocalCluster

pytestmark = pytest.mark.slow


def _storage_of(cert: Path) -> str | None:
    return identity_from_cert(x509.load_pem_x509_certificate(cert.read_bytes())).storage_uuid


def _ctx(d: Path, crt: Path, key: Path) -> ssl.SSLContext:
    return client_context(d / "tls" / "ca.crt", crt, key)


def test_a_replaced_disk_retires_its_certificate(tmp_path: Path) -> None:
    d = tmp_path / "idc"
    c = LocalCluster(d, 3, extra=["--stabilization-seconds", "1", "--live-window-seconds", "3"])
    try:
        first = wait_until(
            "a leader and 3 known voters",
            c.describe_all_known,
            timeout=90,
            errors=(Exception,),
        )
        cluster_id = load_meta(d / "node-1").cluster_id
        for i in (1, 2, 3):  # every node's credential names its own disk
            assert _storage_of(d / "tls" / f"node-{i}.crt") == load_meta(d / f"node-{i}").storage_uuid
        for i in range(5):
            assert c.kk("kv", "put", "--bootstrap", c.bootstrap(), f"id-{i}", f"v{i}").returncode == 0
        victim = next(v["id"] for v in first["voters"] if v["id"] != first["leader_id"])
        old = next(v["uuid"] for v in first["voters"] if v["id"] == victim)
        stolen = tmp_path / "stolen"
        stolen.mkdir()
        for ext in ("crt", "key"):  # the old disk's credential, kept by whoever kept the disk
            shutil.copy(d / "tls" / f"node-{victim}.{ext}", stolen / f"node.{ext}")
        out = c.kk("cluster", "replace-disk", "--dir", str(d), "--node", str(victim))
        assert out.returncode == 0, out.stderr
        new = out.stdout.strip().splitlines()[-1]

        def swapped() -> dict[str, Any] | None:
            x = c.describe()
            if not x or x["pending_voter_change"] is not None or x["leader_id"] <= 0:
                return None
            keys = {(v["id"], v["uuid"]) for v in x["voters"]}
            return x if (victim, new) in keys and (victim, old) not in keys and len(keys) == 3 else None

        before = wait_until("voters swapped to the new disk", swapped, timeout=150, errors=(Exception,))
        assert _storage_of(d / "tls" / f"node-{victim}.crt") == new  # a new disk, a new credential
        assert _storage_of(stolen / "node.crt") == old
        leader, epoch = before["leader_id"], before["leader_epoch"]
        ep = c.endpoint(leader)
        old_ctx = _ctx(d, stolen / "node.crt", stolen / "node.key")
        sni = peer_hostname(cluster_id, leader)

        def send(msg: Any, ctx: ssl.SSLContext = old_ctx) -> tuple[int, Any]:
            return rpc(ep, msg, ctx=ctx, server_hostname=sni)

        # 1. the old certificate claiming the new disk: refused before the node sees it
        for claim_epoch in (epoch, epoch + 1):
            status, body = send(
                m.FetchRequest(1, cluster_id, victim, new, claim_epoch, 10**6, epoch, 0, 1024, None)
            )
            assert status == 403 and body["error_code"] == "PERMISSION_DENIED", (status, body)
        # ... and the same on a peer stream: the stream makes the middleware's two checks
        for claim_epoch in (epoch, epoch + 1):
            fetch = m.FetchRequest(1, cluster_id, victim, new, claim_epoch, 10**6, epoch, 0, 1024, None)
            status, body = _stream_ask(ep, old_ctx, sni, "fetch", fetch)
            assert status == 403 and b"PERMISSION_DENIED" in body, (status, body)
        # 2. as itself, the removed (id, old UUID): no data, no vote, no epoch moved
        status, raw = send(m.FetchRequest(2, cluster_id, victim, old, epoch, 0, 0, 0, 1 << 20, None))
        assert status == 200
        answer = _decode(raw, "fetch")
        assert answer.error_code.value == "NOT_VOTER" and bytes(answer.records) == b""
        status, raw = send(
            m.VoteRequest(3, cluster_id, victim, old, epoch + 5, leader, None, 10**6, 10**9)
        )
        assert status == 200 and not _decode(raw, "vote").vote_granted
        status, raw = send(m.FetchRequest(4, cluster_id, victim, old, epoch + 3, 0, 0, 0, 1024, None))
        assert status == 200 and _decode(raw, "fetch").error_code.value == "NOT_VOTER"
        # 3. the new disk's own (valid) certificate fetching from a higher epoch: the leader
        # answers UNKNOWN_LEADER_EPOCH and keeps leading
        new_ctx = _ctx(d, d / "tls" / f"node-{victim}.crt", d / "tls" / f"node-{victim}.key")
        status, raw = send(
            m.FetchRequest(5, cluster_id, victim, new, epoch + 1, 0, 0, 0, 1024, None), new_ctx
        )
        reply = _decode(raw, "fetch")
        assert status == 200 and reply.error_code.value == "UNKNOWN_LEADER_EPOCH"
        assert reply.leader_id == leader and reply.leader_epoch == epoch  # answered, then campaigns

        # A current voter ahead of the epoch has no other way back than an election above its
        # epoch, which the same leader runs and wins with its followers' votes: the leader may
        # move to epoch + 2, never step down for another.
        after = wait_until(
            "a leader",
            lambda: (x := c.describe()) and x["leader_id"] > 0 and x,
            timeout=60,
            errors=(Exception,),
        )
        assert after["leader_id"] == leader and after["leader_epoch"] in (epoch, epoch + 2), after
        assert {(v["id"], v["uuid"]) for v in after["voters"]} == {
            (v["id"], v["uuid"]) for v in before["voters"]
        }
        for i in range(5):
            got = c.kk("kv", "get", "--bootstrap", c.bootstrap(), f"id-{i}")
            assert got.returncode == 0 and got.stdout.strip() == f"v{i}", got
        assert c.kk("kv", "put", "--bootstrap", c.bootstrap(), "id-after", "x").returncode == 0
    finally:
        assert c.stop() == 0, c.tail()


_RESPONSES: dict[str, type] = {"fetch": m.FetchResponse, "vote": m.VoteResponse}


def _decode(raw: bytes, rpc_name: str) -> Any:
    return wire.decode(_RESPONSES[rpc_name], raw)


_HEAD = struct.Struct("<cHI")  # the peer stream's frame head: kind, rpc or status, request id


def _stream_ask(ep: str, ctx: ssl.SSLContext, sni: str, rpc_name: str, msg: Any) -> tuple[int, bytes]:
    """One request on a peer stream opened with ``ctx``: the answer's status and body."""

    async def go() -> tuple[int, bytes]:
        async with aiohttp.ClientSession() as s:
            ws = await s.ws_connect(
                f"wss://{ep}{STREAM_PATH}", protocols=(SUBPROTOCOL,), ssl=ctx, server_hostname=sni
            )
            try:
                await ws.send_bytes(_HEAD.pack(b"Q", RPCS.index(rpc_name), 7) + wire.encode(msg))
                answer = await ws.receive(timeout=30)
                assert answer.type is aiohttp.WSMsgType.BINARY, answer
                kind, status, rid = _HEAD.unpack_from(answer.data, 0)
                assert (kind, rid) == (b"A", 7)
                return status, bytes(answer.data[_HEAD.size :])
            finally:
                await ws.close()

    return asyncio.run(go())
