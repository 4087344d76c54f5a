"""The spare certificates' decisions (spares.py), the recovery core's rule that only a disk the
operator vouches for is taken as new (recovery.py ``vouched``), the node's choice of certificate
(``kraftkeeper start --spare-cert``), and the pod template that carries the spare; no API server.
Against the test kube-apiserver with real nodes: test_spare_certs.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.core.recovery import QuorumView, RecoveryBook, RecoveryPolicy
from kraftkeeper_operator.k8s.manifests import BOOTSTRAP_KEY, parse_spec, statefulset
from kraftkeeper_operator.k8s.spares import ISSUE, PROMOTE, REFUSE, ROTATE, Spare, SpareBook, decide
from kraftkeeper_operator.k8s.tlsobjects import DISK_ANNOTATION, SPARE_ANNOTATION, certificates

from quorum.security.nodetls import load_node_tls
from quorum.security.pki import init_ca, issue_node
from quorum.storage.meta import format_dir, load_meta
from quorum.types import KraftError
from tests.operator.operator_nodes import run_format_container

OWNER = {"apiVersion": "kraftkeeper.io/v1alpha1", "kind": "KRaftQuorum", "name": "q", "uid": "u-1"}
OLD, NEW, SPARE, OTHER = (f"{c * 8}-{c * 4}-4{c * 3}-8{c * 3}-{c * 12}" for c in "1234")


def test_spare_decisions() -> None:
    s = Spare(SPARE, "claim-a", "ctr-a")
    assert decide(None, presented=False, claim=None, container="", fetched_since_seen=False) == ISSUE
    # Presented from a replaced claim: promoted; from the same claim: refused; claim unknown: wait.
    assert decide(s, presented=True, claim="claim-b", container="ctr-b", fetched_since_seen=False) == PROMOTE
    assert decide(s, presented=True, claim="claim-a", container="ctr-b", fetched_since_seen=True) == REFUSE
    assert decide(s, presented=True, claim=None, container="ctr-b", fetched_since_seen=False) == ""
    # A scale-up's new replica (no voter): its spare, issued before any of its containers ran.
    new_id = Spare(SPARE, "claim-a", "")
    assert decide(
        new_id, presented=True, claim="claim-a", container="c", fetched_since_seen=False, voter=False
    ) == (PROMOTE)
    assert decide(new_id, presented=True, claim="claim-a", container="c", fetched_since_seen=False) == REFUSE
    assert (
        decide(s, presented=True, claim="claim-a", container="c", fetched_since_seen=False, voter=False)
        == REFUSE
    )
    # Issued while no claim existed: any claim is a new one.
    assert (
        decide(Spare(SPARE), presented=True, claim="claim-a", container="", fetched_since_seen=False)
        == PROMOTE
    )
    # Another container on the replica's own disk (its voter fetched since): rotated.
    assert decide(s, presented=False, claim="claim-a", container="ctr-b", fetched_since_seen=True) == ROTATE
    assert decide(s, presented=False, claim="claim-a", container="ctr-b", fetched_since_seen=False) == ""
    assert decide(s, presented=False, claim="claim-a", container="ctr-a", fetched_since_seen=True) == ""
    assert Spare.decode(s.encode()) == s and Spare.decode(Spare(SPARE).encode()) == Spare(SPARE)
    assert Spare.decode(b"") is None and Spare.decode("a b") is None


def _view(
    voters: list[tuple[int, str, int]], observers: list[tuple[int, str, int]] | None = None, leader: int = 1
) -> QuorumView:
    def rep(i: int, u: str, f: int) -> dict[str, Any]:
        return {
            "id": i,
            "uuid": u,
            "log_end_offset": 10,
            "lag": 0,
            "last_fetch_timestamp": f,
            "last_caught_up_timestamp": f,
        }

    return QuorumView.from_describe(
        {
            "leader_id": leader,
            "leader_epoch": 3,
            "high_watermark": 10,
            "voters": [rep(*v) for v in voters],
            "observers": [rep(*o) for o in observers or []],
        }
    )


def _pod(container: str) -> dict[str, Any]:
    cs = {
        "name": "node",
        "containerID": container,
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
    }
    return {"metadata": {"name": "q-1"}, "status": {"containerStatuses": [cs]}}


def test_a_spare_is_rotated_only_once_the_restarted_node_fetched_as_the_voter() -> None:
    book = SpareBook()
    book.spares[2] = Spare(SPARE, "claim-a", "ctr-a")
    view = _view([(1, OTHER, 1000), (2, OLD, 1000)])
    assert book.facts(2, view, OLD, _pod("ctr-a")) == (False, "ctr-a", False)
    # A new container: first seen now; nothing until the voter (2, OLD) fetches after that.
    assert book.facts(2, view, OLD, _pod("ctr-b")) == (False, "ctr-b", False)
    assert book.facts(2, view, OLD, _pod("ctr-b")) == (False, "ctr-b", False)
    later = _view([(1, OTHER, 1200), (2, OLD, 1200)])
    assert book.facts(2, later, OLD, _pod("ctr-b")) == (False, "ctr-b", True)
    # A replaced disk's pod never fetches as the old voter: its observer presents the spare.
    book.seen.clear()
    fresh = _view([(1, OTHER, 1300), (2, OLD, 1000)], [(2, SPARE, 1300)])
    assert book.facts(2, fresh, OLD, _pod("ctr-c")) == (True, "ctr-c", False)
    assert book.facts(2, fresh, OLD, _pod("ctr-c")) == (True, "ctr-c", False)
    # A restarted node that leads at once is the voter itself.
    book.seen.clear()
    assert book.facts(2, _view([(1, OTHER, 1000), (2, OLD, 1000)], leader=2), OLD, _pod("ctr-d"))[2]


def test_the_core_takes_only_a_vouched_disk_as_new() -> None:
    view = _view([(1, OTHER, 2000), (2, OLD, 1000), (3, OLD.replace("1", "5"), 2000)], [(2, NEW, 2000)])
    for vouched, detected in (
        (None, True),
        ({2: OLD}, False),
        ({2: NEW}, True),
        ({2: None}, True),
        ({}, False),
    ):
        book = RecoveryBook(RecoveryPolicy(stabilization_seconds=0))
        book.vouched = vouched
        book.observe(view, 2100)
        assert bool(book.active_for(2)) is detected, vouched
        if not detected:
            assert book.note is not None and NEW in book.note


@pytest.mark.slow  # formats volumes and issues certificates
def test_the_node_serves_the_spare_only_on_its_disk(tmp_path: Path) -> None:
    ca = init_ca(tmp_path / "ca", "spare-cluster")
    node, node_key, spare, spare_key = (
        tmp_path / n for n in ("node.crt", "node.key", "spare.crt", "spare.key")
    )
    for uuid, crt, key in ((OLD, node, node_key), (SPARE, spare, spare_key)):
        issued = issue_node(ca, 2, storage_uuid=uuid)  # the same file names each time: copied out
        crt.write_bytes(issued[0].read_bytes())
        key.write_bytes(issued[1].read_bytes())
    opts = {
        "cert": str(node),
        "key": str(node_key),
        "ca": str(ca.cert_file),
        "spare_cert": str(spare),
        "spare_key": str(spare_key),
    }
    format_dir(tmp_path / "new", "spare-cluster", 2, storage_uuid=SPARE, initial_bootstrap=False)
    tls = load_node_tls(str(tmp_path / "new"), opts)
    assert tls is not None and tls.cert_file == spare and tls.key_file == spare_key
    format_dir(tmp_path / "own", "spare-cluster", 2, storage_uuid=OLD)
    tls = load_node_tls(str(tmp_path / "own"), opts)
    assert tls is not None and tls.cert_file == node  # its own disk: its current certificate
    format_dir(tmp_path / "other", "spare-cluster", 2, storage_uuid=OTHER)
    with pytest.raises(KraftError, match=f"is bound to storage {OLD}, but this node's disk is {OTHER}"):
        load_node_tls(str(tmp_path / "other"), opts)  # the words the operator reads (old path)
    with pytest.raises(KraftError, match="together"):
        load_node_tls(str(tmp_path / "new"), {**opts, "spare_key": None})


def _node(q: Any) -> dict[str, Any]:
    return statefulset(q, OWNER, replicas=3, bootstrap_voters=3)["spec"]["template"]["spec"]


def test_the_pods_carry_the_spare() -> None:
    q = parse_spec({"metadata": {"name": "q", "namespace": "ns", "uid": "u-1"}, "spec": {"voters": 3}})
    spec = _node(q)
    tls = next(v for v in spec["volumes"] if v["name"] == "tls")["projected"]["sources"]
    items = [i for s in tls if "secret" in s for i in s["secret"]["items"]]
    assert {"key": "spare-2.crt", "path": "q-1/spare.crt"} in items
    assert {"key": "spare-2.key", "path": "q-1/spare.key"} in items
    cmd = spec["containers"][0]["command"][2]
    assert (
        'SPARE="--spare-cert /etc/kraftkeeper/tls/spare.crt --spare-key /etc/kraftkeeper/tls/spare.key"'
        in cmd
    )
    assert "--ca /etc/kraftkeeper/tls/ca.crt $SPARE " in cmd.split("\nexec kraftkeeper start ", 1)[1]
    cm = parse_spec(
        {
            "metadata": {"name": "q", "namespace": "ns", "uid": "u-1"},
            "spec": {"voters": 3, "tls": {"certManager": {"issuerRef": {"name": "ca"}}}},
        }
    )
    tls = next(v for v in _node(cm)["volumes"] if v["name"] == "tls")["projected"]["sources"]
    names = {s["secret"]["name"] for s in tls if "secret" in s}
    assert {"q-node-2-tls", "q-node-2-spare-tls"} <= names
    certs = {
        c["metadata"]["name"]: c for c in certificates(cm, OWNER, 3, {1: OLD}, {2: Spare(SPARE, "c", "")})
    }
    spare_cert = certs["q-node-2-spare"]
    assert spare_cert["spec"]["secretName"] == "q-node-2-spare-tls"
    assert spare_cert["spec"]["uris"][0].endswith(f"/replica/2?storage={SPARE}")
    assert Spare.decode(spare_cert["metadata"]["annotations"][SPARE_ANNOTATION]) == Spare(SPARE, "c", "")
    assert "q-node-1-spare" not in certs and "q-node-1" in certs
    plain = parse_spec(
        {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"voters": 3, "tls": {"mode": "Disabled"}}}
    )
    assert "spare" not in _node(plain)["containers"][0]["command"][2]


@pytest.mark.slow  # runs the pod's preparation
def test_an_empty_volume_takes_the_spare_only_after_the_bootstrap(tmp_path: Path) -> None:
    q = parse_spec({"metadata": {"name": "q", "namespace": "ns", "uid": "u-1"}, "spec": {"voters": 3}})
    sts = statefulset(q, OWNER, replicas=3, bootstrap_voters=3)
    ca = init_ca(tmp_path / "ca", q.cluster_id)
    tls = tmp_path / "tls"
    tls.mkdir()
    (tls / "ca.crt").write_bytes(ca.cert_file.read_bytes())
    for uuid, name in ((OLD, "node"), (SPARE, "spare")):
        crt, key = issue_node(ca, 2, storage_uuid=uuid)[:2]  # the same file names each time: copied out
        (tls / f"{name}.crt").write_bytes(crt.read_bytes())
        (tls / f"{name}.key").write_bytes(key.read_bytes())
    flags = tmp_path / "flags"
    flags.mkdir()
    out = run_format_container(sts, 1, tmp_path / "first", flags, tls)
    assert out.returncode == 0, out.stderr
    assert load_meta(tmp_path / "first").storage_uuid == OLD  # before: its certificate's
    (flags / BOOTSTRAP_KEY).write_text("true")
    out = run_format_container(sts, 1, tmp_path / "replaced", flags, tls)
    assert out.returncode == 0, out.stderr
    meta = load_meta(tmp_path / "replaced")
    assert meta.storage_uuid == SPARE and meta.extra.get("bootstrap.initial") == "false"
    out = run_format_container(sts, 1, tmp_path / "first", flags, tls)
    assert out.returncode == 0 and load_meta(tmp_path / "first").storage_uuid == OLD  # formatted: kept


class _FakeKube:
    """The KubeApi calls the spare path of CertManager mode makes, recorded in order."""

    def __init__(self, spare_pem: bytes) -> None:
        self.calls: list[tuple[str, str]] = []
        self.spare_pem = spare_pem
        self.applied: dict[str, dict[str, Any]] = {}

    async def read_meta(self, kind: str, ns: str, name: str, api_version: str = "") -> dict[str, Any] | None:
        return None

    async def secret_data(self, ns: str, name: str) -> dict[str, str] | None:
        import base64

        if name.endswith("-spare-tls"):
            return {"tls.crt": base64.b64encode(self.spare_pem).decode()}
        if name.endswith("-operator-tls"):
            return {k: base64.b64encode(b"x").decode() for k in ("ca.crt", "tls.crt", "tls.key")}
        return None

    async def apply(self, obj: dict[str, Any], field_manager: str = "") -> None:
        self.calls.append(("apply", obj["metadata"]["name"]))
        self.applied[obj["metadata"]["name"]] = obj

    async def delete_secret(self, ns: str, name: str) -> None:
        self.calls.append(("delete", name))

    async def pod_uid(self, ns: str, name: str) -> str | None:
        return "pod-uid"


def test_cert_manager_mode_names_the_next_spare_before_the_old_one_leaves(tmp_path: Path) -> None:
    """Promotion in CertManager mode: the node Certificate names the spare's UUID, the spare
    Certificate the next spare (with its record), and only then is the old spare's Secret deleted
    (cert-manager then issues the next one): no moment where a new pod could get the old spare
    from a Certificate that still names it."""
    import asyncio

    from kraftkeeper_operator.k8s.quorumtls import QuorumTls

    cm = parse_spec(
        {
            "metadata": {"name": "q", "namespace": "ns", "uid": "u-1"},
            "spec": {"voters": 3, "tls": {"certManager": {"issuerRef": {"name": "ca"}}}},
        }
    )
    ca = init_ca(tmp_path / "ca", cm.cluster_id)
    kube = _FakeKube(issue_node(ca, 2, storage_uuid=SPARE)[0].read_bytes())
    t = QuorumTls()
    t.spare_book.loaded = True
    t.spare_book.spares = {i: Spare(u, "claim-a", "ctr-a") for i, u in ((1, OTHER), (2, SPARE), (3, NEW))}
    nxt = Spare(OLD.replace("1", "6"), "claim-b", "ctr-b")
    asyncio.run(t.write_spares(kube, cm, OWNER, {2: (nxt, True)}, 3))  # type: ignore[arg-type]
    names = [n for _, n in kube.calls]
    assert ("delete", "q-node-2-spare-tls") in kube.calls
    assert names.index("q-node-2-spare") < names.index("q-node-2-spare-tls")  # applied, then deleted
    assert [c for c in kube.calls if c[0] == "delete"] == [("delete", "q-node-2-spare-tls")]
    node2 = kube.applied["q-node-2"]["spec"]["uris"][0]
    assert node2.endswith(f"/replica/2?storage={SPARE}")  # the spare's UUID is the node's now
    # ... and says so before cert-manager issues it (an operator restarted meanwhile keeps it).
    assert kube.applied["q-node-2"]["metadata"]["annotations"] == {DISK_ANNOTATION: SPARE}
    spare2 = kube.applied["q-node-2-spare"]
    assert spare2["spec"]["uris"][0].endswith(f"?storage={nxt.uuid}")
    assert Spare.decode(spare2["metadata"]["annotations"][SPARE_ANNOTATION]) == nxt
    assert t.vouched(3)[2] == SPARE and t.on_spare[2][0] == "pod-uid"
    t.close()
