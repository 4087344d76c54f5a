"""Apache Kafka 4.x controllers as pods on the real single-node cluster, healed by the operator.

Three controllers run as a StatefulSet with one PersistentVolumeClaim each (e2e/kafka-controllers.yaml,
image kraftkeeper-kafka from `scripts/build-image.sh kafka`), SASL_SSL on their listener with a
CA, key pair and PLAIN credentials generated here into Secrets, and a KRaftQuorum whose
``spec.kafka`` points at them. The operator (the chart's pod) runs none of them.

A follower's pod and PVC are deleted (``kubectl delete pvc,pod``): the StatefulSet brings the pod
back on an empty volume, its entrypoint formats it with ``--no-initial-controllers`` (the
ConfigMap's format mode was switched to ``join`` by the manifest's Job once every controller was
Ready, with no step of the test's), so the controller
comes back as an observer with a NEW directory id; the operator removes the old directory id and
adds the new one with no human step. The test prints the time from the delete to the Succeeded
recovery, and checks: three voters, the new directory id (the one in the new volume's
meta.properties) for the replaced controller, and a record written before the replacement (a
cluster-wide config record, through the controllers' SASL_SSL listener) present in the new
controller's metadata log.

A follower rather than the leader: a controller that comes back empty while the survivors still
name its old self leader halts once (Kafka 4.4, see kraftkeeper_operator.kafka.cluster) and the
kubelet's restart back-off would then dominate the time measured.
"""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from quorum.kafka.mapping import base64_to_uuid
from quorum.timefmt import parse_rfc3339
from tests.kafka.test_kafka_security import make_pki
from tests.kubelet.conftest import OPERATOR_NS, QUORUM_NS, REPO, NodeCluster, _node, quorum_available

pytestmark = [pytest.mark.k8s, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1200)]

KAFKA_IMAGE = "kraftkeeper-kafka:4.4.0"
MANIFEST = REPO / "e2e" / "kafka-controllers.yaml"
STS = "kafka-controller"
KQ = "kafka"
SERVICE_DOMAIN = f"{STS}.{QUORUM_NS}.svc"
USER = "controller"


def host(i: int) -> str:
    return f"{STS}-{i}.{SERVICE_DOMAIN}.cluster.local"


def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


@pytest.fixture(scope="package")
def kafka_image(node_cluster: NodeCluster, kk_image: str) -> str:
    """scripts/build-image.sh kafka (the JRE base and the image, both cached), imported into the
    node's containerd. After kk_image: its Docker engine is running."""
    build = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), "kafka"], capture_output=True,
                           text=True, timeout=1800)
    assert build.returncode == 0, f"scripts/build-image.sh kafka failed:\n{build.stderr[-6000:]}"
    load = _node("load-image", KAFKA_IMAGE, timeout=600)
    assert load.returncode == 0, f"importing {KAFKA_IMAGE} into containerd failed:\n{load.stderr[-4000:]}"
    return KAFKA_IMAGE


def client_props(ca_pem: str, password: str) -> dict[str, str]:
    return {
        "security.protocol": "SASL_SSL",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.certificates": ca_pem,
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
                            f'username="{USER}" password="{password}";',
    }


def describe(c: NodeCluster) -> str:
    parts = []
    for args in (("get", "pods,pvc", "-n", QUORUM_NS, "-l", f"app.kubernetes.io/name={STS}", "-o", "wide"),
                 ("get", "kraftquorum", KQ, "-n", QUORUM_NS, "-o", "yaml"),
                 *[("logs", "-n", QUORUM_NS, f"{STS}-{i}", "--tail=15") for i in range(3)],
                 ("logs", "-n", OPERATOR_NS, "deploy/kraftkeeper", "--tail=40")):
        p = c.kubectl(*args, check=False)
        parts.append(f"$ kubectl {' '.join(args)}\n{p.stdout[-5000:]}{p.stderr[-1000:]}")
    return "\n".join(parts)


