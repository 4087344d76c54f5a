"""The Kafka backend's pure parts, without a JVM: client properties, directory-id forms, error
mapping, bootstrap lists, message classes generated from the cached jar, and the watch command's
refusals of bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.core.policy import Order
from kraftkeeper_operator.core.records import Action, ActionKind, Recovery, record_finished
from kraftkeeper_operator.core.recovery import Phase
from kraftkeeper_operator.kafka.backend import parse_bootstrap
from kraftkeeper_operator.kafka.clientconf import ClientConfigError, ClientSettings, parse_client_properties
from kraftkeeper_operator.kafka.watch import records_from_event_log

from quorum.kafka.listener import parse_listen
from quorum.kafka.mapping import base64_to_uuid, dir_id_to_uuid, kafka_error, uuid_to_base64
from quorum.kafka.schemas import membership_messages
from quorum.security.nodetls import is_loopback_host as is_loopback
from quorum.types import ErrorCode, KraftError
from tests.kafka import conftest


def test_directory_id_forms_round_trip() -> None:
    u = uuid.uuid4()
    b = uuid_to_base64(str(u))
    assert len(b) == 22 and "=" not in b
    assert base64_to_uuid(b) == u
    assert dir_id_to_uuid(u) == str(u)
    assert dir_id_to_uuid(b) == str(u)
    assert dir_id_to_uuid(uuid.UUID(int=0)) == ""  # Kafka's ZERO_UUID: not known
    assert dir_id_to_uuid(None) == ""
    # A value Kafka printed in this project's tests: "hmOAs2BoQpKl3THQJP-ZAw".
    assert base64_to_uuid("hmOAs2BoQpKl3THQJP-ZAw") == uuid.UUID("866380b3-6068-4292-a5dd-31d024ff9903")
    with pytest.raises(ValueError, match="not a Kafka directory id"):
        base64_to_uuid("abc")


def test_kafka_errors_map_onto_the_controller_rules() -> None:
    assert kafka_error(6, None, "x").code is ErrorCode.NOT_LEADER
    assert kafka_error(7, "busy", "x").code is ErrorCode.REQUEST_TIMED_OUT
    assert kafka_error(127, None, "x").code is ErrorCode.VOTER_ALREADY_REMOVED
    assert kafka_error(126, None, "x").extra["kafka_error"] == "DUPLICATE_VOTER"
    assert kafka_error(35, None, "x").code is ErrorCode.UNSUPPORTED
    assert kafka_error(31, None, "x").code is ErrorCode.PERMISSION_DENIED
    e = kafka_error(9999, "odd", "AddRaftVoter(3, u)")
    assert e.code is ErrorCode.UNKNOWN_SERVER_ERROR and "KAFKA_ERROR_9999" in e.message and "odd" in e.message


def test_add_after_remove_retries_every_second_while_others_back_off() -> None:
    """RemoveThenAdd between its steps (Kafka's order): the quorum is one voter short, and the
    AddRaftVoter's usual failure (the leader cannot reach the new controller yet) clears by
    itself, so it is retried every second; any other retryable failure still doubles."""
    def retries(rec: Recovery, kind: ActionKind) -> list[int]:
        out = []
        for now in (10_000, 20_000, 30_000, 40_000, 50_000):
            action = Action(kind, 2, "n", rec.recovery_id)
            record_finished(rec, action, "REQUEST_TIMED_OUT", now, "", Order.REMOVE_THEN_ADD)
            assert rec.retry_at_ms is not None
            out.append(rec.retry_at_ms - now)
        return out

    removed = Recovery("r1", 2, "o", "n", Phase.REMOVED, 0, remove_started_ms=1, remove_committed_ms=2)
    assert retries(removed, ActionKind.ADD_VOTER) == [1000] * 5
    assert removed.phase is Phase.REMOVED and removed.attempts == 5
    # The removal itself, and an AddVoter with the old voter still in place, back off as before.
    assert retries(Recovery("r2", 2, "o", "n", Phase.CAUGHT_UP, 0), ActionKind.REMOVE_VOTER) == [
        1000, 2000, 4000, 8000, 16000]
    assert retries(Recovery("r3", 2, "o", "n", Phase.CAUGHT_UP, 0), ActionKind.ADD_VOTER) == [
        1000, 2000, 4000, 8000, 16000]
    # A refusal still fails the recovery at once, retry or not.
    record_finished(removed, Action(ActionKind.ADD_VOTER, 2, "n", "r1"), "INVALID_REQUEST", 60_000, "no",
                    Order.REMOVE_THEN_ADD)
    assert removed.phase is Phase.FAILED


def test_daemon_describes_often_only_while_a_voter_recently_went_quiet() -> None:
    """The Kafka daemon's fast polling (kafkaquorums.py): a follower silent for more than a
    second but less than QUIET_FOR_S; never for the leader, a fetching voter or one long gone."""
    from kraftkeeper_operator.core.view import QuorumView, Replica
    from kraftkeeper_operator.k8s.kafkaquorums import QUIET_FOR_S, voter_recently_quiet

    now = 1_800_000_000_000

    def view(*fetched_ago_ms: int) -> QuorumView:
        voters = tuple(Replica(i, f"u{i}", last_fetch_ms=now - ago if ago >= 0 else -1)
                       for i, ago in enumerate(fetched_ago_ms))
        return QuorumView(leader_id=0, leader_epoch=1, high_watermark=5, voters=voters, observers=())

    assert voter_recently_quiet(view(0, 100, 2_000), now)
    assert not voter_recently_quiet(view(0, 100, 400), now)  # everyone fetching
    assert not voter_recently_quiet(view(5_000, 100, 300), now)  # the leader's own entry never counts
    assert not voter_recently_quiet(view(0, 100, int(QUIET_FOR_S * 1000) + 1), now)  # gone for long
    assert not voter_recently_quiet(view(0, 100, -1), now)  # never fetched: nothing to wait for
    assert not voter_recently_quiet(None, now)


def test_bootstrap_list_is_validated() -> None:
    assert parse_bootstrap("a:1, b:2") == [("a", 1), ("b", 2)]
    assert parse_bootstrap("[::1]:9093") == [("::1", 9093)]
    for bad in ("", "host", "host:0", "host:x", ":9093"):
        with pytest.raises(ValueError, match="kafka-bootstrap-controllers"):
            parse_bootstrap(bad)


def test_client_properties(tmp_path: Path) -> None:
    text = (
        "# comment\n"
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '    username="admin" password="s3cr=t";\n'
    )
    assert parse_client_properties(text, "t")["sasl.mechanism"] == "SCRAM-SHA-512"
    f = tmp_path / "client.properties"
    f.write_text(text)
    s = ClientSettings.from_properties(f)
    assert s.security_protocol == "SASL_PLAINTEXT" and s.ssl_context is None
    assert s.sasl["sasl_plain_username"] == "admin" and s.sasl["sasl_plain_password"] == "s3cr=t"


@pytest.mark.parametrize(
    ("props", "names"),
    [
        (
            {"security.protocol": "SSL", "ssl.truststore.location": "x.jks", "ssl.truststore.type": "JKS"},
            "ssl.truststore.type",
        ),
        (
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI", "sasl.jaas.config": "a required;"},
            "sasl.mechanism",
        ),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}, "sasl.jaas.config"),
        ({"security.protocol": "BOGUS"}, "security.protocol"),
        ({"ssl.truststore.location": "/ca.pem"}, "security.protocol is PLAINTEXT"),
        ({"bootstrap.servers": "x:1"}, "bootstrap.servers"),
        (
            {"security.protocol": "SSL", "ssl.truststore.location": "/nonexistent/ca.pem"},
            "ssl.truststore.location",
        ),
    ],
)
def test_client_properties_refused_with_the_name(props: dict[str, str], names: str) -> None:
    with pytest.raises(ClientConfigError, match=names.replace(".", r"\.")):
        ClientSettings.from_dict(props)


def test_missing_properties_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ClientConfigError, match="kafka-client-config"):
        ClientSettings.from_properties(tmp_path / "nope.properties")


def test_membership_messages_come_from_the_jar(kafka_jars: Path) -> None:
    msgs = membership_messages()
    add = msgs["AddRaftVoterRequest"]
    assert add.API_KEY == 80 and add.max_version >= 1
    assert msgs["RemoveRaftVoterRequest"].API_KEY == 81
    u = uuid.uuid4()
    req = add(
        cluster_id="c",
        timeout_ms=1000,
        voter_id=3,
        voter_directory_id=u,
        listeners=[add.Listener(name="CONTROLLER", host="127.0.0.1", port=9093)],
        ack_when_committed=True,
    )
    back = add.decode(req.encode(version=1), version=1)
    assert back.voter_id == 3 and back.voter_directory_id == u and back.listeners[0].port == 9093


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--events", "E"], "--kafka-bootstrap-controllers"),
        (
            ["--kafka-bootstrap-servers", "b:1", "--kafka-bootstrap-controllers", "c:1", "--events", "E"],
            "not allowed",
        ),
        (
            ["--kafka-bootstrap-servers", "b", "--events", "E"],
            "--kafka-bootstrap-servers: 'b' is not HOST:PORT",
        ),
        (["--kafka-bootstrap-controllers", "nohost", "--events", "E"], "not HOST:PORT"),
        (["--kafka-bootstrap-controllers", "h:1", "--events", "E", "--order", "Sideways"], "--order"),
        (
            ["--kafka-bootstrap-controllers", "h:1", "--events", "E", "--stabilization-seconds", "-1"],
            "stabilizationSeconds",
        ),
        (
            ["--kafka-bootstrap-controllers", "h:1", "--events", "E", "--kafka-client-config", "/nope"],
            "/nope",
        ),
    ],
)
def test_watch_refuses_bad_input(tmp_path: Path, args: list[str], needle: str) -> None:
    args = [a.replace("E", str(tmp_path / "ev")) if a == "E" else a for a in args]
    out = subprocess.run(
        [sys.executable, "-m", "quorum.cli", "operator", "watch", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("INVALID_REQUEST:") and needle in last, out.stderr


def test_kafka_listener_stays_on_loopback_unless_insecure() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "quorum.kafka", "--listen", "0.0.0.0:0", "--bootstrap", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("INVALID_REQUEST:") and "loopback" in last, out.stderr
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("kafka.example")
    with pytest.raises(KraftError, match="expected HOST:PORT"):
        parse_listen("nohost")


def test_records_from_event_log(tmp_path: Path) -> None:
    def ev(
        t: str, rid: str, replica: int = 3, cluster: str = "c", ts: str = "2026-01-01T00:00:00.000Z"
    ) -> str:
        return json.dumps(
            {
                "schema_version": 1,
                "ts": ts,
                "cluster": cluster,
                "recovery_id": rid,
                "type": t,
                "replica_id": replica,
                "old_uuid": f"old-{rid}",
                "new_uuid": f"new-{rid}",
                "leader_id": 1,
                "leader_epoch": 2,
                "detail": {},
            }
        )

    day = tmp_path / "date=2026-01-01"
    day.mkdir()
    lines = [
        ev("disk_replacement_detected", "a"),
        ev("remove_voter_committed", "a"),
        ev("add_voter_committed", "a"),
        ev("recovery_completed", "a", ts="2026-01-01T00:00:05.000Z"),
        ev("disk_replacement_detected", "b", 2),
        ev("remove_voter_committed", "b", 2),
        ev("disk_replacement_detected", "f"),
        ev("recovery_failed", "f"),
        ev("recovery_completed", "x", cluster="other"),
        "{not json",
    ]
    (day / "events-c.jsonl").write_text("\n".join(lines) + "\n")
    recs = {r.recovery_id: r for r in records_from_event_log(tmp_path, "c")}
    assert set(recs) == {"a", "b"}
    assert recs["a"].phase is Phase.COMPLETED and recs["a"].old_uuid == "old-a" and recs["a"].finished_ms
    assert recs["b"].phase is Phase.REMOVED and recs["b"].replica_id == 2 and recs["b"].remove_committed_ms


def test_schemas_only_jar_serves_the_membership_messages(kafka_jars: Path, tmp_path: Path) -> None:
    """What scripts/build-image.sh puts in the image: common/message/*.json alone, found through
    KRAFTKEEPER_KAFKA_LIBS with no Kafka installation or cache to fall back on."""
    source = sorted(kafka_jars.glob("kafka-clients-*.jar"))[-1]
    libs = tmp_path / "libs"
    out = subprocess.run(
        [sys.executable, "-m", "quorum.kafka.schemas", "write-jar", str(source),
         str(libs / "kafka-clients-x-schemas.jar")],
        capture_output=True, text=True, check=True,
    )
    assert "Kafka message schemas" in out.stdout
    small = libs / "kafka-clients-x-schemas.jar"
    assert small.stat().st_size < source.stat().st_size // 5
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_HOME", "KRAFTKEEPER_KAFKA_CLIENTS_JAR")}
    env.update(KRAFTKEEPER_KAFKA_LIBS=str(libs), KK_CACHE=str(tmp_path / "empty-cache"))
    probe = (
        "from quorum.kafka.schemas import find_clients_jar, membership_messages\n"
        "m = membership_messages()['RemoveRaftVoterRequest']\n"
        "r = m(cluster_id='c', voter_id=2, voter_directory_id=__import__('uuid').uuid4())\n"
        "print(find_clients_jar().name, m.decode(r.encode(version=0), version=0).voter_id)\n"
    )
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert got.stdout.split() == ["kafka-clients-x-schemas.jar", "2"]


def test_schema_jar_refuses_a_jar_without_membership_schemas(tmp_path: Path) -> None:
    old = tmp_path / "kafka-clients-3.0.0.jar"
    with zipfile.ZipFile(old, "w") as z:
        z.writestr("common/message/FetchRequest.json", "{}")
    got = subprocess.run(
        [sys.executable, "-m", "quorum.kafka.schemas", "write-jar", str(old), str(tmp_path / "out.jar")],
        capture_output=True, text=True,
    )
    assert got.returncode == 1
    assert "AddRaftVoterRequest.json" in got.stderr and "older than 3.9" in got.stderr
    assert not (tmp_path / "out.jar").exists()


def test_no_jvm_skips_the_real_kafka_tests_only_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest.shutil, "which", lambda _name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no Java runtime"):
        conftest._libs()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        conftest._libs()


@pytest.mark.parametrize(
    ("props", "message"),
    [
        # Every unknown property is refused, the first by name, before any other rule.
        ({"security.protocol": "BOGUS", "bootstrap.servers": "x:1", "acks": "1"}, "acks: not supported"),
        # Strict: a property's value is the file's string, nothing else is coerced into one.
        ({"client.id": 5}, "client.id: must be a string, got 5"),
        # Names Kafka reads case-insensitively are read so here too; the refusal shows them as read.
        ({"security.protocol": "ssl2"}, "security.protocol: 'SSL2' is not PLAINTEXT, SSL"),
        ({"request.timeout.ms": "1.5"}, "request.timeout.ms: '1.5' is not a whole number of milliseconds"),
        (
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "plain", "sasl.jaas.config": "junk"},
            "sasl.jaas.config: cannot parse 'junk'",
        ),
        ({"ssl.keystore.key": "k"}, "ssl.keystore.key: ssl.* settings given but security.protocol is"),
    ],
)
def test_client_properties_model_names_the_property(props: dict[str, Any], message: str) -> None:
    with pytest.raises(ClientConfigError) as e:
        ClientSettings.from_dict(props)
    assert str(e.value).startswith(message), str(e.value)


def test_client_properties_model_accepts_kafka_spellings() -> None:
    jaas = 'x.ScramLoginModule required username="u" password="p";'
    s = ClientSettings.from_dict(
        {"security.protocol": "sasl_plaintext", "sasl.mechanism": "scram-sha-256", "sasl.jaas.config": jaas}
    )
    assert (s.security_protocol, s.sasl["sasl_mechanism"]) == ("SASL_PLAINTEXT", "SCRAM-SHA-256")
