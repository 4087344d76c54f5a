"""A damaged log is a lost disk, on the real single-node Kubernetes (kubelet + containerd, the
operator as a pod from the chart; fixtures in conftest.py).

While a client keeps writing, one bit of a follower's log is flipped on its volume, inside a
complete batch that a later valid batch follows (so it can never pass for a torn append:
docs/design.md "Torn writes and damage"), and its node is restarted. The node refuses its log and
exits with ``CORRUPT_LOG`` (the pod's termination message); with the other two voters healthy the
operator deletes the pod's claim and the pod (Event ``DamagedDiskReplaced``), the StatefulSet
brings the pod back on a new volume, the node joins under a new storage UUID with a certificate
for that disk, and the KIP-856 recovery swaps it into the voter set. Every acknowledged write
reads back.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.kubelet.conftest import QUORUM, QUORUM_NS, NodeCluster, quorum_available, wait_available
from tests.kubelet.test_e2e import UUID, Writer, read_back, voter_uuids

pytestmark = [pytest.mark.k8s, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

# Runs in the node container, next to the running node: walks the last segment's batch headers
# (base offset int64, batch length int32, little-endian: quorum/records.py), and flips one bit in
# the middle of the CRC-covered bytes of the second-to-last complete batch, in place (pwrite: the
# node may be appending at the end meanwhile). Reads only headers; never opens the log as a log
# (that would run its open-time checks on a directory the node holds).
DAMAGE = """
import os, struct, sys
from pathlib import Path
mdir = Path("/data/kraft/__cluster_metadata-0")
seg = sorted(mdir.glob("*.log"))[-1]
fd = os.open(seg, os.O_RDWR)
size = os.fstat(fd).st_size
starts, pos = [], 0
while pos + 12 <= size:
    _base, length = struct.unpack("<qi", os.pread(fd, 12, pos))
    if length <= 0 or pos + 12 + length > size:
        break
    starts.append((pos, 12 + length))
    pos += 12 + length
if len(starts) < 2:
    sys.exit(f"only {len(starts)} complete batches in {seg}")
start, total = starts[-2]
at = start + 16 + (total - 16) // 2  # past the CRC field: inside what the CRC covers
byte = os.pread(fd, 1, at)[0]
os.pwrite(fd, bytes([byte ^ 0x10]), at)
os.fsync(fd)
print(f"FLIPPED {seg.name} {at} of batch at {start} ({total} bytes), {len(starts)} batches", flush=True)
"""


def _events(c: NodeCluster, reason: str) -> list[dict[str, Any]]:
    items = c.get_json("events", "-n", QUORUM_NS, "--field-selector", "involvedObject.kind=KRaftQuorum")
    return [e for e in (items or {}).get("items", []) if e.get("reason") == reason]


def test_a_damaged_follower_log_is_a_lost_disk_replaced_by_the_operator(
    node_cluster: NodeCluster, quorum_ns: str
) -> None:
    c = node_cluster
    began = time.monotonic()
    st = wait_available(c)
    victim = next(i for i in sorted(voter_uuids(st)) if i != st["leaderId"])
    old_uuid = voter_uuids(st)[victim]
    pod = f"{QUORUM}-{victim - 1}"
    old_pod_uid = c.get_json("pod", pod, "-n", QUORUM_NS)["metadata"]["uid"]
    pvc = f"data-{pod}"
    old_pv = c.get_json("pvc", pvc, "-n", QUORUM_NS)["spec"]["volumeName"]
    replaced_before = len(_events(c, "DamagedDiskReplaced"))

    writer = Writer(c, "damage")
    writer.wait_acked(30, "30 acknowledged writes (batches on the follower's log)")
    out = c.kubectl("exec", "-n", QUORUM_NS, pod, "-c", "node", "--", "python", "-c", DAMAGE).stdout
    assert "FLIPPED" in out, out
    # Restart the node (PID 1 of its container after the start script's exec): it opens its log
    # again, finds the damage and exits with CORRUPT_LOG.
    c.kubectl("exec", "-n", QUORUM_NS, pod, "-c", "node", "--", "sh", "-c", "kill 1")

    def replaced() -> list[dict[str, Any]] | None:
        ev = _events(c, "DamagedDiskReplaced")
        return ev if len(ev) > replaced_before else None

    ev = c.wait_for("a DamagedDiskReplaced Event", replaced, timeout=300, context=c.describe)
    msg = ev[-1]["message"]
    assert f"replica {victim}" in msg and "CORRUPT_LOG" in msg and f"PersistentVolumeClaim {pvc}" in msg, msg

    def recovered() -> dict[str, Any] | None:
        s = quorum_available(c)
        recs = (s or {}).get("recoveries") or []
        done = [r for r in recs if r.get("result") == "Succeeded" and r.get("oldUuid") == old_uuid]
        if s and done and voter_uuids(s).get(victim) == done[-1].get("newUuid"):
            return s
        return None

    final = c.wait_for(
        f"replica {victim} back on a new disk, voter set whole",
        recovered,
        timeout=400,
        interval=1.0,
        context=c.describe,
    )
    new_uuid = voter_uuids(final)[victim]
    assert new_uuid != old_uuid and UUID.match(new_uuid), (old_uuid, final["voters"])
    assert old_uuid not in voter_uuids(final).values() and len(final["voters"]) == 3
    assert c.get_json("pod", pod, "-n", QUORUM_NS)["metadata"]["uid"] != old_pod_uid
    assert c.get_json("pvc", pvc, "-n", QUORUM_NS)["spec"]["volumeName"] != old_pv
    writer.wait_acked(len(writer.acked()), "a write acknowledged after the replacement")
    acked = writer.stop()
    read_back(c, acked)
    print(
        f"\ndamaged disk replaced on the real kubelet: {len(acked)} acknowledged writes read back, "
        f"{time.monotonic() - began:.0f} s",
        flush=True,
    )
