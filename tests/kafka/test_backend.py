"""The Kafka membership backend against real Kafka 4.x controllers: DescribeQuorum mapped onto our
describe object, and a disk replacement healed by hand through AddRaftVoter / RemoveRaftVoter
(the messages generated from the schemas in Kafka's own jar)."""

from __future__ import annotations

from typing import Any

import pytest
from kraftkeeper_operator.kafka.backend import KafkaQuorum
from kraftkeeper_operator.kafka.cluster import KafkaControllers

from quorum.kafka.mapping import base64_to_uuid, uuid_to_base64
from quorum.types import ErrorCode, KraftError
from testkit.polling import async_wait_until
from tests.kafka.watcher import NOT_YET

pytestmark = pytest.mark.slow


def _uuid(k: KafkaControllers, i: int) -> str:
    d = k.controllers[i].directory_id()
    assert d is not None
    return str(base64_to_uuid(d))


async def retrying(call: Any, within: float = 60) -> Any:
    """Kafka answers REQUEST_TIMED_OUT when it cannot act yet (e.g. its ApiVersions check of a new
    voter that is still starting): its "try again", as the watcher does. Any other error fails."""

    async def answered() -> tuple[Any] | None:
        try:
            return (await call(),)  # a tuple: the call's own result may be falsy
        except KraftError as e:
            if e.code is not ErrorCode.REQUEST_TIMED_OUT:
                raise
            return None

    return (await async_wait_until("an answer other than REQUEST_TIMED_OUT", answered, within, 0.5))[0]


async def _healthy(q: KafkaQuorum) -> dict[str, Any] | None:
    d = await q.describe()
    # The cluster id comes from DescribeCluster, which a controller answers once it is ready.
    ok = d["cluster_id"] and len(d["voters"]) == 3 and all(v["lag"] == 0 for v in d["voters"])
    return d if ok else None


async def test_describe_maps_kafka_quorum(kafka_controllers: KafkaControllers) -> None:
    k = kafka_controllers
    q = KafkaQuorum(k.bootstrap)
    try:
        d = await async_wait_until("a healthy quorum", lambda: _healthy(q), 90, 0.2, errors=NOT_YET)
        assert d["cluster_id"] == k.cluster_id
        assert d["leader_id"] in (1, 2, 3) and d["leader_epoch"] >= 1 and d["high_watermark"] > 0
        got = {(v["id"], v["uuid"], v["endpoint"]) for v in d["voters"]}
        assert got == {(i, _uuid(k, i), c.endpoint) for i, c in k.controllers.items()}
        for v in d["voters"]:
            assert uuid_to_base64(v["uuid"]) == k.controllers[v["id"]].directory_id()
            assert v["last_fetch_timestamp"] > 0
        with pytest.raises(KraftError) as e:
            await q.reassign([1, 2, 3])
        assert e.value.code is ErrorCode.UNSUPPORTED
    finally:
        await q.close()


async def test_manual_replacement_through_backend(kafka_controllers: KafkaControllers) -> None:
    k = kafka_controllers
    q = KafkaQuorum(k.bootstrap)
    try:
        d = await async_wait_until("a healthy quorum", lambda: _healthy(q), 90, 0.2, errors=NOT_YET)
        victim = next(i for i in (1, 2, 3) if i != d["leader_id"])
        old = _uuid(k, victim)
        new = str(base64_to_uuid(k.replace_disk(victim)))
        assert new != old

        async def observer() -> bool:
            d = await q.describe()
            return any(o["id"] == victim and o["uuid"] == new and o["lag"] == 0 for o in d["observers"])

        await async_wait_until("the new directory as a caught-up observer", observer, 90, 0.2, errors=NOT_YET)
        # Kafka keeps one directory id per voter id: AddThenRemove is refused (DUPLICATE_VOTER).
        with pytest.raises(KraftError) as e:
            await q.add_voter(victim, new)
        assert e.value.code is ErrorCode.INVALID_REQUEST and "DUPLICATE_VOTER" in e.value.message
        await retrying(lambda: q.remove_voter(victim, old))
        with pytest.raises(KraftError) as e:
            await q.remove_voter(victim, old)
        assert e.value.code is ErrorCode.VOTER_ALREADY_REMOVED
        await retrying(lambda: q.add_voter(victim, new))
        with pytest.raises(KraftError) as e:
            await q.add_voter(victim, new)
        assert e.value.code is ErrorCode.VOTER_ALREADY_ADDED
        d = await async_wait_until("a healthy quorum", lambda: _healthy(q), 60, 0.2, errors=NOT_YET)
        assert {(v["id"], v["uuid"]) for v in d["voters"]} == {(i, _uuid(k, i)) for i in k.controllers}
        assert (victim, new) in {(v["id"], v["uuid"]) for v in d["voters"]}
    finally:
        await q.close()


async def test_the_leader_is_found_outside_the_bootstrap_list(kafka_controllers: KafkaControllers) -> None:
    """A bootstrap list naming one follower (KIP-919 lets it be any controllers): the follower
    answers DescribeQuorum with NOT_LEADER_OR_FOLLOWER, and the client follows DescribeCluster's
    active controller; after the leader dies, it finds the new one the same way."""
    k = kafka_controllers
    full = KafkaQuorum(k.bootstrap)
    try:
        d = await async_wait_until("a healthy quorum", lambda: _healthy(full), 90, 0.2, errors=NOT_YET)
    finally:
        await full.close()
    leader = d["leader_id"]
    follower = next(i for i in k.controllers if i != leader)
    q = KafkaQuorum(k.controllers[follower].endpoint)
    try:
        # Polled: a controller lists the others in DescribeCluster once their registrations reached
        # its metadata log, which may lag right after the quorum came up (the operator's next pass
        # retries the same way).
        got = await async_wait_until("a description", q.describe, 60, 0.2, errors=NOT_YET)
        assert got["leader_id"] == leader and got["cluster_id"] == k.cluster_id
        assert {v["id"] for v in got["voters"]} == set(k.controllers)
        # The leader gone: a new one is elected among the other two, and found from the follower.
        k.stop(leader, kill=True)

        async def new_leader() -> dict[str, Any] | None:
            d = await q.describe()
            return d if d["leader_id"] not in (-1, leader) else None

        d = await async_wait_until("a new leader", new_leader, 90, 0.2, errors=NOT_YET)
        assert d["leader_id"] in set(k.controllers) - {leader}
        # The DescribeQuorum came from the new leader itself: its own entry is "now".
        assert q._leader == ("127.0.0.1", k.controllers[d["leader_id"]].port)
    finally:
        await q.close()
