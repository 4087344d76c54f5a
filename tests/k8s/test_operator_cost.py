"""The operator's steady-state cost in API requests (23.8 requests/s for 97 pod-less
KRaftQuorums): N objects whose pods never start (no kubelet here), the operator at its default
interval, and every request it makes in a window counted from the kube-apiserver's audit log by
verb and path. The bound is a count per quorum per minute, not a time."""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.conftest import KubeEnv
from tests.k8s.operator_support import KQ, Operator, create, get, kq

pytestmark = pytest.mark.k8s

N = 20
WINDOW_S = 40.0
# What an idle pod-less quorum may cost: its passes back off to one a minute (quorums.py
# IDLE_BACKOFF_MAX_S) and read the pods from the operator's pod watch, not a list; the status is
# written only when it changed (the unreachable quorum's message no longer names whichever address
# the deadline fell on). Measured here: 0. Before: about 14 per quorum per minute (a pod list on
# every pass, a status patch on most; README, 23.8 requests/s for 97 objects).
MAX_PER_QUORUM_MINUTE = 0.5


def _operator_requests(audit: Path, offset: int) -> list[dict[str, Any]]:
    """The audit events from byte ``offset`` on that the operator made (not this test's urllib),
    one per request."""
    seen: dict[str, dict[str, Any]] = {}
    with audit.open("rb") as f:
        f.seek(offset)
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:  # a line being written
                continue
            if ev.get("userAgent", "").startswith("Python-urllib"):
                continue
            if (ev.get("user") or {}).get("username") != "kk-admin":
                continue
            seen.setdefault(ev["auditID"], ev)
    return list(seen.values())


def test_idle_podless_quorums_cost_few_api_requests(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str, tmp_path: Path
) -> None:
    assert kube.audit_log is not None
    ns = namespace
    op = Operator(kube, ns, tmp_path / "operator.log", interval=2.0)
    try:
        for i in range(N):
            create(kube, ns, kq(f"idle{i}", 3))

        def settled(o: dict[str, Any]) -> bool:
            """Creation handled (kopf's annotation, observedGeneration) and a daemon pass's
            status written: what follows is the steady state."""
            s = o.get("status") or {}
            annotations = o["metadata"].get("annotations") or {}
            handled = "kopf.zalando.org/last-handled-configuration" in annotations
            return handled and s.get("observedGeneration") == o["metadata"]["generation"] and bool(
                s.get("conditions")
            )

        def all_settled() -> bool:
            items = (get(kube, KQ.format(ns=ns)) or {}).get("items") or []
            return len(items) == N and all(settled(o) for o in items)

        kube.wait_for(f"{N} objects created and reported", all_settled, timeout=180)
        offset = kube.audit_log.stat().st_size
        # The window itself is under test (not a wait for something to happen): every request
        # the operator makes in it is counted from the audit log below.
        end = time.monotonic() + WINDOW_S
        kube.wait_for("the end of the window", lambda: time.monotonic() >= end, timeout=WINDOW_S + 10)
        reqs = _operator_requests(kube.audit_log, offset)
    finally:
        op.stop()
        print("operator log:\n" + op.tail())
    by = collections.Counter(
        (e["verb"], e["requestURI"].split("?")[0].replace(ns, "NS")) for e in reqs
    )
    table = "\n".join(f"{n:5d} {verb} {path}" for (verb, path), n in by.most_common())
    print(f"operator requests in {WINDOW_S:g} s for {N} idle quorums:\n{table}")
    per = len(reqs) / N / (WINDOW_S / 60)
    assert per <= MAX_PER_QUORUM_MINUTE, f"{per:.1f} requests per quorum per minute:\n{table}"
