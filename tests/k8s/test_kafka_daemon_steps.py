"""The ``spec.kafka`` daemon's writes around a voter change, against a real kube-apiserver: the
status that first carries a Succeeded record lists the voter set the recovery made, and the
AddVoterCommitted Event is stored before the operator can stop at the failpoint right after the
commit (it went through kopf's queue, which a stop loses); the progress store in status
(k8s/crdstatus.py) round-trips through the API server.

In process: the daemon's own pass (``KafkaMembership``'s controller and status writes, its real
``KubeApi``) with the in-memory quorum (testing/memory.py) in place of a Kafka controller quorum,
which this test does not need (tests/kafka/test_k8s_kafka.py runs real Kafka)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator import failpoints
from kraftkeeper_operator.core.progress import Known, Progress
from kraftkeeper_operator.core.records import Phase, Recovery
from kraftkeeper_operator.k8s.context import OperatorContext
from kraftkeeper_operator.k8s.crdstatus import Beside, StatusProgressStore, StatusWriter, kafka_status
from kraftkeeper_operator.k8s.kafkaquorums import KafkaMembership
from kraftkeeper_operator.k8s.kafkaspec import parse_kafka_spec
from kraftkeeper_operator.k8s.kube import KubeApi
from kraftkeeper_operator.testing.memory import InMemoryQuorum
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from tests.k8s.conftest import KubeEnv
from tests.k8s.operator_support import KQ, create
from tests.operator.helpers import Clock, OperatorCrash

pytestmark = pytest.mark.k8s


async def _kube_api(kube: KubeEnv) -> KubeApi:
    cfg = k8s.Configuration()
    await k8s_config.load_kube_config(config_file=str(kube.kubeconfig), client_configuration=cfg)
    return KubeApi(k8s.ApiClient(cfg))


def _voters(status: dict[str, Any]) -> set[tuple[int, str | None]]:
    return {(v["id"], v.get("uuid")) for v in status.get("voters") or []}


def _kafka_quorum(kube: KubeEnv, ns: str, name: str, events: Path, **kafka: Any) -> dict[str, Any]:
    """A KRaftQuorum with ``spec.kafka`` (controllers nobody listens at: the tests put their own
    quorum or none behind it)."""
    spec = {"kafka": {"bootstrapControllers": ["127.0.0.1:9"], **kafka}, "eventLog": {"path": str(events)}}
    obj = {"apiVersion": "kraftkeeper.io/v1alpha1", "kind": "KRaftQuorum", "metadata": {"name": name}}
    return create(kube, ns, {**obj, "spec": spec})


async def _recover(kube: KubeEnv, ns: str, events: Path, *, crash_at: str | None = None) -> dict[str, Any]:
    """Replace replica 3's disk and run the daemon's passes until the recovery Succeeds (or the
    operator stops at ``crash_at``). Returns the old and new (3, uuid), the API server's status
    after every status write, and the OperatorCrash if one stopped the passes."""
    body = _kafka_quorum(kube, ns, "kq", events, stabilizationSeconds=1)
    api = await _kube_api(kube)
    written: list[dict[str, Any]] = []
    patch_status = api.patch_status

    async def recording(namespace: str, name: str, status: dict[str, Any]) -> None:
        await patch_status(namespace, name, status)
        _, obj = kube.request("GET", f"{KQ.format(ns=ns)}/kq")
        written.append(dict(obj.get("status") or {}))

    api.patch_status = recording  # type: ignore[method-assign]
    out: dict[str, Any] = {"written": written, "crash": None}
    d = KafkaMembership(OperatorContext(kube=api), body)
    try:
        await d._configure(parse_kafka_spec(body), None, "no-secret")
        assert d.m is not None
        clock = Clock()
        q = InMemoryQuorum(3, clock.ms)
        d.m.controller.api, d.m.controller.clock = q, clock  # type: ignore[assignment]
        q.tick()
        await d._write_status(await d.m.controller.reconcile())
        out["old"] = next(k for k in q.voters if k[0] == 3)
        out["new"] = (3, q.replace_disk(3, lag=0))
        for _ in range(20):
            clock.t += 0.5
            q.tick()
            try:
                await d._write_status(await d.m.controller.reconcile())
            except OperatorCrash as e:
                assert crash_at is not None
                out["crash"] = e
                break
            if any(r["result"] == "Succeeded" for r in d.m.recoveries_status()):
                break
        out["recovery_id"] = d.m.controller.book.records[-1].recovery_id
    finally:
        await d.close()
        await api.close()
    return out


@pytest.mark.usefixtures("kraftquorum_crd")
def test_the_status_with_the_succeeded_record_lists_the_new_voter(
    kube: KubeEnv, namespace: str, tmp_path: Path
) -> None:
    got = asyncio.run(_recover(kube, namespace, tmp_path / "ev"))
    old, new = got["old"], got["new"]
    done = [s for s in got["written"] if any(r["result"] == "Succeeded" for r in s.get("recoveries") or [])]
    assert done, got["written"]
    for s in done:  # the first of them is written by the persist right after AddRaftVoter committed
        assert new in _voters(s) and old not in _voters(s), s


@pytest.mark.usefixtures("kraftquorum_crd")
def test_the_add_voter_committed_event_is_stored_before_the_failpoint(
    kube: KubeEnv, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``after-add-voter-committed=exit``: the process exits at once (here an OperatorCrash stands
    for ``os._exit``); whatever the operator had not posted by then is gone with it."""

    def exit_now(code: int) -> None:
        raise OperatorCrash(code)

    monkeypatch.setenv(failpoints.ENV, failpoints.AFTER_ADD_COMMITTED)
    monkeypatch.setattr(os, "_exit", exit_now)
    monkeypatch.setattr(logging, "shutdown", lambda: None)  # the test's log capture stays open
    got = asyncio.run(_recover(kube, namespace, tmp_path / "ev", crash_at=failpoints.AFTER_ADD_COMMITTED))
    assert got["crash"] is not None and got["crash"].args == (failpoints.EXIT_CODE,)
    _, listing = kube.request("GET", f"/api/v1/namespaces/{namespace}/events")
    reasons = [
        e["reason"]
        for e in listing.get("items", [])
        if e["involvedObject"].get("name") == "kq" and got["recovery_id"] in e.get("message", "")
    ]
    # RemoveThenAdd (Kafka): every step up to the commit the operator stopped after, once each.
    assert reasons.count("AddVoterCommitted") == 1, reasons
    for step in ("DiskReplacementDetected", "RemoveVoterStarted", "RemoveVoterCommitted", "AddVoterStarted"):
        assert reasons.count(step) == 1, (step, reasons)


