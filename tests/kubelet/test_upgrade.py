"""An existing quorum upgraded in place on the real single-node cluster.

The old product is the image built from an older revision of this repository (``OLD_REV``, exported
by :mod:`testkit.revision` and built by that revision's own scripts/build-image.sh): its operator
issues node certificates that name no storage UUID. It is installed as a user did then (its chart,
``helm install``; a KRaftQuorum with no ``spec.image``, so the quorum runs the operator's image) in
namespaces of its own (release ``kk-upgrade``: the package's operator in ``kraftkeeper-system``
keeps managing ``kk-e2e``). Then, under continuous writes from a client pod, the upgrade a user
makes (docs/operator.md "Install" and "**Upgrades.**"): the CRD applied from the new ``crds/``,
``helm upgrade`` to the new chart and image. The StatefulSet rolls the pods to the new image one at
a time, then the new operator's rotation re-issues each unbound certificate naming its replica's
storage UUID and restarts the pods one at a time again. Checked: never more than one quorum pod
unready, writes acknowledged during the upgrade, every acknowledged write reads back, the voter set
keeps its storage UUIDs, and every node serves a certificate naming its replica's disk.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from quorum.security.pki import identity_from_cert
from testkit.revision import BaselineTree, export_tree
from tests.kubelet.conftest import (
    CLIENT_CONFIG,
    CLIENT_POD,
    DOCKER,
    QUORUM,
    REPO,
    NodeCluster,
    _node,
    pod_ready,
    quorum_available,
    quorum_pods,
    secret_data,
)
from tests.kubelet.test_e2e import Writer, read_back, voter_uuids

pytestmark = [pytest.mark.k8s, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

# main right before node certificates named their storage UUID: the first parent of the merge
# that bound them ("Merge identity: node certificates bound to their disk, ..."), found with
# `git log --first-parent -S 'storage=' -- operator quorum`.
OLD_REV = "1e31dcc6f50e5f17bdaece1bfa0f5abbdff2e4d2"
OLD_IMAGE = f"kraftkeeper:upgrade-from-{OLD_REV[:7]}"
RELEASE = "kk-upgrade"
OP_NS = "kk-upgrade-system"
UP_NS = "kk-upgrade"
DEPLOYMENT = f"{RELEASE}-kraftkeeper"  # the chart's full name for this release
BOOT = f"{QUORUM}.{UP_NS}.svc:9093"
VERSION_TAG = "kraftkeeper:0.1.0"  # build-image.sh also tags the version: put back afterwards

# Runs in the client pod: the certificate each node serves (TLS handshake with the client's
# mounted credential), PEM, one after the other.
SERVED = f"""
import socket, ssl, sys
d = "{CLIENT_CONFIG.rsplit('/', 1)[0]}"
ctx = ssl.create_default_context(cafile=d + "/ca.crt")
ctx.check_hostname = False  # a node's name is in its certificate, but the CA check is what counts
ctx.load_cert_chain(d + "/tls.crt", d + "/tls.key")
for host in sys.argv[1:]:
    with socket.create_connection((host, 9093), timeout=10) as s, ctx.wrap_socket(s) as t:
        print(ssl.DER_cert_to_PEM_cert(t.getpeercert(True)), flush=True)
