"""The node: an asyncio driver that pumps the pure core (``quorum.core``) against real
storage, a real network and a real clock.

One loop owns the core. RPC handlers and client requests step the core and wake the loop;
the loop takes a ``Ready`` and handles it in the documented order (``quorum/core/ready.py``):
truncate, snapshot chunks / install, append, quorum state, fsync (off the event loop, so
requests keep arriving and the next batch grows: group commit), ``advance``, send messages,
apply committed records to the KV store, complete client waits.

Invariants kept here:
* nothing is sent before what it promises is durable (messages go out after the fsync);
* a client write is acknowledged only after its record is committed AND applied;
* a read is served only after the core confirmed leadership (read index) and the KV store
  has applied up to that index (linearizable).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from quorum.core import messages as m
from quorum.core.ready import LeaderBatch, Outbound, Ready
from quorum.records import data_records, decode_batches
from quorum.runtime import kv as kvmod
from quorum.runtime import wire
from quorum.runtime.config import NodeConfig
from quorum.runtime.metrics import Registry
from quorum.types import ErrorCode, KraftError, OffsetAndEpoch, ReplicaKey

log = logging.getLogger("kraftkeeper.node")


def _expire(fut: asyncio.Future[None], offset: int) -> None:
    if not fut.done():
        fut.set_exception(
            KraftError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"write at offset {offset} not committed in time; it may or may not take effect",
            )
        )


class DurableReader:
    """The core's ``LogReader``: the log and its snapshots."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def read(self, offset: int, max_bytes: int) -> bytes:
        # Everything appended, flushed or not, as Kafka's leader does: followers then fsync in
        # parallel with the leader instead of after it. Safe because the high watermark counts
        # the leader's own log end only once it is fsynced (``advance``) and a follower's fetch
        # offset only once the follower has fsynced (it fetches again after its own flush), so
        # a committed record is always durable on a majority.
        lg = self.node.log
        if offset >= lg.end_offset:
            return b""
        return lg.read(offset, max_bytes)

    def read_snapshot(self, snapshot: OffsetAndEpoch, position: int, max_bytes: int) -> tuple[bytes, int]:
        chunk, total = self.node.snapshots.read_chunk(snapshot, position, max_bytes)
        return chunk, total


