"""The Kafka membership backend: :class:`KafkaQuorum` implements the operator's ``QuorumApi``
(describe / add_voter / remove_voter) against an Apache Kafka 4.x controller quorum.

It talks to the controllers directly (``bootstrap.controllers``, KIP-919), or to brokers where
that is all the user gives (a broker forwards DescribeQuorum, AddRaftVoter and RemoveRaftVoter to
the active controller and answers like the raft leader): DescribeQuorum
(kafka-python's message classes) to the raft leader, found by asking each bootstrap controller in
turn (a non-leader answers NOT_LEADER_OR_FOLLOWER), else where DescribeCluster says the active
controller is (the bootstrap list need not name the leader), and remembered; AddRaftVoter and
RemoveRaftVoter (KIP-853, classes generated from Kafka's published schemas, schemas.py) to the same
leader. The answer of DescribeQuorum v2 is turned into the operator's describe object
(docs/reference.md, ``quorum describe --json``):

* directory ids: Kafka's ``ReplicaDirectoryId`` becomes the canonical 8-4-4-4-12 UUID (the same
  128 bits that Kafka prints in base64url); Kafka's zero Uuid ("not known") becomes "";
* timestamps are the leader's wall clock: they are shifted by (our clock - the leader's own
  ``LastFetchTimestamp``, which Kafka sets to its "now"), so liveness windows do not depend on
  clock skew between the operator and the controllers;
* ``lag`` is the leader's log end offset minus the replica's (as Kafka's own tool computes it);
* ``endpoint`` comes from the v2 ``Nodes`` list; AddRaftVoter sends that node's listeners
  (KIP-853: the new voter's endpoints are part of the voter record).

Kafka's errors map onto the engine's codes so the controller's retry / refuse rules apply
unchanged (:mod:`quorum.kafka.mapping`, shared with the node's Kafka listener, holds the tables
and the DescribeQuorum mapping). Two need the quorum to interpret them: Kafka answers
DUPLICATE_VOTER for *any* second directory id of a voter id (it keeps one per id, unlike KIP-856),
so it means "already added" only when this very (id, directory id) is the voter, and otherwise a
refusal (the reason the default order for Kafka is RemoveThenAdd); VOTER_NOT_FOUND on removal
means the (id, directory id) is not a voter: already removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid as _uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

from kafka.protocol.admin import (  # type: ignore[import-untyped]
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeQuorumRequest,
    DescribeQuorumResponse,
)

from quorum.kafka.mapping import (
    API_ADD_RAFT_VOTER,
    API_DESCRIBE_CLUSTER,
    API_DESCRIBE_QUORUM,
    API_REMOVE_RAFT_VOTER,
    METADATA_TOPIC,
    describe_from_response,
    kafka_error,
)
from quorum.kafka.schemas import SchemaJarMissing, membership_messages
from quorum.types import ErrorCode, KraftError

from .clientconf import ClientSettings
from .wire import KafkaConnection, KafkaWireError, register_response

log = logging.getLogger(__name__)
T = TypeVar("T")

register_response(DescribeQuorumRequest, DescribeQuorumResponse)
register_response(DescribeClusterRequest, DescribeClusterResponse)

def _membership() -> dict[str, Any]:
    msgs = membership_messages()
    register_response(msgs["AddRaftVoterRequest"], msgs["AddRaftVoterResponse"])
    register_response(msgs["RemoveRaftVoterRequest"], msgs["RemoveRaftVoterResponse"])
    return msgs


def parse_bootstrap(text: str, option: str = "--kafka-bootstrap-controllers") -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{option}: {item!r} is not HOST:PORT")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError(f"{option}: no HOST:PORT given")
    return out


class KafkaQuorum:
    """``QuorumApi`` over a Kafka controller quorum. ``reassign`` is refused (UNSUPPORTED): Kafka
    has no KIP-642 reassignment; voter ids change only through single Add/RemoveRaftVoter calls.

    Timeouts, as Kafka's clients name them (the client properties, wire.py): ``timeout`` bounds one
    request to one controller, connecting and authenticating included (``request.timeout.ms``);
    ``api_timeout`` bounds one whole operation (``default.api.timeout.ms``): a describe that tries
    every bootstrap controller, or a voter change with the describes it needs (plus the change's
    own ``change_timeout_ms``, which Kafka spends waiting for the commit). A controller that
    accepts a connection and then never answers costs one operation at most that long, never the
    caller's whole loop. All I/O is asyncio on the caller's event loop: no thread, no executor."""

    def __init__(
        self,
        bootstrap: list[tuple[str, int]] | str,
        settings: ClientSettings | None = None,
        *,
        timeout: float | None = None,
        api_timeout: float | None = None,
        change_timeout_ms: int = 15000,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap) if isinstance(bootstrap, str) else list(bootstrap)
        self.settings = settings or ClientSettings()
        self.timeout = timeout if timeout is not None else self.settings.request_timeout_ms / 1000
        api = api_timeout if api_timeout is not None else self.settings.api_timeout_ms / 1000
        self.api_timeout = max(api, self.timeout)
        self.change_timeout_ms = change_timeout_ms
        self.cluster_id: str | None = None
        self._conns: dict[tuple[str, int], KafkaConnection] = {}
        self._leader: tuple[str, int] | None = None
        # node id -> [(listener name, host, port)]; persisted by the watcher across restarts.
        self.listeners: dict[int, list[tuple[str, str, int]]] = {}
        self.clock = time.time

    # -- connections ---------------------------------------------------------------------------

    async def _conn(self, addr: tuple[str, int]) -> KafkaConnection:
        c = self._conns.get(addr)
        if c is not None and not c.closed:
            return c
        c = await KafkaConnection.open(addr[0], addr[1], self.settings, within=self.timeout)
        self._conns[addr] = c
        return c

    async def _drop(self, addr: tuple[str, int]) -> None:
        c = self._conns.pop(addr, None)
        if c is not None:
            await c.close()

    async def _cluster_id(self, c: KafkaConnection) -> str | None:
        """DescribeCluster: a controller answers EndpointType 2 (KIP-919), a broker type 1."""
        if API_DESCRIBE_CLUSTER not in c.api_versions:
            return None
        v = c.version_for(API_DESCRIBE_CLUSTER, 0, 2)
        for endpoint_type in (2, 1) if v >= 1 else (1,):
            req = DescribeClusterRequest(
                include_cluster_authorized_operations=False, endpoint_type=endpoint_type
            )
            resp = await c.request(req, v, self.timeout)
            if resp.error_code == 0 and resp.cluster_id:
                return str(resp.cluster_id)
        return None

    async def close(self) -> None:
        for addr in list(self._conns):
            await self._drop(addr)

    def operation_budget(self) -> float:
        """The longest one describe / add_voter / remove_voter may take (seconds)."""
        return self.api_timeout + self.change_timeout_ms / 1000

    async def _bounded(self, what: str, call: Awaitable[T], budget: float) -> T:
        """``call`` within ``budget`` seconds. Past it, every connection is dropped (the one that
        hung may have a response in flight) and the outcome is REQUEST_TIMED_OUT: for a voter
        change that means "unknown", the controller describes again before anything else."""
        try:
            async with asyncio.timeout(budget) as cm:
                return await call
        except TimeoutError:
            if not cm.expired():
                raise
        await self.close()
        raise KraftError(
            ErrorCode.REQUEST_TIMED_OUT,
            f"{what}: no outcome within {budget:g}s (default.api.timeout.ms) from "
            + ",".join(f"{h}:{p}" for h, p in self.bootstrap),
        )

    # -- describe ------------------------------------------------------------------------------

    async def _describe_at(self, addr: tuple[str, int]) -> tuple[Any | None, str]:
        """(response, "") from a leader, or (None, why not)."""
        try:
            c = await self._conn(addr)
            v = c.version_for(API_DESCRIBE_QUORUM, 0, 2)
            topic = DescribeQuorumRequest.TopicData
            req = DescribeQuorumRequest(
                topics=[topic(topic_name=METADATA_TOPIC, partitions=[topic.PartitionData(partition_index=0)])]
            )
            resp = await c.request(req, v, self.timeout)
        except (KafkaWireError, OSError, TimeoutError) as e:
            await self._drop(addr)
            return None, f"{addr[0]}:{addr[1]}: {e or type(e).__name__}"
        if resp.error_code != 0:
            return None, str(
                kafka_error(resp.error_code, getattr(resp, "error_message", None), "DescribeQuorum")
            )
        part = resp.topics[0].partitions[0]
        if part.error_code != 0:
            return None, f"{addr[0]}:{addr[1]}: " + str(
                kafka_error(part.error_code, getattr(part, "error_message", None), "DescribeQuorum")
            )
        return resp, ""

    async def _leader_describe(self) -> tuple[tuple[str, int], Any]:
        """The raft leader's DescribeQuorum: the remembered leader, then each bootstrap address,
        then where those say the leader is (:meth:`_leader_hints`): the bootstrap list need not
        name it (KIP-919 lets it be any of the controllers)."""
        order = ([self._leader] if self._leader else []) + [a for a in self.bootstrap if a != self._leader]
        tried: list[tuple[str, int]] = []
        why: list[str] = []
        for first in (True, False):
            for addr in order if first else await self._leader_hints(tried):
                if addr in tried:
                    continue
                tried.append(addr)
                resp, err = await self._describe_at(addr)
                if resp is not None:
                    self._leader = addr
                    if self.cluster_id is None:  # learned once, from the first leader that answers
                        with contextlib.suppress(KafkaWireError, TimeoutError, OSError):
                            self.cluster_id = await self._cluster_id(await self._conn(addr))
                    return addr, resp
                why.append(err)
        self._leader = None
        raise KraftError(
            ErrorCode.UNAVAILABLE, "no Kafka controller answered as raft leader: " + "; ".join(why)
        )

    async def _leader_hints(self, tried: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Where the leader may be when no address tried leads (a non-leader's DescribeQuorum
        answer, NOT_LEADER_OR_FOLLOWER, carries no endpoint): the controllers DescribeCluster lists,
        the active one first (KIP-919: a controller answers it with the quorum's controllers and
        the active one's id), asked of the first tried controller that answers it, then every
        controller an earlier DescribeQuorum v2 listed (``Nodes``)."""
        out: list[tuple[str, int]] = []
        for addr in tried:
            c = self._conns.get(addr)
            if c is None or c.closed or API_DESCRIBE_CLUSTER not in c.api_versions:
                continue
            with contextlib.suppress(KafkaWireError, TimeoutError, OSError):
                req = DescribeClusterRequest(include_cluster_authorized_operations=False, endpoint_type=2)
                resp = await c.request(req, c.version_for(API_DESCRIBE_CLUSTER, 1, 2), self.timeout)
                if resp.error_code == 0 and resp.brokers:
                    # The active one first; the others too, in case this controller's view of the
                    # registrations lags (a controller that just started).
                    nodes = sorted(resp.brokers, key=lambda b: b.broker_id != resp.controller_id)
                    out += [(str(b.host), int(b.port)) for b in nodes]
                    break
        for lst in self.listeners.values():
            out += [(h, p) for _, h, p in lst]
        return [a for i, a in enumerate(out) if a not in out[:i] and a not in tried]

    async def describe(self) -> dict[str, Any]:
        _, resp = await self._bounded("DescribeQuorum", self._leader_describe(), self.api_timeout)
        return self._to_describe(resp)

    def _to_describe(self, resp: Any) -> dict[str, Any]:
        return describe_from_response(resp, self.listeners, int(self.clock() * 1000), self.cluster_id or "")

    # -- membership ----------------------------------------------------------------------------

    async def _change(self, what: str, build: Any, api_key: int, max_v: int) -> Any:
        """Send a voter change to the leader; one retry after NOT_LEADER / a dropped connection."""
        last: KraftError | None = None
        for _ in range(2):
            addr, _resp = await self._leader_describe()
            try:
                c = await self._conn(addr)
                v = c.version_for(api_key, 0, max_v)
                resp = await c.request(build(), v, self.change_timeout_ms / 1000 + self.timeout)
            except (KafkaWireError, OSError) as e:
                await self._drop(addr)
                last = KraftError(ErrorCode.UNAVAILABLE, f"{what}: {e}")
                continue
            except TimeoutError:
                await self._drop(addr)
                # The change may have been appended: outcome unknown (the controller re-describes).
                raise KraftError(
                    ErrorCode.REQUEST_TIMED_OUT, f"{what}: no answer from {addr[0]}:{addr[1]}"
                ) from None
            if resp.error_code == 0:
                return resp
            err = kafka_error(resp.error_code, resp.error_message, what)
            if err.code is ErrorCode.NOT_LEADER:
                self._leader = None
                last = err
                continue
            raise err
        assert last is not None
        raise last

    async def add_voter(self, id: int, uuid: str) -> dict[str, Any]:
        what = f"AddRaftVoter({id}, {uuid})"
        return await self._bounded(what, self._add_voter(what, id, uuid), self.operation_budget())

    async def _add_voter(self, what: str, id: int, uuid: str) -> dict[str, Any]:
        try:
            msgs = _membership()
        except SchemaJarMissing as e:
            raise KraftError(ErrorCode.UNSUPPORTED, f"{what}: {e}") from None
        req_cls = msgs["AddRaftVoterRequest"]
        d = await self.describe()  # refreshes the known listeners (DescribeQuorum v2 Nodes)
        listeners = self.listeners.get(id) or self._guess_listeners(d, id)
        if not listeners:
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"{what}: the endpoints of controller {id} are unknown (Kafka lists only voters' "
                "endpoints); list every controller in --kafka-bootstrap-controllers",
            )

        def build() -> Any:
            return req_cls(
                cluster_id=self.cluster_id,
                timeout_ms=self.change_timeout_ms,
                voter_id=id,
                voter_directory_id=_uuid.UUID(uuid),
                listeners=[req_cls.Listener(name=n, host=h, port=p) for n, h, p in listeners],
                ack_when_committed=True,
            )

        try:
            await self._change(what, build, API_ADD_RAFT_VOTER, 1)
        except KraftError as e:
            if e.extra.get("kafka_error") == "DUPLICATE_VOTER":
                d = await self.describe()
                if not any(v["id"] == id and v["uuid"] == uuid for v in d["voters"]):
                    # Kafka keeps one directory id per voter id: this is a refusal, not "done".
                    raise KraftError(
                        ErrorCode.INVALID_REQUEST,
                        f"{e.message} (Kafka allows one directory id per voter id: remove the old one "
                        "first, order RemoveThenAdd)",
                        kafka_error="DUPLICATE_VOTER",
                    ) from None
            raise
        return {"id": id, "uuid": uuid}

    def _guess_listeners(self, d: dict[str, Any], id: int) -> list[tuple[str, str, int]] | None:
        """Endpoints of a controller whose listeners we never saw (e.g. the watcher restarted
        between RemoveRaftVoter and AddRaftVoter): the one bootstrap controller that is no current
        voter's endpoint, under the voters' listener name. None when that is ambiguous."""
        used = {v["endpoint"] for v in d["voters"] if v["endpoint"]}
        free = [a for a in self.bootstrap if f"{a[0]}:{a[1]}" not in used]
        names = {lst[0][0] for lst in self.listeners.values() if lst}
        if len(free) != 1 or len(names) != 1:
            return None
        return [(names.pop(), free[0][0], free[0][1])]

    async def remove_voter(self, id: int, uuid: str) -> dict[str, Any]:
        what = f"RemoveRaftVoter({id}, {uuid})"
        return await self._bounded(what, self._remove_voter(what, id, uuid), self.operation_budget())

    async def _remove_voter(self, what: str, id: int, uuid: str) -> dict[str, Any]:
        try:
            req_cls = _membership()["RemoveRaftVoterRequest"]
        except SchemaJarMissing as e:
            raise KraftError(ErrorCode.UNSUPPORTED, f"{what}: {e}") from None

        def build() -> Any:
            return req_cls(cluster_id=self.cluster_id, voter_id=id, voter_directory_id=_uuid.UUID(uuid))

        await self._change(what, build, API_REMOVE_RAFT_VOTER, 0)
        return {"id": id, "uuid": uuid}

    async def reassign(self, voters: list[int] | None) -> dict[str, Any]:
        raise KraftError(
            ErrorCode.UNSUPPORTED,
            "Kafka has no voter-set reassignment (KIP-642); change voters one at a time "
            "(kafka-metadata-quorum add-controller / remove-controller)",
        )

