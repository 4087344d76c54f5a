"""Apache Kafka controller pods replaced on the real kubelet
(``python -m bench.operator recovery --real --kafka``).

The three Kafka 4.x controllers of e2e/kafka-controllers.yaml (a StatefulSet with one
PersistentVolumeClaim each, SASL_SSL on the controller listener, image ``kraftkeeper-kafka`` from
``scripts/build-image.sh kafka``) and its KRaftQuorum ``kafka`` (``spec.kafka``, stabilisation 0,
order RemoveThenAdd) in the bench's namespace, with the chart's operator of
:mod:`bench.operator_real`. K times (``--recoveries``) a follower's ``kubectl delete pvc,pod``:
the StatefulSet brings the pod back on an empty volume, its entrypoint formats it as a new
directory (``--no-initial-controllers``), and the operator removes the old directory id and adds
the new one. Followers only, alternating: a controller that comes back empty while the others
still name its old self leader halts once (Kafka 4.4), and the kubelet's restart back-off would
then be what is measured.

Phases, from the delete:

Kubernetes' part: old pod gone, re-creation, volume, container start (as in
:mod:`bench.operator_real`: the claim bound -> the container's first log line);

the pod's own start, from the container's log (``kubectl logs --timestamps``, the runtime's clock):

* format: the entrypoint's first line -> its ``formatted`` line (``kafka-storage format`` in a
  JVM of its own);
* controller start: -> the controller's first fetch answered (its Raft log's ``High watermark
  set to ... for the first time``): the controller's JVM, its log, SASL_SSL to the leader;

the operator's part, from the recovery record in ``status.recoveries`` (its ``startedAt`` and the
``phaseSeconds`` offsets, all from the operator's clock, the host's):

* detection: first fetch -> ``startedAt`` (the Kafka daemon's next DescribeQuorum);
* remove: -> RemoveRaftVoter of the old directory id committed;
* add: -> AddRaftVoter of the new one committed (its retries included);
* total: the delete -> ``completedAt``.

The secrets (a CA and the controllers' key pair, the PLAIN credential, the operator's client
properties) are generated here, as tests/kubelet/test_kafka_pods.py does.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import tempfile
import time
import urllib.error
from contextlib import suppress
from pathlib import Path
from typing import Any

from kraftkeeper_reports.events import parse_ts_ms

from bench.kubenode import IMAGE, NS_LIVE, REPO, Kube, _node, install, node_cluster, recycle_pvs, uninstall
from quorum.security.pki import init_ca, issue_node
from quorum.timefmt import now_ms, parse_rfc3339
from testkit.polling import wait_until

KAFKA_IMAGE = os.environ.get("KK_KAFKA_IMAGE", "kraftkeeper-kafka:4.4.0")
MANIFEST = REPO / "e2e" / "kafka-controllers.yaml"
STS, KQ, USER = "kafka-controller", "kafka", "controller"
KUBE_PHASES = ("old pod gone", "re-creation", "volume", "container start")
POD_PHASES = ("format", "controller start")
OPERATOR_PHASES = ("detection", "remove", "add")
PHASES = (*KUBE_PHASES, *POD_PHASES, *OPERATOR_PHASES, "total")
TRANSIENT = (Exception,)


def manifest() -> str:
    """e2e/kafka-controllers.yaml for the bench's namespace and image."""
    text = MANIFEST.read_text().replace("kk-e2e", NS_LIVE)
    return text.replace("image: kraftkeeper:dev", f"image: {IMAGE}")


