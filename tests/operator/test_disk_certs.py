"""Node certificates bound to the disk on Kubernetes, the node's side and the pod's: a pod
formats an empty volume with the storage UUID its certificate names (only before the quorum
bootstrapped); a node refuses a certificate naming another disk and says which disk it has, in
words the operator reads back from the pod's termination message (podhealth.py
``disk_of_pod``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.k8s.manifests import BOOTSTRAP_KEY, format_command, parse_spec, statefulset
from kraftkeeper_operator.k8s.podhealth import disk_of_pod

from quorum.security.pki import init_ca, issue_node
from quorum.storage.meta import load_meta
from tests.engine.cluster import run_cli
from tests.operator.operator_nodes import run_format_container
from tests.tlsfixtures import CLUSTER

OWNER = {"apiVersion": "kraftkeeper.io/v1alpha1", "kind": "KRaftQuorum", "name": "q", "uid": "u-1"}
DISK = "5f0c6a3e-2b1d-4c8e-9a7f-0d3b2e1c4a55"


def _pod(name: str, message: str, where: str = "lastState") -> dict[str, Any]:
    terminated = {"exitCode": 1, "reason": "Error", "message": message}
    return {
        "metadata": {"name": name, "uid": "p-1"},
        "status": {"containerStatuses": [{"name": "node", where: {"terminated": terminated}}]},
    }


@pytest.mark.slow  # starts processes
def test_format_takes_the_storage_uuid_of_a_bound_certificate(tmp_path: Path) -> None:
    ca = init_ca(tmp_path / "tls", CLUSTER)
    bound, _ = issue_node(ca, 2, storage_uuid=DISK)
    fmt = ("format", "--cluster-id", CLUSTER, "--node-id", "2", "--ignore-formatted")
    run_cli(*fmt, "--dir", str(tmp_path / "a"), "--storage-uuid-from-cert", str(bound))
    assert load_meta(tmp_path / "a").storage_uuid == DISK
    # A formatted volume keeps its identity whatever the certificate says.
    other, _ = issue_node(ca, 2, storage_uuid="0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d")
    run_cli(*fmt, "--dir", str(tmp_path / "a"), "--storage-uuid-from-cert", str(other))
    assert load_meta(tmp_path / "a").storage_uuid == DISK
    # An unbound certificate (an older operator's) leaves the UUID random.
    unbound = tmp_path / "unbound.crt"
    unbound.write_bytes(issue_node(ca, 2)[0].read_bytes())
    run_cli(*fmt, "--dir", str(tmp_path / "b"), "--storage-uuid-from-cert", str(unbound))
    assert load_meta(tmp_path / "b").storage_uuid not in (DISK, None)
    # A UUID given as such; a bad one is refused, naming it.
    run_cli(*fmt, "--dir", str(tmp_path / "d"), "--storage-uuid", DISK.upper())
    assert load_meta(tmp_path / "d").storage_uuid == DISK
    p = run_cli(*fmt, "--dir", str(tmp_path / "e"), "--storage-uuid", "nope", check=False)
    assert p.returncode != 0 and "nope" in p.stderr and not (tmp_path / "e" / "meta.properties").exists()
    # Another replica's certificate is refused, naming it; nothing is formatted.
    p = run_cli(
        *fmt,
        "--dir",
        str(tmp_path / "c"),
        "--storage-uuid-from-cert",
        str(ca.directory / "none"),
        check=False,
    )
    assert p.returncode != 0 and "not a readable PEM certificate" in p.stderr
    three, _ = issue_node(ca, 3, storage_uuid=DISK)
    p = run_cli(*fmt, "--dir", str(tmp_path / "c"), "--storage-uuid-from-cert", str(three), check=False)
    assert p.returncode != 0 and "replica/3" in p.stderr and not (tmp_path / "c" / "meta.properties").exists()


@pytest.mark.slow  # starts processes
def test_a_node_on_a_new_disk_names_it_and_the_operator_reads_it(tmp_path: Path) -> None:
    """The real node's refusal, as the kubelet would put it in the termination message."""
    ca = init_ca(tmp_path / "tls", CLUSTER)
    crt, key = issue_node(ca, 2, storage_uuid=DISK)
    data = tmp_path / "new-disk"
    run_cli("format", "--dir", str(data), "--cluster-id", CLUSTER, "--node-id", "2", "--replacement")
    new = load_meta(data).storage_uuid
    p = run_cli(
        "start",
        "--dir",
        str(data),
        "--listen",
        "127.0.0.1:1",
        "--voters",
        "2@127.0.0.1:1",
        "--cert",
        str(crt),
        "--key",
        str(key),
        "--ca",
        str(ca.directory / "ca.crt"),
        check=False,
    )
    assert p.returncode != 0 and f"bound to storage {DISK}" in p.stderr, p.stderr
    assert disk_of_pod(_pod("q-1", p.stderr), "q") == (2, new)
    assert disk_of_pod(_pod("q-1", p.stderr, where="state"), "q") == (2, new)
    assert disk_of_pod(_pod("other-1", p.stderr), "q") is None  # not this quorum's pod
    assert disk_of_pod(_pod("q-1", "CORRUPT_LOG: 00000.log at position 3"), "q") is None
    assert disk_of_pod({"metadata": {"name": "q-0"}}, "q") is None


@pytest.mark.slow  # starts processes
def test_pods_take_the_certificates_disk_only_before_the_bootstrap(tmp_path: Path) -> None:
    q = parse_spec({"metadata": {"name": "q", "namespace": "ns", "uid": "u-1"}, "spec": {"voters": 3}})
    cmd = format_command(q)
    bootstrapped, _, initial = cmd.partition("then set -- --no-initial-controllers; else ")
    assert "--storage-uuid-from-cert" not in bootstrapped
    assert "set -- --storage-uuid-from-cert /etc/kraftkeeper/tls/node.crt;" in initial.split(" fi && ")[0]
    plain = parse_spec(
        {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"voters": 3, "tls": {"mode": "Disabled"}}}
    )
    assert "--storage-uuid-from-cert" not in format_command(plain)
    node = statefulset(q, OWNER, replicas=3, bootstrap_voters=3)["spec"]["template"]["spec"]["containers"][0]
    assert node["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # The pod's preparation, run as the kubelet would: before the bootstrap the certificate's
    # disk; once bootstrapped a random one, whatever the (possibly stale) certificate names.
    sts = statefulset(q, OWNER, replicas=3, bootstrap_voters=3)
    ca = init_ca(tmp_path / "ca", q.cluster_id)
    tls = tmp_path / "tls"
    tls.mkdir()
    crt, key = issue_node(ca, 2, storage_uuid=DISK)[:2]
    for name, src in (("node.crt", crt), ("node.key", key), ("ca.crt", ca.cert_file)):
        (tls / name).write_bytes(src.read_bytes())  # the pod's own directory of its tls volume
    flags = tmp_path / "flags"
    flags.mkdir()
    out = run_format_container(sts, 1, tmp_path / "first", flags, tls)
    assert out.returncode == 0, out.stderr
    assert load_meta(tmp_path / "first").storage_uuid == DISK
    (flags / BOOTSTRAP_KEY).write_text("true")
    out = run_format_container(sts, 1, tmp_path / "replaced", flags, tls)
    assert out.returncode == 0, out.stderr
    assert load_meta(tmp_path / "replaced").storage_uuid != DISK
