"""The one renewal rule (quorum.security.identity.renewal_due) that local mode and the operator's
Secrets both use."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from quorum.security.identity import Identity, load_cert, renewal_due
from quorum.security.pki import init_ca, issue_client, issue_node

DISK = "00000000-0000-4000-8000-000000000001"
OTHER_DISK = "00000000-0000-4000-8000-000000000002"


def test_the_renewal_rule(tmp_path: Path) -> None:
    ca = init_ca(tmp_path, "c1")
    crt, _ = issue_node(ca, 2, days=10, storage_uuid=DISK)
    pem = crt.read_bytes()
    week = dt.timedelta(days=7)
    assert renewal_due(None, week) and renewal_due(b"garbage", week) and load_cert(b"garbage") is None
    assert not renewal_due(pem, week)
    assert renewal_due(pem, dt.timedelta(days=11))  # expires within renew_before
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=4)
    assert renewal_due(load_cert(pem), week, now=later)
    assert not renewal_due(pem, week, Identity("c1", replica_id=2))  # disk not known: not compared
    assert not renewal_due(pem, week, Identity("c1", replica_id=2, storage_uuid=DISK))
    assert renewal_due(pem, week, Identity("c1", replica_id=2, storage_uuid=OTHER_DISK))
    assert renewal_due(pem, week, Identity("c1", replica_id=3))  # another replica
    assert renewal_due(pem, week, Identity("c2", replica_id=2))  # another cluster
    client, _ = issue_client(ca, "alice", "read", days=10)
    assert renewal_due(client.read_bytes(), week, Identity("c1", replica_id=2))  # not a node
