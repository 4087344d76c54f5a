"""A Kafka-wire listener in front of a KRaftKeeper quorum, so Kafka's own tool works against it:
``kafka-metadata-quorum --bootstrap-controller HOST:PORT describe --status | --replication`` and
``add-controller`` / ``remove-controller``.

It answers the requests that tool's admin client sends to a controller (KIP-919
``bootstrap.controllers``): ApiVersions (18), DescribeCluster (60, the controller endpoint type),
DescribeQuorum (55, up to v2 of KIP-853), AddRaftVoter (80) and RemoveRaftVoter (81). Bodies are
encoded and decoded by kafka-python's schema-driven message classes; AddRaftVoter and
RemoveRaftVoter classes are generated from the schemas in Kafka's own jar (``schemas.py``).

Everything is answered from a small :class:`QuorumBackend` (describe / add_voter / remove_voter,
the engine's describe object and error codes; ``quorum.client.QuorumClient`` is one), so the
listener runs inside a node or as a stand-alone gateway (``python -m quorum.kafka``):

* storage UUIDs appear as Kafka directory ids (the same 128 bits; Kafka prints base64url);
* DescribeCluster names the raft leader as the active controller, at *this* listener's address,
  so the tool's follow-up requests come back here (our nodes' own endpoints speak HTTP);
* our refusals become Kafka's error codes (:mod:`quorum.kafka.mapping`): an id that already has a voter gives
  DUPLICATE_VOTER, a (id, UUID) that is no voter VOTER_NOT_FOUND, a pending change or a
  timeout REQUEST_TIMED_OUT, no leader NOT_LEADER_OR_FOLLOWER, with our message as ErrorMessage;
* an API version we do not speak gets that API's answer with UNSUPPORTED_VERSION (35) where the
  message has a top-level error code (ApiVersions answers v0 with our versions, as KIP-511 asks);
  an API key we do not implement gets UNSUPPORTED_VERSION the same way where kafka-python knows
  its response, and otherwise the connection is closed with the reason logged (as Kafka does for a
  request it cannot parse). Nothing is ever dropped silently.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import uuid as _uuid
from typing import Any, Protocol

from kafka.protocol.admin import (  # type: ignore[import-untyped]
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeQuorumRequest,
    DescribeQuorumResponse,
)
from kafka.protocol.api_header import ResponseClassRegistry  # type: ignore[import-untyped]
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse  # type: ignore[import-untyped]

from quorum.security.nodetls import is_loopback_host
from quorum.types import ErrorCode, KraftError

from .frames import REQUEST_HEADER_BYTES, FrameIdle, FrameSizeError, FrameStalled, read_frame
from .limits import KafkaLimits
from .mapping import UNSUPPORTED_VERSION, describe_quorum_response, kafka_code
from .schemas import SchemaJarMissing, membership_messages

log = logging.getLogger("kraftkeeper.kafka")

class QuorumBackend(Protocol):
    async def describe(self) -> dict[str, Any]: ...

    async def add_voter(self, id: int, uuid: str) -> dict[str, Any]: ...

    async def remove_voter(self, id: int, uuid: str) -> dict[str, Any]: ...

    async def reassign(self, voters: list[int] | None) -> dict[str, Any]: ...


# How long a RemoveRaftVoter carried out as a reassignment may take to commit before the answer
# says the outcome is unknown: within the admin client's default request timeout (30 s).
SHRINK_WAIT_S = 25.0


def _encode(resp: Any, version: int, correlation_id: int) -> bytes:
    """A framed response. The version is set before the header exists (kafka-python's setter
    would otherwise try to copy it into the response header, which has no such field)."""
    resp.API_VERSION = version
    resp.with_header(correlation_id=correlation_id)
    return bytes(resp.encode(header=True, framed=True))


class KafkaWireServer:
    """Serves Kafka's protocol on ``host:port`` from ``backend``; :meth:`start` / :meth:`close`."""

    def __init__(
        self,
        backend: QuorumBackend,
        host: str,
        port: int,
        *,
        cluster_id: str | None = None,
        advertised: tuple[str, int] | None = None,
        insecure: bool = False,
        limits: KafkaLimits | None = None,
    ) -> None:
        if not insecure and not is_loopback_host(host):
            # Secure by default: this listener speaks plaintext Kafka without authentication and
            # can change the voter set, so it stays on loopback unless the user says otherwise.
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"Kafka listener {host}:{port}: it has no TLS or authentication, so it binds to loopback "
                "only (127.0.0.1, ::1, localhost) unless --insecure is given",
            )
        self.backend = backend
        self.host, self.port = host, port
        self.cluster_id = cluster_id
        self.advertised = advertised
        self.limits = limits if limits is not None else KafkaLimits()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        try:
            self._membership: dict[str, Any] | None = membership_messages()
        except SchemaJarMissing as e:
            # describe still works; add-controller / remove-controller get UNSUPPORTED_VERSION.
            log.warning("Kafka listener without AddRaftVoter / RemoveRaftVoter: %s", e)
            self._membership = None
        self._apis: dict[int, tuple[Any, Any, int, int]] = {
            18: (ApiVersionsRequest, ApiVersionsResponse, 0, 4),
            55: (DescribeQuorumRequest, DescribeQuorumResponse, 0, 2),
            60: (DescribeClusterRequest, DescribeClusterResponse, 0, 2),
        }
        if self._membership is not None:
            m = self._membership
            self._apis[80] = (m["AddRaftVoterRequest"], m["AddRaftVoterResponse"], 0, 1)
            self._apis[81] = (m["RemoveRaftVoterRequest"], m["RemoveRaftVoterResponse"], 0, 0)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, self.host, self.port)
        sock = self._server.sockets[0].getsockname()
        self.port = int(sock[1])
        log.info("Kafka listener on %s:%d", self.host, self.port)

    async def close(self) -> None:
        """Stop accepting, close every open connection (its handler then sees end of stream)."""
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()

    # -- connection loop ------------------------------------------------------------------------

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lim = self.limits
        peer = writer.get_extra_info("peername")
        if len(self._writers) >= lim.max_connections:
            lim.refused_connections += 1
            log.warning("Kafka listener: refusing %s: %d connections open", peer, len(self._writers))
            writer.transport.abort()
            return
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._writers.add(writer)
        try:
            while True:
                try:
                    body = await read_frame(
                        reader,
                        min_size=REQUEST_HEADER_BYTES,
                        max_size=lim.max_frame,
                        idle_timeout=lim.idle_timeout_s,
                        read_timeout=lim.read_timeout_s,
                    )
                except asyncio.IncompleteReadError:
                    return  # the client closed the connection
                except FrameSizeError as e:
                    lim.refused_frames += 1
                    log.warning("Kafka listener: closing %s: request %s", peer, e)
                    return
                except (FrameIdle, FrameStalled) as e:
                    lim.timed_out += 1
                    log.info("Kafka listener: closing %s: %s", peer, e)
                    return
                try:
                    out = await self._dispatch(body, peer)
                except Exception:  # a bug here must cost one connection, with the reason logged
                    log.exception("Kafka listener: closing %s: request failed", peer)
                    return
                if out is None:
                    return
                writer.write(out)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()
            self._writers.discard(writer)
            if task is not None:
                self._tasks.discard(task)

    async def _dispatch(self, body: bytes, peer: Any) -> bytes | None:
        api_key, version, cid = struct.unpack(">hhi", body[:8])
        api = self._apis.get(api_key)
        if api is None or not api[2] <= version <= api[3]:
            return self._unsupported(api_key, version, cid, body, peer)
        req_cls, resp_cls, _, _ = api
        try:
            req = req_cls.decode(body, version=version, header=True)
        except Exception as e:  # a malformed body: Kafka closes such a connection, so do we
            log.warning("Kafka listener: closing %s: cannot parse API %d v%d: %s", peer, api_key, version, e)
            return None
        handler = {
            18: self._api_versions,
            55: self._describe_quorum,
            60: self._describe_cluster,
            80: self._add_voter,
            81: self._remove_voter,
        }[api_key]
        resp = await handler(req, resp_cls)
        return _encode(resp, version, cid)

    def _unsupported(self, api_key: int, version: int, cid: int, body: bytes, peer: Any) -> bytes | None:
        if api_key == 18:
            # KIP-511: an ApiVersions version we do not know is answered in v0 with our versions.
            return _encode(self._versions_response(ApiVersionsResponse, UNSUPPORTED_VERSION), 0, cid)
        resp_cls = ResponseClassRegistry._response_class_registry.get(api_key)
        fields = {f["name"] for f in resp_cls.json["fields"]} if resp_cls is not None else set()
        if resp_cls is not None and "ErrorCode" in fields and 0 <= version <= resp_cls.max_version:
            log.info(
                "Kafka listener: %s sent API %d v%d, not served: UNSUPPORTED_VERSION", peer, api_key, version
            )
            return _encode(resp_cls(error_code=UNSUPPORTED_VERSION), version, cid)
        log.warning(
            "Kafka listener: closing %s: API key %d v%d is not served and has no error answer to encode",
            peer,
            api_key,
            version,
        )
        return None

    # -- handlers -------------------------------------------------------------------------------

    def _versions_response(self, resp_cls: Any, error: int = 0) -> Any:
        keys = [
            resp_cls.ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, (_, _, lo, hi) in self._apis.items()
        ]
        return resp_cls(error_code=error, api_keys=keys, throttle_time_ms=0)

    async def _api_versions(self, req: Any, resp_cls: Any) -> Any:
        return self._versions_response(resp_cls)

    async def _describe(self) -> tuple[dict[str, Any] | None, KraftError | None]:
        try:
            d = await self.backend.describe()
        except KraftError as e:
            return None, e
        except (OSError, TimeoutError) as e:
            return None, KraftError(ErrorCode.UNAVAILABLE, f"quorum unreachable: {e}")
        if d.get("cluster_id"):
            self.cluster_id = str(d["cluster_id"])
        return d, None

    def _self_address(self) -> tuple[str, int]:
        return self.advertised or (self.host, self.port)

    async def _describe_cluster(self, req: Any, resp_cls: Any) -> Any:
        d, err = await self._describe()
        if d is None:
            assert err is not None
            return resp_cls(
                error_code=kafka_code(err),
                error_message=err.message,
                cluster_id=self.cluster_id or "",
                controller_id=-1,
                brokers=[],
                endpoint_type=2,
            )
        host, port = self._self_address()
        # The leader is the active controller, reachable at this listener (the tool sends its
        # DescribeQuorum / AddRaftVoter there).
        brokers = [
            resp_cls.DescribeClusterBroker(broker_id=int(d["leader_id"]), host=host, port=port, rack=None)
        ]
        return resp_cls(
            error_code=0,
            error_message=None,
            endpoint_type=2,
            cluster_id=str(d.get("cluster_id") or ""),
            controller_id=int(d["leader_id"]),
            brokers=brokers,
        )

    async def _describe_quorum(self, req: Any, resp_cls: Any) -> Any:
        d, err = await self._describe()
        return describe_quorum_response(resp_cls, d, err)

    def _check_cluster(self, req: Any) -> KraftError | None:
        want = getattr(req, "cluster_id", None)
        if want and self.cluster_id and want != self.cluster_id:
            return KraftError(
                ErrorCode.INCONSISTENT_CLUSTER_ID, f"cluster id {want!r}, this quorum is {self.cluster_id!r}"
            )
        return None

    async def _change(self, req: Any, resp_cls: Any, op: str) -> Any:
        if self.cluster_id is None:
            await self._describe()
        err = self._check_cluster(req)
        uuid = str(req.voter_directory_id) if req.voter_directory_id is not None else ""
        if err is None and (not uuid or _uuid.UUID(uuid).int == 0):
            err = KraftError(
                ErrorCode.INVALID_REQUEST, "a voter needs its directory id (KIP-856 storage UUID)"
            )
        if err is None:
            try:
                if op == "add":
                    await self.backend.add_voter(int(req.voter_id), uuid)
                else:
                    await self._remove(int(req.voter_id), uuid)
            except KraftError as e:
                err = e
            except (OSError, TimeoutError) as e:
                err = KraftError(ErrorCode.REQUEST_TIMED_OUT, f"outcome unknown: {e}")
        if err is None:
            return resp_cls(throttle_time_ms=0, error_code=0, error_message=None)
        log.info("Kafka listener: %s voter %s:%s refused: %s", op, req.voter_id, uuid, err)
        return resp_cls(
            throttle_time_ms=0, error_code=kafka_code(err), error_message=f"{err.code.value}: {err.message}"
        )

    async def _remove(self, vid: int, uuid: str) -> None:
        """RemoveRaftVoter. Our RemoveVoter removes a storage UUID and keeps the replica id among
        the voters (KIP-856), so it refuses the id's last UUID unless a replacement of that id is
        ready. On Kafka, removing a controller with no replacement shrinks the quorum; here that
        is a KIP-642 reassignment to the remaining voter ids, which the leader carries out one
        safe change at a time with its own checks (no other change pending, no leader recovering,
        every target a voter). Answered once the voter is gone, as Kafka answers after commit."""
        try:
            await self.backend.remove_voter(vid, uuid)
            return
        except KraftError as e:
            if e.code is not ErrorCode.INVALID_REQUEST:
                raise
            refused = e
        d = await self.backend.describe()
        voters = [(int(v["id"]), str(v["uuid"])) for v in d.get("voters", [])]
        # Only the one case: (vid, uuid) is a voter and the only one of its id. Anything else
        # (not a voter, a malformed id) keeps the engine's own refusal.
        if (vid, uuid) not in voters or any(i == vid and u != uuid for i, u in voters):
            raise refused
        target = sorted({i for i, _ in voters if i != vid})
        if not target:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"replica {vid} is the last voter")
        log.info("Kafka listener: removing voter %s:%s as a reassignment to %s", vid, uuid, target)
        await self.backend.reassign(target)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SHRINK_WAIT_S
        while True:
            d = await self.backend.describe()
            if all(int(v["id"]) != vid for v in d.get("voters", [])) and d.get("target_voters") is None:
                return
            if loop.time() >= deadline:
                raise KraftError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"the reassignment to {target} that removes replica {vid} is still in progress",
                )
            await asyncio.sleep(0.1)

    async def _add_voter(self, req: Any, resp_cls: Any) -> Any:
        return await self._change(req, resp_cls, "add")

    async def _remove_voter(self, req: Any, resp_cls: Any) -> Any:
        return await self._change(req, resp_cls, "remove")
