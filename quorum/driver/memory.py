"""In-memory ports for tests and tools: a manual clock, a transport that queues what the
driver sends, a sink that records completions, and a dict state machine. The in-memory
storage ports (the one ``MemoryLog``, with power-loss ``crash()``) are in
``quorum.storage.memory``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from quorum.core.ready import AdminResult, Outbound, ProposalResult, ReadResult, RoleChange
from quorum.driver.ports import LogPort
from quorum.records import data_records, decode_batches
from quorum.types import ControlRecord


@dataclass
class ManualClock:
    now: int = 0

    def now_ms(self) -> int:
        return self.now


@dataclass
class QueueTransport:
    """Keeps every Outbound in ``sent``; the test delivers (or drops) them itself."""

    sent: list[Outbound] = field(default_factory=list)

    def send(self, out: Outbound) -> None:
        self.sent.append(out)


@dataclass
class RecordingSink:
    proposals: list[ProposalResult] = field(default_factory=list)
    reads: list[ReadResult] = field(default_factory=list)
    admin: list[AdminResult] = field(default_factory=list)
    roles: list[RoleChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    applied_end: int = 0
    recovery_requests: int = 0

    def proposal_done(self, result: ProposalResult) -> None:
        self.proposals.append(result)

    def read_done(self, result: ReadResult) -> None:
        self.reads.append(result)

    def admin_done(self, result: AdminResult) -> None:
        self.admin.append(result)

    def role_changed(self, view: RoleChange) -> None:
        self.roles.append(view)

    def applied(self, applied_end: int, applied_epoch: int) -> None:
        self.applied_end = applied_end

    def recovery_needed(self) -> None:
        self.recovery_requests += 1

    def note(self, message: str) -> None:
        self.notes.append(message)


@dataclass
class DictStateMachine:
    """Records that are JSON ``{"k": key, "v": value}`` set a key; any other record is kept
    under ``"@offset"``. A snapshot is one JSON chunk of the map."""

    data: dict[str, str] = field(default_factory=dict)
    applied: int = -1  # last applied offset

    def apply_batch(self, base_offset: int, records: Iterable[bytes]) -> None:
        off = base_offset - 1
        for i, rec in enumerate(records):
            off = base_offset + i
            try:
                cmd = json.loads(rec)
                self.data[str(cmd["k"])] = str(cmd["v"])
            except (ValueError, TypeError, KeyError):
                self.data[f"@{off}"] = rec.decode("utf-8", "replace")
        self.applied = max(self.applied, off)

    def load_snapshot(self, chunks: Iterable[bytes | memoryview], applied_offset: int) -> None:
        self.install_snapshot(self.prepare_snapshot(chunks), applied_offset)

    def prepare_snapshot(self, chunks: Iterable[bytes | memoryview]) -> object:
        return dict(json.loads(b"".join(chunks) or b"{}"))

    def install_snapshot(self, state: object, applied_offset: int) -> None:
        assert isinstance(state, dict)
        self.data = state
        self.applied = applied_offset

    def snapshot_chunks(self) -> list[bytes]:
        return [json.dumps(self.data, sort_keys=True).encode()]


def read_records(log: LogPort, start: int, end: int) -> list[tuple[int, int, bytes | ControlRecord, int]]:
    """``(offset, epoch, record, batch base offset)`` of every record in ``[start, end)`` of a
    log (data records as bytes, control records decoded): for tests and the simulation."""
    out: list[tuple[int, int, bytes | ControlRecord, int]] = []
    pos = start
    while pos < end:
        data = log.read(pos, 1 << 20, end) if pos < log.end_offset else b""
        if not data:
            break
        batches, _used = decode_batches(data, verify_crc=False)
        for b in batches:
            info = b.info
            recs: list[bytes | ControlRecord] = []
            recs.extend(info.controls if info.controls else data_records(b))
            for j, r in enumerate(recs):
                off = info.base_offset + j
                if start <= off < end:
                    out.append((off, info.epoch, r, info.base_offset))
            pos = info.next_offset
    return out
