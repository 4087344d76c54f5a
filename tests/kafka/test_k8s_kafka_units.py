"""``spec.kafka`` without a cluster: the operator's own validation (for objects the schema did not
check, e.g. stored before it was tightened) and the client settings built from a Secret's data
(files in the same Secret, written to a private directory only while they are read), and the
Degraded condition of an operator that could not change voters for lack of Kafka's schemas."""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.controller import Condition, ControllerStatus
from kraftkeeper_operator.core.policy import Order
from kraftkeeper_operator.k8s.kafkaquorums import settings_from_secret
from kraftkeeper_operator.k8s.kafkaspec import (
    is_kafka,
    note_schemas_missing,
    parse_kafka_spec,
    schemas_problem,
)
from kraftkeeper_operator.k8s.manifests import SpecError
from kraftkeeper_operator.kafka.clientconf import ClientConfigError

from tests.kafka.test_kafka_security import make_pki


def body(spec: dict[str, Any], **kafka: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "kq", "namespace": "ns", "uid": "u1", "generation": 2},
        "spec": {"kafka": {"bootstrapControllers": ["c-0.kafka:9093", "c-1.kafka:9093"], **kafka}, **spec},
    }


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def test_spec_defaults_and_policy() -> None:
    q = parse_kafka_spec(body({"recovery": {"order": "AddThenRemove"}}, stabilizationSeconds=0))
    assert is_kafka(body({})) and not is_kafka({"spec": {"voters": 3}})
    assert q.bootstrap == (("c-0.kafka", 9093), ("c-1.kafka", 9093))
    # spec.recovery.order (the engine's default AddThenRemove) does not apply: spec.kafka's does.
    assert q.policy.order is Order.REMOVE_THEN_ADD and q.policy.stabilization_seconds == 0
    assert q.policy.enabled and q.cluster == "ns/kq" and q.base.generation == 2
    assert q.secret_name is None
    q = parse_kafka_spec(body({"recovery": {"enabled": False}}, clientSecretRef={"name": "s"}))
    assert not q.policy.enabled and (q.secret_name, q.secret_key) == ("s", "client.properties")


@pytest.mark.parametrize(
    ("spec", "kafka", "needle"),
    [
        ({}, {"order": "AddThenRemove"}, "DUPLICATE_VOTER"),
        ({"image": "x:1"}, {}, "spec.image: not allowed with spec.kafka"),
        ({"scheduling": {"nodeSelector": {"a": "b"}}}, {}, "spec.scheduling"),
        ({"tls": {"mode": "Disabled"}}, {}, "spec.tls"),
        ({"uncleanRecovery": {"enabled": True}}, {}, "spec.uncleanRecovery.enabled"),
        ({}, {"bootstrapControllers": []}, "spec.kafka.bootstrapControllers"),
        ({}, {"bootstrapControllers": ["host:0"]}, "'host:0' is not HOST:PORT"),
        ({}, {"bootstrapControllers": ["host"]}, "'host' is not HOST:PORT"),
        ({}, {"stabilizationSeconds": 60, "timeoutSeconds": 30}, "spec.kafka.timeoutSeconds"),
        ({}, {"maxLagRecords": -1}, "spec.kafka.maxLagRecords"),
        ({}, {"clientSecretRef": {"key": "x"}}, "spec.kafka.clientSecretRef"),
        ({"eventLog": {"path": "relative"}}, {}, "spec.eventLog.path"),
    ],
)
def test_spec_refusals_name_the_field(spec: dict[str, Any], kafka: dict[str, Any], needle: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_kafka_spec(body(spec, **kafka))
    assert needle in str(e.value)


def _leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("kk-kafka-client-*")}


def test_settings_from_secret_with_files(tmp_path: Path) -> None:
    ca, ks = make_pki(tmp_path)
    props = (
        "security.protocol=SASL_SSL\nssl.truststore.type=PEM\nssl.truststore.location=ca.pem\n"
        "ssl.keystore.type=PEM\nssl.keystore.location=keystore.pem\nsasl.mechanism=PLAIN\n"
        'sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="u" '
        'password="p";\n'
    )
    data = {
        "client.properties": b64(props),
        "ca.pem": b64(ca.read_bytes()),
        "keystore.pem": b64(ks.read_bytes()),
    }
    before = _leftovers()
    s = settings_from_secret(data, "client.properties", "Secret ns/s")
    assert s.security_protocol == "SASL_SSL" and s.ssl_context is not None
    assert s.sasl["sasl_plain_username"] == "u" and s.sasl["sasl_plain_password"] == "p"
    assert _leftovers() == before  # the key material is not left on disk
    # A file named in the properties but absent from the Secret: named by its key, no temp path.
    del data["ca.pem"]
    with pytest.raises(ClientConfigError) as e:
        settings_from_secret(data, "client.properties", "Secret ns/s")
    msg = str(e.value)
    assert msg.startswith("Secret ns/s key client.properties: ssl.truststore.location: ca.pem")
    assert "kk-kafka-client-" not in msg
    assert _leftovers() == before


@pytest.mark.parametrize(
    ("data", "key", "needle"),
    [
        ({"other": b64("x=1")}, "client.properties", "has no key 'client.properties' (keys: other)"),
        ({"client.properties": "%%%"}, "client.properties", "key 'client.properties' is not valid base64"),
        ({"p": b64(b"\xff\xfe")}, "p", "key 'p' is not a UTF-8 properties file"),
        ({"p": b64("security.protocol=BOGUS\n")}, "p", "security.protocol: 'BOGUS'"),
        ({"p": b64("bootstrap.servers=x:1\n")}, "p", "bootstrap.servers: not supported"),
        ({"p": b64("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n")}, "p", "sasl.jaas.config"),
    ],
)
def test_settings_from_secret_refusals(data: dict[str, str], key: str, needle: str) -> None:
    with pytest.raises(ClientConfigError) as e:
        settings_from_secret(data, key, "Secret ns/s")
    assert needle in str(e.value)


def test_missing_schema_jar_is_reported_as_degraded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KRAFTKEEPER_KAFKA_CLIENTS_JAR", "/nonexistent/kafka-clients.jar")
    problem = schemas_problem()
    assert "KRAFTKEEPER_KAFKA_CLIENTS_JAR=/nonexistent/kafka-clients.jar" in problem

    def status(degraded: bool) -> ControllerStatus:
        conds = [Condition("Available", True, "QuorumAvailable"), Condition("Degraded", degraded, "X", "x")]
        return ControllerStatus(view=None, conditions=conds, recoveries=[])

    st = status(False)
    note_schemas_missing(st, problem)
    c = st.condition("Degraded")
    assert c.status and c.reason == "KafkaSchemasMissing" and problem in c.message
    assert "would not be healed" in c.message
    st = status(True)  # a Degraded that already says something is left as it is
    note_schemas_missing(st, problem)
    assert st.condition("Degraded").reason == "X"
    monkeypatch.delenv("KRAFTKEEPER_KAFKA_CLIENTS_JAR")
    monkeypatch.setenv("KRAFTKEEPER_KAFKA_LIBS", str(Path(__file__).parent))  # no jar there
    monkeypatch.setenv("KK_CACHE", "/nonexistent")
    monkeypatch.delenv("KAFKA_HOME", raising=False)
    assert "no kafka-clients jar found" in schemas_problem()
