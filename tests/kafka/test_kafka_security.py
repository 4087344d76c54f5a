"""``operator watch`` against Kafka controllers that require SASL_SSL (TLS with a PEM truststore,
SASL PLAIN), configured from a Kafka client properties file as Kafka's tools take it: wrong
credentials are reported and change nothing; the right ones heal a replaced disk."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kraftkeeper_operator.kafka.cluster import KafkaControllers, KafkaSecurity

from quorum.kafka.mapping import base64_to_uuid
from testkit.polling import wait_until
from tests.kafka.watcher import NOT_YET, Watcher

pytestmark = pytest.mark.slow


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_pki(d: Path, dns_names: tuple[str, ...] = ("localhost",), ips: tuple[str, ...] = ("127.0.0.1",)
             ) -> tuple[Path, Path]:
    """A CA and a server certificate for ``ips`` and ``dns_names`` (by default 127.0.0.1 and
    localhost); returns (ca.pem, keystore.pem)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kraftkeeper test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kafka-controller")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
                + [x509.DNSName(name) for name in dns_names]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = d / "ca.pem"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    keystore = d / "keystore.pem"
    keystore.write_bytes(
        _pem_key(key)
        + cert.public_bytes(serialization.Encoding.PEM)
        + ca.public_bytes(serialization.Encoding.PEM)
    )
    keystore.chmod(0o600)
    return ca_pem, keystore


@pytest.fixture
def secure_controllers(tmp_path: Path, kafka_jars: Path) -> Iterator[KafkaControllers]:
    ca, ks = make_pki(tmp_path)
    sec = KafkaSecurity(ca, ks, "admin", "admin-secret")
    k = KafkaControllers(tmp_path / "kafka", kafka_jars, security=sec)
    with k.running():
        yield k


def test_watch_over_sasl_ssl(secure_controllers: KafkaControllers, tmp_path: Path) -> None:
    k = secure_controllers
    assert k.security is not None
    good = tmp_path / "client.properties"
    good.write_text(k.security.client_properties())
    bad = tmp_path / "wrong.properties"
    bad.write_text(k.security.client_properties(password="not-the-password"))

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    other_ca, _ = make_pki(foreign)
    untrusted = tmp_path / "untrusted.properties"
    untrusted.write_text(k.security.client_properties().replace(str(k.security.ca_pem), str(other_ca)))
    for props, why in ((bad, "SASL authentication failed"), (untrusted, "TLS handshake failed")):
        w = Watcher(
            k.bootstrap, tmp_path / f"events-{props.stem}", "--kafka-client-config", str(props)
        ).start()
        try:
            st = wait_until(
                "an error status", lambda w=w: (s := w.status()).get("error") and s, 60, errors=NOT_YET,
            )
            assert st["phase"] == "QuorumLost" and why in st["error"], st
            w.passes_after(3)
            assert w.events_list() == []
        finally:
            w.stop()

    w = Watcher(
        k.bootstrap, tmp_path / "events", "--kafka-client-config", str(good), "--stabilization-seconds", "0"
    ).start()
    try:
        wait_until(
            "a healthy SASL_SSL quorum", lambda: w.status().get("phase") == "Running", 120, errors=NOT_YET,
        )
        leader = w.status()["leaderId"]
        victim = next(i for i in k.controllers if i != leader)
        new = str(base64_to_uuid(k.replace_disk(victim)))
        wait_until(
            "the replaced controller healed over SASL_SSL",
            lambda: any(e["type"] == "recovery_completed" and e["new_uuid"] == new for e in w.events_list()),
            180,
            errors=NOT_YET,
        )
        voters = wait_until(
            "the watcher's status showing the new voter",
            lambda: (
                (vs := {(v["id"], v["uuid"]) for v in w.status()["voters"]}) and (victim, new) in vs and vs
            ),
            60,
            errors=NOT_YET,
        )
        assert len(voters) == 3
    finally:
        w.stop()