def _secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS_LIVE},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def secrets_for(work: Path) -> list[dict[str, Any]]:
    """The controllers' TLS key pair and PLAIN credential, and the operator's client settings."""
    ca = init_ca(work / "ca", "kafka-bench")
    domain = f"{STS}.{NS_LIVE}.svc"
    crt, key = issue_node(ca, 0, [f"*.{domain}.cluster.local", f"*.{domain}"])
    ca_pem = ca.cert_file.read_text()
    password = secrets.token_urlsafe(18)
    login = "org.apache.kafka.common.security.plain.PlainLoginModule required"
    client = (f"security.protocol=SASL_SSL\nssl.truststore.type=PEM\nssl.truststore.location=ca.pem\n"
              f"sasl.mechanism=PLAIN\nsasl.jaas.config={login} "
              f'username="{USER}" password="{password}";\n')
    return [
        _secret(f"{STS}-tls", {"keystore.pem": key.read_text() + crt.read_text() + ca_pem, "ca.pem": ca_pem}),
        _secret(f"{STS}-sasl", {"jaas": f'{login} username="{USER}" password="{password}" '
                                        f'user_{USER}="{password}";'}),
        _secret("kafka-client", {"client.properties": client, "ca.pem": ca_pem}),
    ]


def kafka_image() -> None:
    """scripts/build-image.sh kafka (cached) and the image imported into the node's containerd."""
    build = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), "kafka"], capture_output=True,
                           text=True, timeout=1800, env={**os.environ, "KK_KAFKA_IMAGE": KAFKA_IMAGE})
    if build.returncode != 0:
        raise RuntimeError(f"scripts/build-image.sh kafka: {build.stderr[-2000:]}")
    load = _node("load-image", KAFKA_IMAGE, timeout=600)
    if load.returncode != 0:
        raise RuntimeError(f"k8s-node.sh load-image {KAFKA_IMAGE}: {load.stderr[-2000:]}")


def kq_status(k: Kube) -> dict[str, Any]:
    obj = k.get(f"/apis/kraftkeeper.io/v1alpha1/namespaces/{NS_LIVE}/kraftquorums/{KQ}")
    return obj.get("status") or {}


def available(k: Kube) -> dict[str, Any] | None:
    st = kq_status(k)
    conds = {c.get("type"): c.get("status") for c in st.get("conditions") or []}
    vs = st.get("voters") or []
    ok = conds.get("Available") == "True" and len(vs) == 3 and all(v.get("uuid") for v in vs)
    return st if ok and st.get("leaderId", -1) >= 0 else None


def formed(k: Kube) -> bool:
    with suppress(urllib.error.HTTPError):
        cm = k.get(f"/api/v1/namespaces/{NS_LIVE}/configmaps/{STS}-formed")
        return bool((cm.get("data") or {}).get("formed-at"))
    return False


def setup(k: Kube, work: Path) -> None:
    k.kubectl("apply", "-f", "-", stdin="\n---\n".join(json.dumps(o) for o in secrets_for(work)))
    k.kubectl("apply", "-n", NS_LIVE, "-f", "-", stdin=manifest())
    wait_until("KRaftQuorum kafka Available with 3 voters", lambda: available(k), timeout=600, interval=1.0,
               errors=TRANSIENT)
    wait_until(f"ConfigMap {STS}-formed (the format-mode Job)", lambda: formed(k), timeout=300, interval=1.0,
               errors=TRANSIENT)


def log_marks(k: Kube, pod: str) -> tuple[int, int, int]:
    """Host-clock ms of the container's first log line, the entrypoint's ``formatted`` line and
    the controller's first answered fetch."""
    out = k.kubectl("logs", "-n", NS_LIVE, pod, "--timestamps")
    marks = [(parse_ts_ms(ln.split(" ", 1)[0]), ln) for ln in out.splitlines() if " " in ln]
    lines = [(t, text) for t, text in marks if t is not None]
    formatted = next(t for t, text in lines if "kafka-entrypoint:" in text and " formatted, " in text)
    fetched = next(t for t, text in lines if "High watermark set to" in text and "for the first time" in text)
    return lines[0][0], formatted, fetched