class Node:
    """One replica: storage + core + HTTP server."""

    def __init__(
        self,
        data_dir: str,
        listen: str,
        voters: dict[int, str],
        cfg: NodeConfig,
        advertise: str | None = None,
    ) -> None:
        from quorum.storage import open_storage

        self.data_dir = data_dir
        self.listen = listen
        self.advertise = advertise or listen
        self.cfg = cfg
        self.meta, self.qstore, self.log, self.snapshots, summary = open_storage(
            data_dir, segment_bytes=cfg.segment_bytes, fsync=cfg.fsync
        )
        self.node_id: int = self.meta.node_id
        self.local = ReplicaKey(self.meta.node_id, self.meta.storage_uuid)
        self.metrics = Registry()
        self.kv = kvmod.KVStore()
        self.applied_end = summary.log_start_offset  # exclusive end of what the KV store applied
        self.applied_epoch = summary.snapshot.epoch if summary.snapshot else 0
        if summary.snapshot is not None:
            _controls, chunks = self.snapshots.load(summary.snapshot)
            self.kv.load_snapshot(chunks, summary.snapshot.offset - 1)
            self.applied_end = summary.snapshot.offset
        self._bytes_since_snapshot = 0
        self._wall0 = time.time()
        self._mono0 = time.monotonic()
        from quorum.core.raft import RaftCore

        self.core_config = cfg.core_config(voters, self.advertise, self.meta.initial_bootstrap)
        qstate = self.qstore.load(self.meta.cluster_id)
        self.core = RaftCore(
            self.core_config,
            self.local,
            self.meta.cluster_id,
            qstate,
            summary,
            DurableReader(self),
            random.Random(),
            self.now_ms(),
        )
        self._wake = asyncio.Event()
        self._ids = itertools.count(1)
        self._rpc_waiters: dict[int, tuple[asyncio.Future[Any], int]] = {}
        self._proposals: dict[int, asyncio.Future[None]] = {}
        self._reads: dict[int, asyncio.Future[int]] = {}
        self._read_waiting: list[tuple[int, asyncio.Future[None]]] = []  # (index, fut) until applied
        self._admin: dict[int, asyncio.Future[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self._recovering = False  # a KIP-704 verification task is running
        self._applied = asyncio.Event()  # set whenever the KV store applied more records
        self._busy_s = 0.0  # seconds the loop spent handling Ready (poll-idle-ratio)
        self._busy_mark = 0.0
        self._idle_since = time.monotonic()
        self._snapshotting = False
        self.role = "unattached"
        self.leader_id = -1
        self.leader_endpoint: str | None = None
        self.epoch = qstate.leader_epoch
        self.high_watermark = 0
        self._commit_t0: dict[int, float] = {}

    # ---- clock ------------------------------------------------------------------------------
    def now_ms(self) -> int:
        """Wall-clock milliseconds that never go backwards (timestamps in describe are
        epoch ms, KIP-836 style)."""
        return int((self._wall0 + (time.monotonic() - self._mono0)) * 1000)

    # ---- lifecycle --------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        from quorum.runtime.server import build_app

        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=64, keepalive_timeout=30),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        app = build_app(self, max_body=kvmod.MAX_VALUE_BYTES + 64 * 1024)
        runner = aiohttp.web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        host, _, port = self.listen.rpartition(":")
        site = aiohttp.web.TCPSite(runner, host or "0.0.0.0", int(port), reuse_address=True, backlog=1024)
        await site.start()
        log.info(
            "node %s (%s) listening on %s, advertising %s",
            self.node_id,
            self.local.uuid,
            self.listen,
            self.advertise,
        )
        loop_task = asyncio.create_task(self._loop())
        tick_task = asyncio.create_task(self._ticker())
        try:
            await stop.wait()
            await self._graceful_shutdown()
        finally:
            self._stopping = True
            tick_task.cancel()
            self._wake.set()
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(loop_task, tick_task, *self._tasks, return_exceptions=True)
            await runner.cleanup()
            await self._session.close()
            self.log.close()

    async def _graceful_shutdown(self) -> None:
        """KIP-595: a leader resigning on shutdown sends EndQuorumEpoch with its preferred
        successors so the next election starts at once instead of after a fetch timeout."""
        resign = getattr(self.core, "shutdown", None) or getattr(self.core, "resign", None)
        if resign is None:
            return
        try:
            resign(self.now_ms())
        except Exception:
            log.exception("resign on shutdown failed")
            return
        self._wake.set()
        # Let the EndQuorumEpoch requests go out (bounded: peers may be down).
        await asyncio.sleep(0.05)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)

    async def _ticker(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.cfg.tick_ms / 1000)
            self.core.tick(self.now_ms())
            self._wake.set()

    async def _loop(self) -> None:
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            t0 = time.monotonic()
            try:
                progressed = await self._handle_ready()
            except KraftError as e:
                log.error("stopping: %s", e)
                raise
            self._busy_s += time.monotonic() - t0
            if progressed:
                self._wake.set()
                # Event.wait() returns without yielding when the event is already set: give
                # the handlers a turn so a busy core can never starve the network.
                await asyncio.sleep(0)

    # ---- Ready ------------------------------------------------------------------------------
    async def _handle_ready(self) -> bool:
        core = self.core
        rd: Ready = core.ready()
        if rd.is_empty():
            return False
        loop = asyncio.get_running_loop()
        if rd.truncate_to is not None:
            self.log.truncate_to(rd.truncate_to)
            if (
                self.applied_end > rd.truncate_to
            ):  # pragma: no cover - the core never truncates committed data
                raise KraftError(
                    ErrorCode.CORRUPT_LOG, f"truncation to {rd.truncate_to} below applied {self.applied_end}"
                )
        for ch in rd.snapshot_chunks:
            if ch.position == 0:
                self.snapshots.begin_download(ch.snapshot_id)
            self.snapshots.write_chunk(ch.snapshot_id, ch.position, ch.data)
        if rd.install_snapshot is not None:
            self._install_snapshot(rd.install_snapshot)
        appended = 0
        for b in rd.append:
            if isinstance(b, LeaderBatch):
                data = b.encode()
                self.log.append_batches(data, [b.info(len(data))])
                records = b.count
            else:
                data = b.data
                self.log.append_batches(data, list(b.infos))
                records = b.next_offset - b.base_offset
            appended += 1
            self.metrics.inc("append-records", records, help="Records appended to the local log")
            self.metrics.inc("append-bytes", len(data), help="Bytes appended to the local log")
        if rd.quorum_state is not None:
            qs = rd.quorum_state
            await loop.run_in_executor(None, self.qstore.save, qs)
        if appended:
            # Fetch responses for what was just written go out before the leader's own fsync.
            for out in core.appended(self.log.end_offset, self.now_ms()):
                self._dispatch(out)
        if rd.flush or appended:
            await loop.run_in_executor(None, self.log.flush)
        core.advance(rd, self.log.end_offset)
        for out in rd.messages:
            self._dispatch(out)
        if rd.commit is not None:
            self._apply_to(rd.commit)
        now = time.monotonic()
        for pr in rd.proposal_results:
            fut = self._proposals.pop(pr.last_offset, None)
            t0 = self._commit_t0.pop(pr.last_offset, None)
            if t0 is not None and pr.error is ErrorCode.NONE:
                self.metrics.histogram("commit_latency_seconds", "Time from propose to commit").observe(
                    now - t0
                )
            if fut is not None and not fut.done():
                if pr.error is ErrorCode.NONE:
                    fut.set_result(None)
                else:
                    fut.set_exception(KraftError(pr.error, pr.message or "write outcome unknown"))
        for rr in rd.reads:
            rfut = self._reads.pop(rr.read_id, None)
            if rfut is not None and not rfut.done():
                if rr.error is ErrorCode.NONE:
                    rfut.set_result(rr.index)
                else:
                    rfut.set_exception(self._leader_error(rr.error, rr.message))
        for ar in rd.admin_results:
            afut = self._admin.pop(ar.request_id, None)
            if afut is not None and not afut.done():
                if ar.error is ErrorCode.NONE:
                    afut.set_result(None)
                else:
                    afut.set_exception(
                        KraftError(
                            ar.error,
                            ar.message,
                            leader_id=ar.leader_id,
                            leader_epoch=ar.leader_epoch,
                            leader_endpoint=ar.leader_endpoint,
                        )
                    )
        if rd.role_change is not None:
            rc = rd.role_change
            if rc.role != self.role or rc.epoch != self.epoch:
                log.info("role %s epoch %d leader %d", rc.role, rc.epoch, rc.leader_id)
            self.role, self.epoch, self.leader_id, self.leader_endpoint = (
                rc.role,
                rc.epoch,
                rc.leader_id,
                rc.leader_endpoint,
            )
            if rc.election_latency_ms is not None:
                self.metrics.histogram("election_latency_seconds", "Time to elect a leader").observe(
                    rc.election_latency_ms / 1000
                )
        if rd.recovery_needed and not self._recovering:
            self._recovering = True
            self._spawn(self._verify_recovery())
        for e in rd.errors:
            log.warning("%s", e)
        return True

    def _install_snapshot(self, sid: OffsetAndEpoch) -> None:
        try:
            self.snapshots.finish_download(sid)  # verifies every CRC before the rename
            controls, chunks = self.snapshots.load(sid, verify_crc=False)
            self.kv.load_snapshot(chunks, sid.offset - 1)
        except KraftError as e:
            log.error("fetched snapshot %s rejected: %s", sid, e)
            self.core.snapshot_rejected(sid, str(e))
            return
        self.log.reset_to_snapshot(sid)
        self.applied_end = sid.offset
        self.applied_epoch = sid.epoch
        self.core.snapshot_installed(sid, tuple(controls))
        log.info("installed snapshot %s", sid)

    # ---- state machine ------------------------------------------------------------------------
    def _apply_to(self, hw: int) -> None:
        self.high_watermark = max(self.high_watermark, hw)
        while self.applied_end < hw:
            data = self.log.read(self.applied_end, 16 * 1024 * 1024)
            if not data:
                break
            batches, _ = decode_batches(data, verify_crc=False)
            for b in batches:
                if b.info.base_offset >= hw:
                    break
                if not b.info.is_control:
                    self.kv.apply_batch(b.info.base_offset, data_records(b))
                self._bytes_since_snapshot += b.info.size_bytes
                self.applied_end = b.info.next_offset
                self.applied_epoch = b.info.epoch
            else:
                continue
            break
        self._applied.set()
        if self._read_waiting:
            still = []
            for index, fut in self._read_waiting:
                if self.applied_end >= index:
                    if not fut.done():
                        fut.set_result(None)
                else:
                    still.append((index, fut))
            self._read_waiting = still
        if self._bytes_since_snapshot >= self.cfg.snapshot_bytes and not self._snapshotting:
            self._spawn(self._take_snapshot())

    async def _take_snapshot(self) -> None:
        """KIP-630: snapshot the state machine at the applied offset, then let the log start
        move past it. The map is copied on the loop (cheap), serialized off it."""
        self._snapshotting = True
        try:
            sid = OffsetAndEpoch(self.applied_end, self.applied_epoch)
            controls = self.core.controls_at(sid.offset)
            copy = kvmod.KVStore()
            copy.data = dict(self.kv.data)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(
                None, lambda: self.snapshots.write(sid, controls, copy.snapshot_chunks())
            )
            self._bytes_since_snapshot = 0
            self.core.snapshot_taken(sid, sid.offset)
            self.log.delete_before(sid.offset)
            self.snapshots.delete_older_than(sid)
            self.metrics.inc("snapshots", help="Snapshots taken")
            log.info("snapshot %s taken", sid)
            self._wake.set()
        except Exception:
            log.exception("snapshot failed")
        finally:
            self._snapshotting = False

    async def _verify_recovery(self) -> None:
        """KIP-704 style: the sole leader after an unclean recovery verifies that every
        committed batch decodes (CRCs) and the state machine rebuilt from them, snapshots,
        then tells the core it is RECOVERED."""
        from quorum.runtime.unclean import verify_local_state

        try:
            # The sole voter commits its whole log on its own; apply it all before verifying.
            deadline = time.monotonic() + 30
            while self.applied_end < self.log.end_offset and time.monotonic() < deadline:
                self._applied.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._applied.wait(), max(0.0, deadline - time.monotonic()))
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, verify_local_state, self.log)
            lost_after = self.log.end_offset
            await self._take_snapshot()
            self.core.recovery_verified(lost_after, self.now_ms())
            log.warning("unclean recovery verified: offsets at or after %d may have been lost", lost_after)
            self._wake.set()
        except Exception:
            log.exception("unclean recovery verification failed; staying RECOVERING")
        finally:
            self._recovering = False

    # ---- network ------------------------------------------------------------------------------
    def _spawn(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _dispatch(self, out: Outbound) -> None:
        msg = out.message
        if out.is_request:
            self._spawn(self._send_request(out))
            return
        waiter = self._rpc_waiters.pop(msg.correlation_id, None)
        if waiter is None:
            return  # the inbound request already timed out
        fut, original_cid = waiter
        if not fut.done():
            fut.set_result(dataclasses.replace(msg, correlation_id=original_cid))

    async def _send_request(self, out: Outbound) -> None:
        msg = out.message
        cid = msg.correlation_id
        resp: Any
        if out.destination_endpoint is None:
            resp = m.RpcFailed(cid, out.destination_id, "no endpoint known")
        else:
            timeout = self.core_config.request_timeout_ms / 1000
            if isinstance(msg, m.FetchRequest):
                timeout += msg.max_wait_ms / 1000
            path = m.RPC_PATHS[type(msg)]
            try:
                assert self._session is not None
                async with self._session.post(
                    f"http://{out.destination_endpoint}/raft/v1/{path}",
                    data=wire.encode(msg),
                    timeout=aiohttp.ClientTimeout(total=timeout),
                ) as r:
                    body = await r.read()
                    if r.status != 200:
                        resp = m.RpcFailed(cid, out.destination_id, f"HTTP {r.status}: {body[:200]!r}")
                    else:
                        resp = wire.decode(m.RESPONSE_FOR[type(msg)], body)
            except (TimeoutError, aiohttp.ClientError, OSError, KraftError) as e:
                resp = m.RpcFailed(cid, out.destination_id, f"{type(e).__name__}: {e}")
        if self._stopping:
            return
        self.core.step(resp, self.now_ms())
        self._wake.set()

    async def handle_rpc(self, path: str, body: bytes) -> bytes:
        cls = wire.REQUEST_BY_PATH.get(path)
        if cls is None:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"unknown RPC {path!r}")
        msg: Any = wire.decode(cls, body)
        self.metrics.inc(f"rpc-{path}-requests", help=f"{path} requests received")
        cid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._rpc_waiters[cid] = (fut, msg.correlation_id)
        self.core.step(dataclasses.replace(msg, correlation_id=cid), self.now_ms())
        self._wake.set()
        limit = self.core_config.request_timeout_ms / 1000
        if isinstance(msg, m.FetchRequest):
            limit += msg.max_wait_ms / 1000
        try:
            resp = await asyncio.wait_for(fut, limit)
        except TimeoutError:
            raise KraftError(ErrorCode.REQUEST_TIMED_OUT, f"{path} not answered in {limit:.1f}s") from None
        finally:
            self._rpc_waiters.pop(cid, None)
        return wire.encode(resp)

    # ---- client API ---------------------------------------------------------------------------
    def _leader_error(self, code: ErrorCode, message: str = "") -> KraftError:
        if code is ErrorCode.NOT_LEADER:
            return KraftError(
                code,
                message or f"node {self.node_id} is not the leader",
                leader_id=self.leader_id,
                leader_epoch=self.epoch,
                leader_endpoint=self.leader_endpoint,
            )
        return KraftError(code, message or code.value)

    def _check(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except KraftError as e:
            if e.code is ErrorCode.NOT_LEADER:
                raise self._leader_error(e.code, e.message) from None
            raise

    async def _write(self, record: bytes) -> int:
        last = self._check(lambda: self.core.propose([record], self.now_ms()))
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._proposals[last] = fut
        self._commit_t0[last] = time.monotonic()
        self._wake.set()
        # A timer handle rather than asyncio.wait_for: this is the hot path of every write.
        timer = loop.call_later(self.cfg.write_timeout_ms / 1000, _expire, fut, last)
        try:
            await fut
        finally:
            timer.cancel()
            self._proposals.pop(last, None)
            self._commit_t0.pop(last, None)
        self.metrics.inc("committed_writes", help="Client writes committed")
        return int(last)

    async def put(self, key: str, value: bytes) -> int:
        return await self._write(kvmod.encode_put(key, value))

    async def delete(self, key: str) -> int:
        return await self._write(kvmod.encode_delete(key))

    async def get(self, key: str) -> bytes | None:
        kvmod.check_key(key)
        rid = next(self._ids)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._reads[rid] = fut
        try:
            self._check(lambda: self.core.read_index(rid, self.now_ms()))
        except KraftError:
            self._reads.pop(rid, None)
            raise
        self._wake.set()
        try:
            index = await asyncio.wait_for(fut, self.cfg.write_timeout_ms / 1000)
            if self.applied_end < index:
                applied: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._read_waiting.append((index, applied))
                await asyncio.wait_for(applied, self.cfg.write_timeout_ms / 1000)
        except TimeoutError:
            raise KraftError(
                ErrorCode.REQUEST_TIMED_OUT, "leadership could not be confirmed in time"
            ) from None
        finally:
            self._reads.pop(rid, None)
        return self.kv.get(key)

    # ---- admin --------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Only the leader knows every replica's progress (KIP-595 DescribeQuorum goes to the
        leader); other nodes answer NOT_LEADER with the hint."""
        if self.role != "leader":
            raise self._leader_error(ErrorCode.NOT_LEADER)
        d: dict[str, Any] = self.core.describe(self.now_ms())
        return d

    async def _admin_call(self, start: Callable[[int], Any]) -> None:
        rid = next(self._ids)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._admin[rid] = fut
        try:
            self._check(lambda: start(rid))
        except KraftError:
            self._admin.pop(rid, None)
            raise
        self._wake.set()
        limit = (self.core_config.add_voter_timeout_ms + self.core_config.request_timeout_ms) / 1000
        try:
            await asyncio.wait_for(fut, limit)
        except TimeoutError:
            raise KraftError(ErrorCode.REQUEST_TIMED_OUT, "voter change not completed in time") from None
        finally:
            self._admin.pop(rid, None)

    def _voters_view(self) -> dict[str, Any]:
        try:
            d = self.core.describe(self.now_ms())
            return {"voters": [{"id": v["id"], "uuid": v["uuid"]} for v in d.get("voters", [])]}
        except KraftError:
            return {}

    async def add_voter(self, vid: int, uuid: str) -> dict[str, Any]:
        await self._admin_call(lambda rid: self.core.add_voter(rid, ReplicaKey(vid, uuid), self.now_ms()))
        return self._voters_view()

    async def remove_voter(self, vid: int, uuid: str) -> dict[str, Any]:
        await self._admin_call(lambda rid: self.core.remove_voter(rid, ReplicaKey(vid, uuid), self.now_ms()))
        return self._voters_view()

    async def reassign(self, ids: list[int] | None) -> dict[str, Any]:
        await self._admin_call(
            lambda rid: self.core.reassign(rid, None if ids is None else tuple(ids), self.now_ms())
        )
        return {"target_voters": ids, **self._voters_view()}

    # ---- observability ------------------------------------------------------------------------
    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready means the node knows a leader or is it (Strimzi #12760: readiness that reflects
        the quorum, not just a live process)."""
        ok = self.leader_id >= 0 and self.role in ("leader", "follower")
        return ok, {"ready": ok, "role": self.role, "leader_id": self.leader_id, "epoch": self.epoch}

    def log_state(self) -> dict[str, Any]:
        """What Raft's election compares, for choosing an unclean-recovery survivor (issue 12):
        the local log's last batch epoch and end offset, plus this node's view. No storage
        UUID (issue 8: nothing that helps impersonation is served unauthenticated)."""
        return {
            "node_id": self.node_id,
            "last_epoch": self.log.last_epoch,
            "end_offset": self.log.end_offset,
            "high_watermark": self.high_watermark,
            "role": self.role,
            "leader_id": self.leader_id,
            "epoch": self.epoch,
        }

    def metrics_text(self) -> str:
        r = self.metrics
        for name, value in self.core.metrics().items():
            if isinstance(value, str):
                r.set_state(name, value, help=f"raft {name} (KIP-595 / KIP-704)")
            elif isinstance(value, int | float):
                r.set(name, float(value), help=f"raft {name} (KIP-595 / KIP-856)")
        r.set("applied-offset", self.applied_end, help="Exclusive end offset applied to the KV store")
        r.set("kv-keys", len(self.kv.data), help="Keys in the KV store")
        elapsed = time.monotonic() - self._idle_since
        busy = self._busy_s - self._busy_mark
        r.set(
            "poll-idle-ratio",
            max(0.0, 1.0 - busy / elapsed) if elapsed > 0 else 1.0,
            help="Share of time the driver loop waited for work since the last scrape (KIP-595)",
        )
        self._idle_since, self._busy_mark = time.monotonic(), self._busy_s
        return r.render()
