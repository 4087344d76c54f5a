"""A damaged log is a lost disk, in local mode with real processes: a follower whose last batches
were damaged stops with CORRUPT_LOG; with the other two voters healthy, the supervisor moves its
directory aside (renamed, never deleted), the node restarts on a new disk under a new storage
UUID with its own certificate, and the recovery controller swaps it in (KIP-856). Every
acknowledged write reads back from the undamaged replicas."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from quorum.security.pki import identity_from_cert
from quorum.storage import METADATA_DIR
from quorum.storage.log import SegmentedLog
from quorum.storage.meta import load_meta
from testkit.polling import ANY_ERROR, wait_until
from tests.operator.operator_nodes import LocalCluster, hold

pytestmark = pytest.mark.slow


def _damage_second_last_batch(data: Path, rng: random.Random) -> tuple[str, int]:
    """Flip one bit inside the second-to-last batch of the last segment: a valid batch follows,
    so it can never pass for a torn append. Returns (segment name, position flipped)."""
    mdir = data / METADATA_DIR
    with SegmentedLog(mdir, sync_on_open=False) as lg:
        infos = lg.batch_infos()
    seg = sorted(mdir.glob("*.log"))[-1]
    positions = [p for _o, s, p in infos if s == int(seg.name[:20])]
    start, end = positions[-2], positions[-1]
    raw = bytearray(seg.read_bytes())
    at = rng.randrange(start, end)
    raw[at] ^= 1 << rng.randrange(8)
    seg.write_bytes(bytes(raw))
    return seg.name, at


def test_a_damaged_follower_is_moved_aside_and_replaced(tmp_path: Path) -> None:
    d = tmp_path / "dmg"
    c = LocalCluster(d, 3, extra=["--stabilization-seconds", "1", "--live-window-seconds", "3"])
    try:
        first = wait_until("a leader and 3 known voters", c.describe_all_known, 90, errors=ANY_ERROR)
        for i in range(4):
            assert c.kk("kv", "put", "--bootstrap", c.bootstrap(), f"d-{i}", f"v{i}").returncode == 0
        victim = next(v["id"] for v in first["voters"] if v["id"] != first["leader_id"])
        old = next(v["uuid"] for v in first["voters"] if v["id"] == victim)

        def caught_up() -> bool:
            x = c.describe() or {}
            end = max((v.get("log_end_offset", -1) for v in x.get("voters", [])), default=-1)
            return any(v["id"] == victim and v.get("log_end_offset") == end for v in x.get("voters", []))

        wait_until("the victim caught up", caught_up, 60, errors=ANY_ERROR)
        h = hold(d, victim)
        wait_until(
            "the victim stopped",
            lambda: (d / "control" / f"node-{victim}.stopped").exists(),
            60,
            errors=ANY_ERROR,
        )
        seg, _ = _damage_second_last_batch(d / f"node-{victim}", random.Random(856))
        h.unlink()  # the supervisor starts it again: it stops on its damaged log

        def swapped() -> dict[str, Any] | None:
            x = c.describe()
            if not x or x["pending_voter_change"] is not None or x["leader_id"] <= 0:
                return None
            keys = {(v["id"], v["uuid"]) for v in x["voters"]}
            news = [u for i, u in keys if i == victim and u != old]
            return x if news and (victim, old) not in keys and len(keys) == 3 else None

        after = wait_until("the damaged disk replaced", swapped, 150, errors=ANY_ERROR)
        new = next(v["uuid"] for v in after["voters"] if v["id"] == victim)
        # The damaged log is kept beside, renamed; the node runs on a new disk with its own credential.
        aside = sorted(d.glob(f"node-{victim}.damaged-*"))
        assert len(aside) == 1 and (aside[0] / METADATA_DIR / seg).exists(), sorted(d.iterdir())
        assert load_meta(aside[0]).storage_uuid == old
        assert load_meta(d / f"node-{victim}").storage_uuid == new
        cert = x509.load_pem_x509_certificate((d / "tls" / f"node-{victim}.crt").read_bytes())
        assert identity_from_cert(cert).storage_uuid == new
        note = c.status()["damagedLogs"][str(victim)]
        assert (
            "CORRUPT_LOG" in note["message"] and seg in note["message"] and note["moved_to"] == str(aside[0])
        )
        assert "moved to" in c.log.read_text(errors="replace")
        for i in range(4):
            got = c.kk("kv", "get", "--bootstrap", c.bootstrap(), f"d-{i}")
            assert got.returncode == 0 and got.stdout.strip() == f"v{i}", got
    finally:
        assert c.stop() == 0, c.tail()