@pytest.mark.usefixtures("kraftquorum_crd")
def test_the_status_progress_store_round_trip(kube: KubeEnv, namespace: str, tmp_path: Path) -> None:
    """The progress store in a KRaftQuorum's status (k8s/crdstatus.py), as both daemons use it:
    what one operator run saved, the next one (built from the object as the API server returns
    it) loads back; an unchanged save writes nothing; an unreadable item is skipped, not fatal
    (the quorum corrects the phase on the next pass)."""
    body = _kafka_quorum(kube, namespace, "ps", tmp_path)
    old, new = "00000000-0000-4000-8000-000000000000", "11111111-1111-4111-8111-111111111111"
    recs = [Recovery("r1", 3, old, new, Phase.REMOVED, 1_700_000_000_000)]
    recs[0].remove_started_ms, recs[0].remove_committed_ms = 1_700_000_001_000, 1_700_000_002_000
    listeners = {3: [("CONTROLLER", "10.0.0.3", 9093)]}

    async def run() -> tuple[Progress, int]:
        api = await _kube_api(kube)
        sent: list[dict[str, Any]] = []
        patch_status = api.patch_status

        async def counting(ns: str, name: str, status: dict[str, Any]) -> None:
            sent.append(status)
            await patch_status(ns, name, status)

        api.patch_status = counting  # type: ignore[method-assign]
        try:
            writer = StatusWriter(api, namespace, "ps", body.get("status") or {})
            kafka = kafka_status("c", listeners)
            store = StatusProgressStore(writer, f"{namespace}/ps", lambda: Beside(kafka=kafka))
            assert await store.load() == Progress(known=Known(cluster=f"{namespace}/ps"))
            await store.save([r.to_dict() for r in recs])
            await store.save([r.to_dict() for r in recs])  # unchanged: not written again
            await writer.patch({"voters": [{"id": 3, "uuid": recs[0].new_uuid}]})
            _, obj = kube.request("GET", f"{KQ.format(ns=namespace)}/ps")
            obj["status"]["recoveries"].append({"recoveryId": "bad"})  # as if hand-edited
            again = StatusProgressStore(StatusWriter(api, namespace, "ps", obj["status"]), f"{namespace}/ps")
            return await again.load(), len(sent)
        finally:
            await api.close()

    got, writes = asyncio.run(run())
    assert writes == 2, writes
    assert got.records == recs
    assert got.known.listeners == listeners and got.known.voters == [(3, recs[0].new_uuid)]