def one_replacement(k: Kube, i: int) -> dict[str, float]:
    st = wait_until("KRaftQuorum kafka Available", lambda: available(k), timeout=300, interval=0.5,
                    errors=TRANSIENT)
    leader = int(st["leaderId"])
    victim = [n for n in range(3) if n != leader][i % 2]
    old = next(str(v["uuid"]) for v in st["voters"] if int(v["id"]) == victim)
    recycle_pvs(k)
    pod_name, pvc_name = f"{STS}-{victim}", f"data-{STS}-{victim}"
    old_pod = k.get(f"/api/v1/namespaces/{NS_LIVE}/pods/{pod_name}")["metadata"]["uid"]
    old_pvc = k.get(f"/api/v1/namespaces/{NS_LIVE}/persistentvolumeclaims/{pvc_name}")["metadata"]["uid"]
    seen: dict[str, int] = {}
    t0 = now_ms()
    k.kubectl("delete", "-n", NS_LIVE, f"pvc/{pvc_name}", f"pod/{pod_name}", "--wait=false")

    def step() -> dict[str, Any] | None:
        t = now_ms()
        if "pod" not in seen:
            try:
                p = k.get(f"/api/v1/namespaces/{NS_LIVE}/pods/{pod_name}")
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    seen.setdefault("gone", t)
            else:
                if p["metadata"]["uid"] != old_pod:
                    seen.setdefault("gone", t)
                    seen["pod"] = t
        elif "bound" not in seen:
            c = k.get(f"/api/v1/namespaces/{NS_LIVE}/persistentvolumeclaims/{pvc_name}")
            if c["metadata"]["uid"] != old_pvc and c.get("status", {}).get("phase") == "Bound":
                seen["bound"] = t
        else:
            for r in kq_status(k).get("recoveries") or []:
                ours = r.get("replicaId") == victim and r.get("oldUuid") == old
                if ours and r.get("result") == "Succeeded":
                    return dict(r)
        return None

    rec = wait_until(f"Kafka replacement {i + 1} Succeeded", step, timeout=600, interval=0.05,
                     errors=TRANSIENT)
    started, formatted, fetched = log_marks(k, pod_name)
    detected = parse_rfc3339(str(rec["startedAt"]))
    ph = rec.get("phaseSeconds") or {}
    removed = detected + round(1000 * float(ph.get("atRemoveCommitted", 0.0)))
    return {
        "old pod gone": (seen["gone"] - t0) / 1000,
        "re-creation": (seen["pod"] - seen["gone"]) / 1000,
        "volume": (seen["bound"] - seen["pod"]) / 1000,
        "container start": (started - seen["bound"]) / 1000,
        "format": (formatted - started) / 1000,
        "controller start": (fetched - formatted) / 1000,
        "detection": (detected - fetched) / 1000,
        "remove": (removed - detected) / 1000,
        "add": float(ph.get("atAddCommitted", 0.0)) - float(ph.get("atRemoveCommitted", 0.0)),
        "total": (parse_rfc3339(str(rec["completedAt"])) - t0) / 1000,
    }


def run(recoveries: int) -> dict[str, list[float]]:
    rows: dict[str, list[float]] = {p: [] for p in PHASES}
    with node_cluster() as k, tempfile.TemporaryDirectory(prefix="kk-bench-kafka-") as work:
        try:
            kafka_image()
            install(k)
            recycle_pvs(k)
            t = time.monotonic()
            setup(k, Path(work))
            print(f"  Kafka controllers formed and Available in {time.monotonic() - t:.1f} s", flush=True)
            for i in range(recoveries):
                row = one_replacement(k, i)
                for p in PHASES:
                    rows[p].append(row[p])
                print(f"  Kafka replacement {i + 1}/{recoveries}: "
                      + ", ".join(f"{p} {row[p]:.2f}" for p in PHASES), flush=True)
        finally:
            k.kubectl("delete", "-n", NS_LIVE, "-f", "-", "--ignore-not-found", "--wait=false",
                      stdin=manifest(), check=False)
            uninstall(k)
    return rows