@pytest.fixture
def kafka_quorum(node_cluster: NodeCluster, operator_release: str, kafka_image: str, tmp_path: Path
                 ) -> Iterator[dict[str, str]]:
    """The controllers formed (three voters in the KRaftQuorum's status), the format mode then
    switched to join by the manifest's Job; everything deleted afterwards. Yields the client settings."""
    c = node_cluster
    ns = QUORUM_NS
    ca, keystore = make_pki(tmp_path, dns_names=(f"*.{SERVICE_DOMAIN}.cluster.local", f"*.{SERVICE_DOMAIN}"),
                            ips=())
    password = secrets.token_urlsafe(18)
    jaas = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{USER}" password="{password}" user_{USER}="{password}";')
    props = client_props(ca.read_text(), password)
    client_file = "".join(f"{k}={v}\n" for k, v in props.items() if k != "ssl.truststore.certificates")
    client_file += "ssl.truststore.location=ca.pem\n"
    objs = [secret(f"{STS}-tls", {"keystore.pem": keystore.read_text(), "ca.pem": ca.read_text()}),
            secret(f"{STS}-sasl", {"jaas": jaas}),
            secret("kafka-client", {"client.properties": client_file, "ca.pem": ca.read_text()})]
    c.kubectl("apply", "-n", ns, "-f", "-", stdin="\n---\n".join(json.dumps(o) for o in objs))
    c.kubectl("apply", "-n", ns, "-f", str(MANIFEST))
    try:
        c.wait_for("KRaftQuorum kafka Available with 3 voters",
                   lambda: quorum_available(c, ns, KQ), timeout=300, context=lambda: describe(c))
        # Formed: every empty volume from now on is a replaced disk and joins with a new id. The
        # manifest's Job marks the formation by itself once every controller is Ready.
        c.wait_for("the format-mode Job created the ConfigMap kafka-controller-formed",
                   lambda: ((c.get_json("configmap", f"{STS}-formed", "-n", ns) or {}).get("data") or {})
                   .get("formed-at"), timeout=120, context=lambda: describe(c))
        # Re-applied as a user would after the formation: format-mode is "bootstrap" in the file
        # again, and the replaced disk below must still join with a new directory id.
        c.kubectl("apply", "-n", ns, "-f", str(MANIFEST))
        yield props
    finally:
        c.kubectl("delete", "-n", ns, "-f", str(MANIFEST), "--ignore-not-found", "--wait=false", check=False)
        c.kubectl("delete", "-n", ns, "secret", f"{STS}-tls", f"{STS}-sasl", "kafka-client",
                  "--ignore-not-found", check=False)
        c.kubectl("delete", "-n", ns, "pvc", "-l", f"app.kubernetes.io/name={STS}", "--ignore-not-found",
                  "--wait=false", check=False)
        c.kubectl("delete", "-n", ns, "configmap", f"{STS}-formed", "--ignore-not-found", check=False)


# Run with the operator image's Python (kubectl exec into the operator's pod, which reaches the
# controllers by their cluster DNS names): a cluster-wide broker config (resource type BROKER,
# empty name) set with IncrementalAlterConfigs on the active controller; prints the error codes.
WRITE_CONFIG = """
import asyncio, json, sys
from kafka.protocol.admin import IncrementalAlterConfigsRequest as R, IncrementalAlterConfigsResponse
from kraftkeeper_operator.kafka.clientconf import ClientSettings
from kraftkeeper_operator.kafka.wire import KafkaConnection, register_response
a = json.loads(sys.argv[1])
register_response(R, IncrementalAlterConfigsResponse)
async def main():
    out = {}
    for h in a["hosts"]:
        c = await KafkaConnection.open(h, 9093, ClientSettings.from_dict(a["props"]))
        try:
            cfg = R.AlterConfigsResource.AlterableConfig(name=a["name"], config_operation=0, value=a["value"])
            req = R(resources=[R.AlterConfigsResource(resource_type=4, resource_name="", configs=[cfg])],
                    validate_only=False)
            resp = await c.request(req, c.version_for(44, 0, 1), 30)
            out[h] = [[r.error_code, r.error_message] for r in resp.responses]
        finally:
            await c.close()
        if all(e == 0 for e, _ in out[h]):
            break
    print(json.dumps(out))
asyncio.run(main())
"""


def write_config_record(c: NodeCluster, props: dict[str, str], leader: int, value: str) -> None:
    hosts = [host(leader)] + [host(i) for i in range(3) if i != leader]
    arg = json.dumps({"hosts": hosts, "props": props, "name": "log.retention.ms", "value": value})
    p = c.kubectl("exec", "-i", "-n", OPERATOR_NS, "deploy/kraftkeeper", "--", "python", "-", arg,
                  stdin=WRITE_CONFIG, timeout=120)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert any(all(e == 0 for e, _ in r) for r in out.values()), f"IncrementalAlterConfigs failed: {out}"


def meta_directory_id(c: NodeCluster, pod: str) -> str | None:
    p = c.kubectl("exec", "-n", QUORUM_NS, pod, "--", "cat", "/var/lib/kafka/data/meta.properties",
                  check=False)
    for line in p.stdout.splitlines():
        if line.startswith("directory.id="):
            return str(base64_to_uuid(line.split("=", 1)[1].strip()))
    return None


