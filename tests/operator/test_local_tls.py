"""Local mode is secure by default: ``kraftkeeper operator local`` makes the cluster's
CA and credentials, the nodes serve https with mutual TLS between them, ``DIR/client.json`` is
the admin client config; ``--insecure`` turns both off. Certificates are renewed before they
expire, one node at a time, under write load, with no acknowledged write lost."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import ssl
import stat
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from kraftkeeper_operator.local.operator import local_main
from kraftkeeper_operator.local.tls import LocalTls, parse_duration, tls_from_args

from quorum.client import QuorumClient
from quorum.security.clientconfig import load_client_config
from quorum.security.pki import identity_from_cert, init_ca
from quorum.types import ErrorCode, KraftError
from testkit.polling import ANY_ERROR, wait_until
from tests.operator.operator_nodes import LocalCluster, engine_missing

needs_engine = pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))


def _cert(p: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(p.read_bytes())


# ---------------------------------------------------------------------------------------------
# Options and provisioning (no node processes)


@pytest.mark.parametrize("text", ["", "10", "0s", "-5m", "1w", "1.5.2h", "s"])
def test_durations_are_checked(text: str) -> None:
    with pytest.raises(ValueError, match="--cert-validity"):
        parse_duration(text, "--cert-validity")


def test_durations_parse() -> None:
    assert parse_duration("90s", "x") == dt.timedelta(seconds=90)
    assert parse_duration("12h", "x") == dt.timedelta(hours=12)
    assert parse_duration("365d", "x") == dt.timedelta(days=365)


def test_renew_before_must_be_shorter_than_the_validity(tmp_path: Path) -> None:
    a = argparse.Namespace(cert_validity="1h", renew_before="2h", insecure=False)
    with pytest.raises(ValueError, match="--renew-before"):
        tls_from_args(a, tmp_path, "c1", [1, 2, 3])
    a.insecure = True  # still checked: a typo must not pass silently with --insecure
    with pytest.raises(ValueError, match="--renew-before"):
        tls_from_args(a, tmp_path, "c1", [1])


def test_local_refuses_bad_tls_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = local_main(["--dir", str(tmp_path / "c"), "--cert-validity", "soon"])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("INVALID_REQUEST:") and "--cert-validity" in err
    assert not (tmp_path / "c" / "tls").exists()  # refused before anything was made


def test_provision_makes_every_credential_and_a_private_client_config(tmp_path: Path) -> None:
    tls = LocalTls(tmp_path, "cluster-a", [1, 2, 3])
    cfg = tls.provision()
    for i in (1, 2, 3):
        ident = identity_from_cert(_cert(tmp_path / "tls" / f"node-{i}.crt"))
        assert (ident.cluster_id, ident.replica_id) == ("cluster-a", i)
        assert stat.S_IMODE((tmp_path / "tls" / f"node-{i}.key").stat().st_mode) == 0o600
    admin = identity_from_cert(_cert(tmp_path / "tls" / "admin.crt"))
    assert admin.role == "admin" and admin.replica_id is None
    assert stat.S_IMODE((tmp_path / "client.json").stat().st_mode) == 0o600
    raw = json.loads((tmp_path / "client.json").read_text())
    assert raw == {"ca_file": "tls/ca.crt", "cert_file": "tls/admin.crt", "key_file": "tls/admin.key"}
    assert cfg.cert_file == tmp_path / "tls" / "admin.crt"  # relative to the config's folder
    assert load_client_config(tmp_path / "client.json").ca_file == tmp_path / "tls" / "ca.crt"


def test_provision_again_reissues_nothing_that_is_valid(tmp_path: Path) -> None:
    tls = LocalTls(tmp_path, "cluster-a", [1, 2, 3])
    tls.provision()
    before = {p.name: p.read_bytes() for p in (tmp_path / "tls").iterdir()}
    tls.provision()
    assert {p.name: p.read_bytes() for p in (tmp_path / "tls").iterdir()} == before


def test_provision_reissues_a_missing_or_foreign_node_certificate(tmp_path: Path) -> None:
    tls = LocalTls(tmp_path, "cluster-a", [1, 2, 3])
    tls.provision()
    keep = (tmp_path / "tls" / "node-1.crt").read_bytes()
    (tmp_path / "tls" / "node-2.crt").unlink()
    # node-3.crt replaced by node 1's: it names replica 1, so node 3 must get its own again
    (tmp_path / "tls" / "node-3.crt").write_bytes(keep)
    tls.provision()
    assert identity_from_cert(_cert(tmp_path / "tls" / "node-2.crt")).replica_id == 2
    assert identity_from_cert(_cert(tmp_path / "tls" / "node-3.crt")).replica_id == 3
    assert (tmp_path / "tls" / "node-1.crt").read_bytes() == keep


def test_provision_refuses_the_ca_of_another_cluster(tmp_path: Path) -> None:
    init_ca(tmp_path / "tls", "cluster-b")
    with pytest.raises(KraftError) as e:
        LocalTls(tmp_path, "cluster-a", [1]).provision()
    assert e.value.code is ErrorCode.INCONSISTENT_CLUSTER_ID and "cluster-b" in e.value.message
    assert not (tmp_path / "tls" / "node-1.crt").exists() and not (tmp_path / "client.json").exists()


def test_short_validity_is_due_for_renewal(tmp_path: Path) -> None:
    tls = LocalTls(
        tmp_path, "c", [1], validity=dt.timedelta(seconds=60), renew_before=dt.timedelta(seconds=30)
    )
    tls.provision()
    crt = tmp_path / "tls" / "node-1.crt"
    assert not tls.needs_renewal(crt, replica=1)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=35)
    assert tls.needs_renewal(crt, now=later, replica=1)
    assert tls.needs_renewal(crt, replica=2)  # names another replica


# ---------------------------------------------------------------------------------------------
# Real node processes


def _get(url: str, ctx: ssl.SSLContext | None = None, headers: dict[str, str] | None = None) -> int:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


@needs_engine
@pytest.mark.slow
def test_tls_by_default_and_insecure_turns_it_off(tmp_path: Path) -> None:
    d = tmp_path / "c"
    c = LocalCluster(d, 3, extra=["--stabilization-seconds", "1", "--live-window-seconds", "3"])
    try:
        first = wait_until("a leader and 3 voters", c.describe_all_known, 90, errors=ANY_ERROR)
        assert c.kk("kv", "put", "--bootstrap", c.bootstrap(), "k1", "v1").returncode == 0
        ep = c.endpoint(1)
        ca = ssl.create_default_context(cafile=str(d / "tls" / "ca.crt"))
        # https only, and the node's certificate verifies against the cluster CA as 127.0.0.1
        assert _get(f"https://{ep}/healthz", ca) == 200
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            _get(f"http://{ep}/healthz")
        # no credential: 401 and nothing changes; a wrong token: 401 too
        assert _get(f"https://{ep}/v1/quorum/describe", ca) == 401
        assert _get(f"https://{ep}/v1/kv/k1", ca, {"Authorization": "Bearer " + "x" * 43}) == 401
        # a client without the config is refused (https needs the CA); with it, it works
        out = c.kk("kv", "get", "--bootstrap", c.bootstrap(), "k1")
        assert out.returncode == 0 and out.stdout.strip() == "v1"
        # replace-disk on a TLS cluster: the node certificate names its disk, so the new disk
        # gets a new one before the node starts, and joins and is swapped in over TLS
        victim = 2
        cert_before = (d / "tls" / f"node-{victim}.crt").read_bytes()
        old = next(v["uuid"] for v in first["voters"] if v["id"] == victim)
        out = c.kk("cluster", "replace-disk", "--dir", str(d), "--node", str(victim))
        assert out.returncode == 0, out.stderr
        new = out.stdout.strip().splitlines()[-1]
        wait_until(
            "voters swapped to the new disk",
            lambda: (x := c.describe())
            and x["pending_voter_change"] is None
            and {(v["id"], v["uuid"]) for v in x["voters"]} >= {(victim, new)}
            and (victim, old) not in {(v["id"], v["uuid"]) for v in x["voters"]},
            120,
            errors=ANY_ERROR,
        )
        pem = (d / "tls" / f"node-{victim}.crt").read_bytes()
        assert pem != cert_before
        assert identity_from_cert(x509.load_pem_x509_certificate(pem)).storage_uuid == new
        got = c.kk("kv", "get", "--bootstrap", c.bootstrap(), "k1")
        assert got.returncode == 0 and got.stdout.strip() == "v1"
    finally:
        assert c.stop() == 0, c.tail()
    # The same directory with --insecure: plaintext on loopback, and no client.json left behind.
    c = LocalCluster(d, 3, base_port=c.base, insecure=True, extra=["--no-recovery"])
    try:
        wait_until("client.json removed", lambda: not (d / "client.json").exists(), 60, errors=ANY_ERROR)
        wait_until(
            "a plaintext leader", lambda: (x := c.describe()) and x["leader_id"] > 0, 90, errors=ANY_ERROR,
        )
        got = c.kk("kv", "get", "--bootstrap", c.bootstrap(), "k1")
        assert got.returncode == 0 and got.stdout.strip() == "v1"
    finally:
        assert c.stop() == 0, c.tail()


def test_replace_disk_refuses_a_bad_client_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kraftkeeper_operator.local.operator import replace_disk_main

    bad = tmp_path / "client.json"
    bad.write_text('{"ca_file": "ca.crt", "colour": "blue"}')
    assert replace_disk_main(["--dir", str(tmp_path), "--node", "1", "--client-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("INVALID_REQUEST:") and "colour" in err


class _Writer(threading.Thread):
    """Writes w-0, w-1, ... until stopped; a fresh client (re-reading client.json, whose admin
    certificate is renewed too) for every batch. Only acknowledged keys are recorded."""

    def __init__(self, c: LocalCluster) -> None:
        super().__init__(daemon=True)
        self.c, self.acked, self.errors = c, [], 0
        self.stop_flag = threading.Event()

    async def _batch(self, start: int) -> int:
        assert self.c.client_config is not None
        cfg = load_client_config(self.c.client_config)
        i = start
        async with QuorumClient(self.c.bootstrap(), timeout=10, client_config=cfg) as client:
            for _ in range(20):
                try:
                    await client.put(f"w-{i}", f"v-{i}".encode())
                except KraftError:
                    self.errors += 1
                    return i  # retried with the same key and value by the next batch
                self.acked.append(f"w-{i}")
                i += 1
        return i

    def run(self) -> None:
        i = 0
        while not self.stop_flag.is_set():
            try:
                i = asyncio.run(self._batch(i))
            except (KraftError, OSError, ssl.SSLError):
                self.errors += 1

    async def read_back(self) -> list[str]:
        assert self.c.client_config is not None
        cfg = load_client_config(self.c.client_config)
        async with QuorumClient(self.c.bootstrap(), timeout=30, client_config=cfg) as client:
            return [k for k in self.acked if await client.get(k) != f"v-{k[2:]}".encode()]


@needs_engine
@pytest.mark.slow
def test_certificates_rotate_one_node_at_a_time_under_writes(tmp_path: Path) -> None:
    d = tmp_path / "r"
    # 45 s certificates renewed 30 s before expiry: every node is due about 15 s after its
    # certificate was issued, so each one is renewed while the writer runs.
    c = LocalCluster(d, 3, extra=["--cert-validity", "45s", "--renew-before", "30s", "--no-recovery"])
    w = _Writer(c)
    try:
        try:
            wait_until("a leader and 3 voters", c.describe_all_known, 90, errors=ANY_ERROR)
            serials = {i: _cert(d / "tls" / f"node-{i}.crt").serial_number for i in (1, 2, 3)}
            w.start()
            wait_until("some writes acknowledged", lambda: len(w.acked) > 20, 60, errors=ANY_ERROR)
            rotations = wait_until(
                "every node rotated at least once",
                lambda: (r := c.status().get("certificateRotations") or {})
                and all(r.get(str(i), 0) >= 1 for i in (1, 2, 3))
                and r,
                180,
                errors=ANY_ERROR,
            )
            # A slow start may let a first rotation land before the serials above were read;
            # every node is due again ~15 s later, so each one's file changes while we watch.
            wait_until(
                "every node's certificate file replaced",
                lambda: all(_cert(d / "tls" / f"node-{i}.crt").serial_number != s
                            for i, s in serials.items()),
                120,
                errors=ANY_ERROR,
            )
            n = len(w.acked)
            wait_until(
                "writes continue after the rotations", lambda: len(w.acked) > n + 20, 60, errors=ANY_ERROR,
            )
            # never more than one node down: the quorum kept a leader and all three voters
            x = wait_until("3 voters", c.describe_all_known, 60, errors=ANY_ERROR)
            assert len(x["voters"]) == 3, (x, rotations)
        finally:
            w.stop_flag.set()
            w.join(timeout=60)
        lost = asyncio.run(w.read_back())
        assert len(w.acked) > 40
        assert lost == [], f"{len(lost)} acknowledged writes lost, e.g. {lost[:5]}"
    finally:
        # The operator and its nodes never outlive the test, whatever failed above.
        rc = c.stop()
    assert rc == 0, c.tail()
    for i in (1, 2, 3):  # graceful shutdown stopped every node
        assert not (d / "control" / f"node-{i}.pid").exists()
    assert os.path.exists(d / "client.json")
