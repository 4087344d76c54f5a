"""Local mode's unclean-recovery store (kraftkeeper_operator/local/unclean.py): the survivor's
"restart" runs the real ``kraftkeeper quorum recover-unclean`` on its real directory with the
checks the Kubernetes init container makes: once per token (a marker in the directory), never on
a disk whose storage UUID is not the request's (replaced meanwhile), and a failure is reported
and retried only after a back-off, never papered over. The whole flow with running nodes is in
test_local.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from kraftkeeper_operator.local.cluster import ClusterLayout, meta_uuid
from kraftkeeper_operator.local.supervisor import Supervisor
from kraftkeeper_operator.local.unclean import LocalRequestStore
from kraftkeeper_operator.unclean import UncleanRequest

from tests.operator.operator_nodes import engine_missing
from tests.operator.test_unclean import _state_epoch


def _request(node: int, uuid: str | None, token: str = "0a1b") -> UncleanRequest:
    assert uuid is not None
    return UncleanRequest(token, node, node - 1, (uuid,), 0, outage_since_ms=0, requested_ms=0)


@pytest.mark.slow  # starts processes
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
async def test_local_store_recovers_the_survivor_once_and_never_a_replaced_disk(tmp_path: Path) -> None:
    layout = ClusterLayout.load_or_create(tmp_path / "c", 3, 41000)
    layout.bootstrap()  # the initial format of every node, as the supervisor's first start does
    d = layout.data_dir(2)
    store = LocalRequestStore(layout, Supervisor(layout))
    assert await store.load() is None
    req = _request(2, meta_uuid(d))
    await store.save(req)
    assert await store.load() == req
    await store.restart(1)
    assert (d / "unclean-recovery.0a1b.done").exists()
    epoch = _state_epoch(d)
    assert epoch >= 1
    await store.restart(1)  # restarted again (say the operator died before recording it): no repeat
    assert _state_epoch(d) == epoch
    # The disk was replaced meanwhile: the new one was never a voter, and is not recovered.
    d.rename(d.with_name("node-2.old"))
    assert layout.ensure_formatted(2) is not None
    await store.restart(1)
    assert not list(d.glob("unclean-recovery.*"))
    assert not (d / "__cluster_metadata-0" / "quorum-state").exists()


@pytest.mark.slow  # starts processes
@pytest.mark.skipif(engine_missing() is not None, reason=str(engine_missing()))
async def test_local_store_reports_a_failed_recovery_and_backs_off(tmp_path: Path) -> None:
    layout = ClusterLayout.load_or_create(tmp_path / "c", 3, 41000)
    layout.bootstrap()
    d = layout.data_dir(3)
    # A damaged quorum-state: recover-unclean refuses, and the refusal must surface.
    (d / "__cluster_metadata-0").mkdir(exist_ok=True)
    (d / "__cluster_metadata-0" / "quorum-state").write_text("garbage\n")
    store = LocalRequestStore(layout, Supervisor(layout))
    await store.save(_request(3, meta_uuid(d), token="c0ffee"))
    with pytest.raises(RuntimeError, match="recover-unclean on node 3 exited with"):
        await store.restart(2)
    with pytest.raises(RuntimeError, match="failed less than 30s ago"):
        await store.restart(2)
    assert not (d / "unclean-recovery.c0ffee.done").exists()
    with pytest.raises(RuntimeError, match="no unclean-recovery request for node 1"):
        await store.restart(0)
