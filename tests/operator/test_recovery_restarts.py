"""Recovery decisions over the in-memory quorum model when the operator itself stops: killed
between AddVoter and RemoveVoter (with its status kept or lost), during the AddVoter call (outcome
unknown), before issuing AddVoter, and restarted from the KRaftQuorum's status; each resumes
without a second AddVoter or a lost step."""

from __future__ import annotations

from kraftkeeper_operator.core.recovery import Recovery

from quorum.types import ErrorCode
from tests.operator.helpers import FULL
from tests.operator.recovery_rig import Rig, recovered


async def test_operator_killed_between_add_and_remove_resumes_from_status() -> None:
    rig = Rig()
    old = rig.q.current(3).uuid
    new = rig.q.replace_disk(3, lag=0)
    rig.crash_on("remove_voter")
    await rig.run_until_crash()
    assert (3, old) in rig.voters() and (3, new) in rig.voters()
    saved = [Recovery.from_dict(d) for d in rig.saved]
    rig.ctl = rig.controller(records=saved)  # a new operator process, status restored
    await rig.run_until(recovered)
    assert rig.changes()[-1] == ("remove_voter", (3, old))
    assert rig.voters() == {k for k in rig.voters() if k != (3, old)} and (3, new) in rig.voters()
    assert rig.sink.types() == FULL  # no step logged twice


async def test_operator_killed_between_add_and_remove_with_status_lost() -> None:
    rig = Rig()
    old = rig.q.current(3).uuid
    new = rig.q.replace_disk(3, lag=0)
    rig.crash_on("remove_voter")
    await rig.run_until_crash()
    for _ in range(5):  # the old voter stops looking live
        rig.clock.t += 1
        rig.q.tick()
    rig.ctl = rig.controller(records=())  # nothing recorded survived: the quorum decides
    await rig.run_until(recovered)
    assert rig.changes()[-1] == ("remove_voter", (3, old))
    assert (3, new) in rig.voters() and (3, old) not in rig.voters()
    assert "recovery_resumed" in rig.sink.types()


async def test_operator_killed_during_add_voter_call_outcome_unknown() -> None:
    rig = Rig()
    old = rig.q.current(3).uuid
    new = rig.q.replace_disk(3, lag=0)
    # The AddVoter commits, but the answer is lost (timeout): the next run reads the quorum.
    rig.q.fail_next("add_voter", ErrorCode.REQUEST_TIMED_OUT, apply=True)
    await rig.run_until(recovered)
    assert [c for c in rig.changes() if c[0] == "add_voter"] == [("add_voter", (3, new))]
    assert rig.changes()[-1] == ("remove_voter", (3, old))
    assert rig.sink.types().count("add_voter_committed") == 1


async def test_operator_killed_before_issuing_add_resumes() -> None:
    rig = Rig()
    rig.q.replace_disk(3, lag=0)
    await rig.run_until(lambda s: any(r["phase"] == "CaughtUp" for r in s.recoveries) or bool(rig.changes()))
    rig.ctl = rig.controller(records=[Recovery.from_dict(d) for d in rig.saved])
    await rig.run_until(recovered)
    assert [c[0] for c in rig.changes()] == ["add_voter", "remove_voter"]


async def test_operator_restart_from_crd_status_between_add_and_remove() -> None:
    rig = Rig()
    old = rig.q.current(3).uuid
    rig.q.replace_disk(3, lag=0)
    rig.crash_on("remove_voter")
    await rig.run_until_crash()
    crd = [Recovery.from_dict(d).to_crd_status() for d in rig.saved]  # what had been persisted
    rig.ctl = rig.controller(records=[Recovery.from_crd_status(d) for d in crd])
    await rig.run_until(recovered)
    assert rig.changes()[-1] == ("remove_voter", (3, old))
    assert rig.sink.types() == FULL
