"""The operator metrics the chart's alerts read (tests/alerts): counters present at 0 from the
first pass, so increase() sees the first failed or unclean recovery, and the age and timeout of
the oldest recovery in progress (KRaftKeeperRecoveryStuck)."""

from __future__ import annotations

from prometheus_client import generate_latest

from tests.operator.recovery_rig import Rig, recovered


def _text(rig: Rig) -> str:
    return generate_latest(rig.metrics.registry).decode()


async def test_counters_start_at_zero_and_recovery_age_is_published() -> None:
    rig = Rig()
    text = _text(rig)
    for series in ('kraftkeeper_operator_recoveries_total{quorum="test",result="failed"} 0.0',
                   'kraftkeeper_operator_recoveries_total{quorum="test",result="completed"} 0.0',
                   'kraftkeeper_operator_unclean_recoveries_total{quorum="test"} 0.0'):
        assert series in text, text
    await rig.step()
    assert 'kraftkeeper_operator_recoveries_in_progress{quorum="test"} 0.0' in _text(rig)
    assert 'kraftkeeper_operator_oldest_recovery_started_timestamp_seconds{quorum="test"} 0.0' in _text(rig)
    assert 'kraftkeeper_operator_recovery_timeout_seconds{quorum="test"} 300.0' in _text(rig)

    rig.q.replace_disk(3, lag=500)  # detected, never caught up
    await rig.step()
    detected_s = rig.metrics.oldest_recovery_started.labels("test")._value.get()
    assert detected_s > 0 and abs(detected_s - rig.clock.t) <= 1.0, (detected_s, rig.clock.t)
    assert 'kraftkeeper_operator_recoveries_in_progress{quorum="test"} 1.0' in _text(rig)
    # It stays the detection time while the recovery runs; 0 again once it ended.
    await rig.step(5)
    assert rig.metrics.oldest_recovery_started.labels("test")._value.get() == detected_s
    rig.q.set_lag(3, 0)
    await rig.run_until(recovered)
    await rig.step()
    assert 'kraftkeeper_operator_recoveries_in_progress{quorum="test"} 0.0' in _text(rig)
    assert 'kraftkeeper_operator_oldest_recovery_started_timestamp_seconds{quorum="test"} 0.0' in _text(rig)

    rig.metrics.forget("test")
    left = _text(rig)
    for name in ("recoveries_total", "unclean_recoveries_total", "recoveries_in_progress",
                 "oldest_recovery_started_timestamp_seconds", "recovery_timeout_seconds"):
        assert f'kraftkeeper_operator_{name}{{quorum="test"' not in left, name