"""


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=120)


def _build_old_image(tree: BaselineTree) -> None:
    """``OLD_IMAGE`` from the exported tree with its own scripts/build-image.sh (its wheels with
    this venv's interpreter); the version tag that script also sets is put back as it was."""
    before = _docker("image", "inspect", "--format", "{{.Id}}", VERSION_TAG)
    build = subprocess.run(["bash", str(tree.source / "scripts" / "build-image.sh"), "build"],
                           capture_output=True, text=True, timeout=1800,
                           env={**os.environ, "KK_IMAGE": OLD_IMAGE, "PYTHON": sys.executable})
    if before.returncode == 0:
        _docker("tag", before.stdout.strip(), VERSION_TAG)
    else:
        _docker("rmi", "--no-prune", VERSION_TAG)
    assert build.returncode == 0, f"{tree.rev}'s scripts/build-image.sh failed:\n{build.stderr[-6000:]}"


@pytest.fixture(scope="module")
def old_release(kk_image: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[BaselineTree, float]:
    """The older revision's tree and its image in the node's containerd (built once: the tag
    names the revision); the seconds it took."""
    t0 = time.monotonic()
    tree = export_tree(OLD_REV, tmp_path_factory.mktemp("upgrade-from"))
    if _docker("image", "inspect", OLD_IMAGE).returncode != 0:
        _build_old_image(tree)
    load = _node("load-image", OLD_IMAGE, timeout=600)
    assert load.returncode == 0, f"importing {OLD_IMAGE} into containerd failed:\n{load.stderr[-4000:]}"
    return tree, time.monotonic() - t0


def _helm_install(c: NodeCluster, chart: Path, image: str) -> None:
    repo, tag = image.rsplit(":", 1)
    c.helm("upgrade", "--install", RELEASE, str(chart), "--namespace", OP_NS, "--create-namespace",
           "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
           "--set", "image.pullPolicy=Never", "--set", "rbac.scope=namespace",
           "--set", f"operator.watchNamespaces={{{UP_NS}}}")


def _cleanup(c: NodeCluster) -> None:
    """Removes what this test made: the quorum (while its operator still runs, which removes its
    finalizer; forced otherwise), the release and both namespaces."""
    if c.get_json("namespace", UP_NS) is not None:
        gone = c.kubectl("delete", "kraftquorum", QUORUM, "-n", UP_NS, "--ignore-not-found", "--wait=true",
                         "--timeout=90s", check=False)
        if gone.returncode != 0:
            c.kubectl("patch", "kraftquorum", QUORUM, "-n", UP_NS, "--type=merge",
                      "-p", '{"metadata":{"finalizers":null}}', check=False)
    c.helm("uninstall", RELEASE, "--namespace", OP_NS, "--ignore-not-found", check=False)
    c.kubectl("delete", "namespace", UP_NS, OP_NS, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture(scope="module")
def upgrade_ns(node_cluster: NodeCluster) -> Iterator[str]:
    """Namespace ``kk-upgrade`` under the ``restricted`` Pod Security level, empty (a run left on a
    kept cluster is removed first), removed with everything in it at the end."""
    c = node_cluster
    _cleanup(c)
    c.wait_for(f"namespaces {UP_NS} and {OP_NS} gone",
               lambda: c.get_json("namespace", UP_NS) is None and c.get_json("namespace", OP_NS) is None,
               timeout=180)
    c.kubectl("create", "namespace", UP_NS)
    c.kubectl("label", "--overwrite", "namespace", UP_NS, "pod-security.kubernetes.io/enforce=restricted",
              "pod-security.kubernetes.io/enforce-version=v1.30")
    try:
        yield UP_NS
    finally:
        _cleanup(c)


def _describe(c: NodeCluster) -> str:
    log = c.kubectl("logs", "-n", OP_NS, f"deploy/{DEPLOYMENT}", check=False)
    lines = [line for line in log.stdout.splitlines() if "aiohttp.access" not in line]  # probes
    return f"{c.describe(UP_NS)}\n$ operator log (tail)\n" + "\n".join(lines[-60:]) + log.stderr[-1000:]


def _bound(pem: bytes | None, replica_id: int, uuids: dict[int, str]) -> bool:
    """The certificate is replica ``replica_id``'s and names that voter's storage UUID."""
    if not pem:
        return False
    ident = identity_from_cert(x509.load_pem_x509_certificate(pem))
    return ident.replica_id == replica_id and ident.storage_uuid == uuids.get(replica_id)


def _served(c: NodeCluster) -> list[bytes]:
    """The certificates the three nodes serve, in replica order."""
    hosts = [f"{QUORUM}-{k}.{QUORUM}-headless.{UP_NS}.svc" for k in range(3)]
    out = c.kubectl("exec", "-n", UP_NS, "client", "--", "python", "-c", SERVED, *hosts, check=False).stdout
    end = "-----END CERTIFICATE-----"
    return [(part + end).strip().encode() for part in out.split(end) if "BEGIN CERTIFICATE" in part]


def _rolled(c: NodeCluster) -> bool:
    """The StatefulSet's controller has every pod on its current template."""
    sts = c.get_json("statefulset", QUORUM, "-n", UP_NS) or {}
    st = sts.get("status") or {}
    return bool(st.get("observedGeneration") == sts.get("metadata", {}).get("generation")
                and st.get("currentRevision") == st.get("updateRevision")
                and st.get("updatedReplicas") == 3 and st.get("readyReplicas") == 3)


def test_upgrade_in_place_binds_certificates_one_pod_at_a_time(
    node_cluster: NodeCluster, kk_image: str, old_release: tuple[BaselineTree, float], upgrade_ns: str
) -> None:
    c = node_cluster
    tree, built = old_release
    t0 = time.monotonic()
    _helm_install(c, tree.source / "charts" / "kraftkeeper", OLD_IMAGE)
    quorum = yaml.safe_load((tree.source / "e2e" / "sample.yaml").read_text())
    del quorum["spec"]["image"]  # the quorum runs the operator's image, so upgrading the operator upgrades it
    c.kubectl("apply", "-n", UP_NS, "-f", "-", stdin=yaml.safe_dump(quorum))
    st = c.wait_for("the old KRaftQuorum Available with 3 voters", lambda: quorum_available(c, ns=UP_NS),
                    timeout=300, context=lambda: _describe(c))
    c.kubectl("apply", "-n", UP_NS, "-f", "-", stdin=yaml.safe_dump(CLIENT_POD))
    c.kubectl("wait", "-n", UP_NS, "--for=condition=Ready", "pod/client", "--timeout=120s")
    installed = time.monotonic() - t0
    before = voter_uuids(st)
    old = secret_data(c, f"{QUORUM}-tls", UP_NS) or {}
    for i in (1, 2, 3):  # the old operator's certificates name no disk
        assert identity_from_cert(x509.load_pem_x509_certificate(old[f"node-{i}.crt"])).storage_uuid is None
    assert all(p["spec"]["containers"][0]["image"] == OLD_IMAGE for p in quorum_pods(c, UP_NS))

    writer = Writer(c, "upgrade", bootstrap=BOOT, namespace=UP_NS)
    writer.wait_acked(0, "the writer's first acknowledged write")
    t1 = time.monotonic()
    # The upgrade as docs/operator.md has it: Helm never upgrades a CRD, so apply it, then the chart.
    c.kubectl("apply", "-f", str(REPO / "charts" / "kraftkeeper" / "crds"))
    _helm_install(c, REPO / "charts" / "kraftkeeper", kk_image)

    # Each poll records what it saw on the way: the most quorum pods unready at once, every pod
    # (uid) each replica ran as, and the acknowledged writes when the first pod was replaced.
    most_unready = 0
    seen: dict[str, list[str]] = {f"{QUORUM}-{k}": [] for k in range(3)}
    acked_at_first_restart: int | None = None
    last_ack, longest_stall, acks = time.monotonic(), 0.0, 0

    def upgraded() -> bool:
        nonlocal most_unready, acked_at_first_restart, last_ack, longest_stall, acks
        now, n = time.monotonic(), len(writer.acked())
        if n > acks:
            longest_stall, last_ack, acks = max(longest_stall, now - last_ack), now, n
        pods = quorum_pods(c, UP_NS)
        most_unready = max(most_unready, 3 - len([p for p in pods if pod_ready(p)]))
        for p in pods:
            uids = seen.setdefault(p["metadata"]["name"], [])
            if p["metadata"]["uid"] not in uids:
                uids.append(p["metadata"]["uid"])
                if acked_at_first_restart is None and len(uids) > 1:
                    acked_at_first_restart = n
        if not (len(pods) == 3 and all(pod_ready(p) and p["spec"]["containers"][0]["image"] == kk_image
                                       for p in pods) and _rolled(c)):
            return False
        s = quorum_available(c, ns=UP_NS)
        if s is None:
            return False
        uuids = voter_uuids(s)
        certs = secret_data(c, f"{QUORUM}-tls", UP_NS) or {}
        if not all(_bound(certs.get(f"node-{i}.crt"), i, uuids) for i in (1, 2, 3)):
            return False
        served = _served(c)
        return len(served) == 3 and all(_bound(pem, i + 1, uuids) for i, pem in enumerate(served))

    c.wait_for("every pod on the new image, serving a certificate bound to its disk, the quorum Available",
               upgraded, timeout=900, interval=0.5, context=lambda: f"pods seen {seen}\n{_describe(c)}")
    upgrade = time.monotonic() - t1
    # One pod at a time, through the roll and the rotation: a majority always stayed.
    assert most_unready <= 1, f"{most_unready} quorum pods were unready at once during the upgrade"
    assert acked_at_first_restart is not None, "no quorum pod was replaced"
    assert len(writer.acked()) > acked_at_first_restart, "no write was acknowledged during the upgrade"
    final = quorum_available(c, ns=UP_NS)
    assert final is not None and voter_uuids(final) == before, "the upgrade keeps every identity"
    # The certificates were re-issued the renewal's way, each told as an Event.
    events = c.get_json("events", "-n", UP_NS, "--field-selector", "involvedObject.kind=KRaftQuorum")["items"]
    told = {(e["reason"], e.get("message", "")) for e in events}
    for i in (1, 2, 3):
        started = ("CertificateRenewalStarted", f"restarting node {i} with its renewed certificate")
        assert started in told, told
    writer.wait_acked(len(writer.acked()), "a write acknowledged after the upgrade")
    acked = writer.stop()
    read_back(c, acked, bootstrap=BOOT, namespace=UP_NS)
    print(f"upgrade from {tree.rev}: old image ready in {built:.1f} s, installed and Available in "
          f"{installed:.1f} s, upgraded in {upgrade:.1f} s (pods per replica "
          f"{[len(u) for u in seen.values()]}, longest wait between two acknowledged writes "
          f"{longest_stall:.1f} s, {len(acked)} writes read back)")
