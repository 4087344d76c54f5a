"""`kraftkeeper start --tls-dir`: three real node processes on loopback with mutual TLS between
them and credentials for clients. Clients with the right role read and write; missing,
invalid or insufficient credentials and forged peer RPCs are refused with 401 / 403, and the
data and the voter set stay as they were. Start-up refuses plaintext on a non-loopback address
and a certificate of another replica."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from quorum.core import messages as m
from quorum.runtime import wire
from quorum.security.pki import peer_hostname
from quorum.security.tlsctx import client_context
from quorum.security.tokens import TOKENS_FILE, TokenStore
from testkit.polling import ANY_ERROR, wait_until
from tests.engine.cluster import run_cli
from tests.tlsfixtures import CLUSTER, TlsCluster, make_tls_dir

pytestmark = pytest.mark.slow  # a three-node TLS cluster of real processes


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tls_dir(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tls_dir: Path) -> Iterator[TlsCluster]:
    c = TlsCluster(tmp_path_factory.mktemp("nodes"), tls_dir).up()
    try:
        yield c
    finally:
        c.stop()


def _call(c: TlsCluster, cfg: str, fn: Any) -> Any:
    return c.call_as(cfg, fn)


def _raw(
    url: str, ctx: ssl.SSLContext | None, method: str = "GET", body: bytes = b"", **kw: Any
) -> tuple[int, Any]:
    async def go() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s, s.request(method, url, data=body, ssl=ctx, **kw) as r:
            raw = await r.read()
            return r.status, (json.loads(raw) if r.content_type == "application/json" else raw)

    return asyncio.run(go())


def _leader(c: TlsCluster) -> dict[str, Any]:
    return c.state()


def test_clients_with_roles(cluster: TlsCluster) -> None:
    d = _leader(cluster)
    assert {v["id"] for v in d["voters"]} == {1, 2, 3}
    assert _call(cluster, "rw.json", lambda q: q.put("k", b"v1")) >= 0
    assert _call(cluster, "read.json", lambda q: q.get("k")) == b"v1"


def test_refusals_change_nothing(cluster: TlsCluster) -> None:
    before = _leader(cluster)
    _call(cluster, "rw.json", lambda q: q.put("keep", b"me"))
    leader_ep = cluster.endpoint(before["leader_id"])
    ca = cluster.tls / "ca.crt"
    anon = client_context(ca)
    # plaintext to a TLS port gets no HTTP answer at all
    with pytest.raises(aiohttp.ClientError):
        _raw(f"http://{leader_ep}/v1/kv/keep", None)
    for open_path in ("/healthz", "/readyz", "/metrics"):  # probes and Prometheus need no credential
        assert _raw(f"https://{leader_ep}{open_path}", anon)[0] == 200
    status, body = _raw(f"https://{leader_ep}/v1/kv/keep", anon, "PUT", b"evil")
    assert (status, body["error_code"]) == (401, "UNAUTHENTICATED")
    read = client_context(ca, cluster.tls / "read.crt", cluster.tls / "read.key")
    status, body = _raw(f"https://{leader_ep}/v1/kv/keep", read, "PUT", b"evil")
    assert (status, body["error_code"]) == (403, "PERMISSION_DENIED")
    status, body = _raw(f"https://{leader_ep}/v1/quorum/reassign", read, "POST", b'{"voters": [3]}')
    assert (status, body["error_code"]) == (403, "PERMISSION_DENIED")
    # forged peer RPCs: replica 3's certificate claiming replica 2, another cluster's identity, none
    fetch = wire.encode(m.FetchRequest(1, CLUSTER, 2, None, before["leader_epoch"], 0, 0, 0, 1 << 20))
    vote = wire.encode(
        m.VoteRequest(1, CLUSTER, 2, None, before["leader_epoch"] + 5, before["leader_id"], None, 99, 10**6)
    )
    for cert_dir, node, code in (
        (cluster.tls, 3, "PERMISSION_DENIED"),
        (cluster.tls / "foreign", 2, "UNAUTHENTICATED"),
        (None, 0, "UNAUTHENTICATED"),
    ):
        ctx = (
            anon
            if cert_dir is None
            else client_context(ca, cert_dir / f"node-{node}.crt", cert_dir / f"node-{node}.key")
        )
        for rpc, body_bytes in (("fetch", fetch), ("vote", vote)):
            status, body = _raw(
                f"https://{leader_ep}/raft/v1/{rpc}",
                ctx,
                "POST",
                body_bytes,
                server_hostname=peer_hostname(CLUSTER, before["leader_id"]),
            )
            assert (status, body["error_code"]) == ({"PERMISSION_DENIED": 403}.get(code, 401), code)
    after = _leader(cluster)
    assert after["leader_id"] == before["leader_id"] and after["leader_epoch"] == before["leader_epoch"]
    assert [(v["id"], v["uuid"]) for v in after["voters"]] == [(v["id"], v["uuid"]) for v in before["voters"]]
    assert _call(cluster, "read.json", lambda q: q.get("keep")) == b"me"


def test_a_valid_peer_cannot_speak_for_others_or_send_malformed_rpcs(cluster: TlsCluster) -> None:
    before = _leader(cluster)
    leader = before["leader_id"]
    follower = next(i for i in (1, 2, 3) if i != leader)
    _call(cluster, "rw.json", lambda q: q.put("safe", b"yes"))
    ca = cluster.tls / "ca.crt"
    ctx = client_context(ca, cluster.tls / f"node-{follower}.crt", cluster.tls / f"node-{follower}.key")
    epoch = before["leader_epoch"]
    fetch_hdr = json.loads(
        wire.split_frame("f", wire.encode(m.FetchRequest(1, CLUSTER, follower, None, epoch, 0, 0, 0, 1)))[0]
    )
    huge_wait = dict(fetch_hdr, max_wait_ms=10**400)
    cases = [
        # the attacks, sent with a valid node certificate
        (
            "begin_quorum_epoch",
            wire.encode(m.BeginQuorumEpochRequest(1, CLUSTER, 99, 1000, leader, None)),
            403,
        ),
        ("fetch", wire.encode(m.FetchRequest(1, CLUSTER, 77, None, epoch, 0, 0, 0, 1 << 20)), 403),
        ("vote", wire.encode(m.VoteRequest(1, CLUSTER, follower, None, 2**31, leader, None, 0, 0)), 400),
        ("fetch", _frame(json.dumps(huge_wait).encode()), 400),
        ("fetch", _frame(b"[" * 5000 + b"]" * 5000), 400),
        ("fetch", _frame(json.dumps(dict(fetch_hdr, replica_id=str(follower))).encode()), 400),
    ]
    for rpc, body, status in cases:
        got, obj = _raw(
            f"https://{cluster.endpoint(leader)}/raft/v1/{rpc}",
            ctx,
            "POST",
            body,
            server_hostname=peer_hostname(CLUSTER, leader),
        )
        assert got == status, (rpc, obj)
        assert (
            obj["error_code"] == {403: "PERMISSION_DENIED", 400: "INVALID_REQUEST"}[status] and obj["message"]
        )
    after = _leader(cluster)
    assert (after["leader_id"], after["leader_epoch"]) == (leader, epoch)
    assert [(v["id"], v["uuid"]) for v in after["voters"]] == [(v["id"], v["uuid"]) for v in before["voters"]]
    assert not {o["id"] for o in after["observers"]} & {77, 99}
    assert _call(cluster, "read.json", lambda q: q.get("safe")) == b"yes"


def test_a_token_added_while_running_is_accepted(cluster: TlsCluster) -> None:
    _leader(cluster)
    store = TokenStore.load(cluster.tls / TOKENS_FILE)
    (cluster.tls / "late.token").write_text(store.add("late", "readwrite"))
    store.save()
    (cluster.tls / "late.json").write_text(json.dumps({"ca_file": "ca.crt", "token_file": "late.token"}))
    assert wait_until(
        "the new token",
        lambda: _call(cluster, "late.json", lambda q: q.put("late", b"1")) >= 0,
        30,
        0.05,
        errors=ANY_ERROR,
    )


def _frame(header: bytes) -> bytes:
    return len(header).to_bytes(4, "little") + header


def _start_node_9(data: Path, *args: str) -> tuple[int, str]:
    p = run_cli("start", "--dir", str(data), *args, check=False)
    return p.returncode, p.stderr


def test_start_refusals(cluster: TlsCluster, tmp_path: Path) -> None:
    n9 = tmp_path / "n9"
    run_cli("format", "--dir", str(n9), "--cluster-id", CLUSTER, "--node-id", "9")
    rc, err = _start_node_9(n9, "--listen", "0.0.0.0:1", "--advertise", "h:1", "--voters", "9@h:1")
    assert rc != 0 and err.startswith("INVALID_REQUEST") and "--insecure" in err
    # node 9 given node 1's certificate
    local = ("--listen", "127.0.0.1:1", "--voters", "9@127.0.0.1:1")
    tls = cluster.tls
    rc, err = _start_node_9(
        n9,
        *local,
        "--cert",
        str(tls / "node-1.crt"),
        "--key",
        str(tls / "node-1.key"),
        "--ca",
        str(tls / "ca.crt"),
    )
    assert rc != 0 and err.startswith("INVALID_REQUEST") and "replica/1" in err
    rc, err = _start_node_9(n9, *local, "--tls-dir", str(tls))
    assert rc != 0 and "node-9.crt does not exist" in err