def _at(stamp: str) -> float:
    return parse_rfc3339(stamp) / 1000


def pod_phases(c: NodeCluster, pod: str, wall0: float) -> str:
    """Where the time went, seconds after the delete: the new pod created and its container started
    (the API's whole seconds), the volume formatted and the controller started (the entrypoint's
    milliseconds)."""
    obj = c.get_json("pod", pod, "-n", QUORUM_NS) or {}
    started = (((obj.get("status") or {}).get("containerStatuses") or [{}])[0].get("state") or {})
    marks = [("pod created", obj.get("metadata", {}).get("creationTimestamp")),
             ("container started", (started.get("running") or {}).get("startedAt"))]
    logs = c.kubectl("logs", "-n", QUORUM_NS, pod, check=False).stdout.splitlines()
    for what, needle in (("formatting", "empty volume, formatting"), ("formatted", " formatted, ")):
        line = next((ln for ln in logs if ln.startswith("kafka-entrypoint:") and needle in ln), "")
        marks.append((what, line.split()[1] if line else None))
    return ", ".join(f"{what} +{_at(t) - wall0:.1f} s" for what, t in marks if t)


def test_kafka_controller_pod_replaced_and_healed(node_cluster: NodeCluster, kafka_quorum: dict[str, str]
                                                  ) -> None:
    c = node_cluster
    ns = QUORUM_NS
    st = c.wait_for("KRaftQuorum kafka Available", lambda: quorum_available(c, ns, KQ), timeout=120)
    before = {v["id"]: v["uuid"] for v in st["voters"]}
    assert set(before) == {0, 1, 2}, st["voters"]
    # Bootstrapped with the ConfigMap's pre-assigned directory ids.
    cm = next(d for d in yaml.safe_load_all(MANIFEST.read_text()) if d["kind"] == "ConfigMap")
    initial = cm["data"]["initial-controllers"]
    assert set(before.values()) == {str(base64_to_uuid(x.rsplit(":", 1)[1])) for x in initial.split(",")}
    marker = str(86_400_000 + secrets.randbelow(10**9))
    write_config_record(c, kafka_quorum, st["leaderId"], marker)

    victim = next(i for i in (2, 1, 0) if i != st["leaderId"])
    pod = f"{STS}-{victim}"
    old = before[victim]
    t0, wall0 = time.monotonic(), time.time()
    c.kubectl("delete", "pvc", f"data-{pod}", "-n", ns, "--wait=false")
    c.kubectl("delete", "pod", pod, "-n", ns, "--wait=false")

    def healed() -> dict[str, Any] | None:
        s = quorum_available(c, ns, KQ)
        if s is None:
            return None
        now = {v["id"]: v["uuid"] for v in s["voters"]}
        done = [r for r in s.get("recoveries") or [] if r.get("replicaId") == victim
                and r.get("oldUuid") == old and r.get("result") == "Succeeded"]
        return s if done and now.get(victim) not in (None, old) else None

    s = c.wait_for(f"{pod} replaced and healed", healed, timeout=300, interval=0.25,
                   context=lambda: describe(c))
    took = time.monotonic() - t0
    voters = {v["id"]: v["uuid"] for v in s["voters"]}
    new = voters[victim]
    rec = next(r for r in s["recoveries"] if r.get("newUuid") == new)
    print(f"\nKafka controller pod {pod}: `kubectl delete pvc,pod` to recovery Succeeded in {took:.2f} s; "
          f"{pod_phases(c, pod, wall0)}; the operator's swap {rec.get('phaseSeconds', {}).get('total')} s "
          f"(RemoveRaftVoter {rec.get('phaseSeconds', {}).get('removeVoter')} s, "
          f"AddRaftVoter {rec.get('phaseSeconds', {}).get('addVoter')} s with its retries)")
    assert set(voters) == {0, 1, 2} and len(s["voters"]) == 3, s["voters"]
    others = {i for i in voters if i != victim}
    assert {i: voters[i] for i in others} == {i: before[i] for i in others}
    assert new != old and new not in before.values()
    assert rec["result"] == "Succeeded" and rec["oldUuid"] == old and rec["replicaId"] == victim, rec
    # The new volume was formatted as a new directory: its meta.properties names the new voter.
    assert meta_directory_id(c, pod) == new
    # The record written before the replacement is on the new, once empty, disk.
    got = c.kubectl("exec", "-n", ns, pod, "--", "grep", "-rlF", marker,
                    "/var/lib/kafka/data/__cluster_metadata-0", check=False)
    assert got.returncode == 0 and got.stdout.strip(), f"config record {marker} not in {pod}'s metadata log"
