"""The process supervisor of local mode: starts, watches and restarts the ``kraftkeeper start``
processes of one local cluster (localcluster.py has the directory layout).

Supervision rules: a node that exits is restarted (back-off doubling from 0.5 s to 5 s while it
keeps crashing). A node whose data directory has no meta.properties is formatted first, as a
replacement disk, with a new storage UUID (KIP-856 says a node must never invent its identity by
itself; here the supervisor plays the human who formats a replaced volume). A held node (the
replace-disk handshake, localcluster.py) is stopped and kept stopped while its hold exists.

A damaged disk (docs/design.md "Torn writes and damage"): a node that exits with
``CORRUPT_LOG: FILE: ... at position P (offset O)`` in its log since its last start is a lost
disk. ``on_damage(i, message)`` (local.py) decides: True when a majority of the voters without
node i is healthy, and the supervisor then moves the data directory aside (renamed
``node-<i>.damaged-<UTC time>``, never deleted: the damaged log may still be the best copy
someone needs) so that the node restarts on a fresh directory under a new storage UUID, which the
recovery controller adds in place of the old (id, UUID) (KIP-856). False: nothing is moved; the
node keeps being restarted (and keeps refusing its log) until a person acts (``damage`` says
what).

Node processes get PR_SET_PDEATHSIG (Linux), so a supervisor killed with SIGKILL does not leave
orphaned nodes behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quorum.storage.atomic import fsync_dir
from quorum.timefmt import rfc3339

from .cluster import ClusterLayout, kraftkeeper_cmd, pid_alive, write_atomic

log = logging.getLogger("kraftkeeper.operator.local")

STOP_GRACE_S = 10.0


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class NodeProc:
    index: int
    proc: asyncio.subprocess.Process | None = None
    failures: int = 0
    next_start: float = 0.0
    started_at: float = 0.0
    restarts: int = 0
    log_fh: Any = field(default=None, repr=False)
    log_start: int = 0  # size of its log file when it last started: what it wrote since


class Supervisor:
    """Starts, watches and restarts the node processes of one local cluster."""

    def __init__(
        self,
        layout: ClusterLayout,
        node_config: Path | None = None,
        node_args: list[str] | None = None,
        before_start: Callable[[int], None] | None = None,
        on_damage: Callable[[int, str], bool] | None = None,
    ) -> None:
        self.layout = layout
        # run (in a thread) after node i's directory is formatted and before it starts: the
        # credential for the disk it starts on (localtls.py LocalTls.ensure_node)
        self.before_start = before_start
        self.node_config = node_config  # passed to every node as ``start --config``
        self.node_args = list(node_args or [])  # e.g. ``--tls-dir DIR/tls`` (localtls.py)
        self.nodes = {i: NodeProc(i) for i in range(1, layout.nodes + 1)}
        self.stopping = False
        self.internal_hold: set[int] = set()  # nodes the supervisor itself keeps stopped
        self.on_damage = on_damage
        # node -> its last CORRUPT_LOG stop: message, and what was done ("moved_to") or not
        self.damage: dict[int, dict[str, str]] = {}

    async def run_offline(self, i: int, *cli_args: str) -> subprocess.CompletedProcess[str]:
        """Stop node i, run ``kraftkeeper CLI_ARGS`` against its stopped directory, restart it."""
        self.internal_hold.add(i)
        try:
            await self._stop(self.nodes[i])
            return await asyncio.to_thread(
                subprocess.run,
                [*kraftkeeper_cmd(), *cli_args],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        finally:
            self.internal_hold.discard(i)

    async def _start(self, n: NodeProc) -> None:
        lay = self.layout
        uuid = await asyncio.to_thread(lay.ensure_formatted, n.index)
        if uuid is not None:
            log.warning("node %d had no meta.properties: formatted as a replacement, uuid %s", n.index, uuid)
        if self.before_start is not None:
            await asyncio.to_thread(self.before_start, n.index)
        if n.log_fh is None:
            # Kept open across restarts; opening a local file does not block the loop noticeably.
            n.log_fh = open(lay.dir / f"node-{n.index}.log", "ab")  # noqa: ASYNC230
        n.log_start = os.fstat(n.log_fh.fileno()).st_size
        n.proc = await asyncio.create_subprocess_exec(
            *kraftkeeper_cmd(),
            "start",
            "--dir",
            str(lay.data_dir(n.index)),
            "--listen",
            lay.endpoint(n.index),
            "--voters",
            lay.voters(),
            *(["--config", str(self.node_config)] if self.node_config is not None else []),
            *self.node_args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=n.log_fh,
            stderr=n.log_fh,
            preexec_fn=_set_pdeathsig,
        )
        n.started_at = time.monotonic()
        write_atomic(lay.control() / f"node-{n.index}.pid", f"{n.proc.pid}\n")
        log.info("started node %d (pid %d) on %s", n.index, n.proc.pid, lay.endpoint(n.index))

    async def restart(self, i: int) -> None:
        """Stop node i gracefully; the next :meth:`supervise_once` starts it again at once (a
        planned restart, e.g. with a renewed certificate, is not a crash: no back-off)."""
        n = self.nodes[i]
        await self._stop(n)
        n.next_start = 0.0
        n.restarts += 1

    async def _stop(self, n: NodeProc, grace: float = STOP_GRACE_S) -> None:
        p = n.proc
        if p is None:
            return
        if p.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
            try:
                await asyncio.wait_for(p.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()
        n.proc = None
        with contextlib.suppress(FileNotFoundError):
            (self.layout.control() / f"node-{n.index}.pid").unlink()

    def _held(self, i: int) -> bool:
        hold = self.layout.hold_file(i)
        try:
            owner = int(hold.read_text().strip() or "0")
        except FileNotFoundError:
            return False
        except ValueError:
            owner = 0
        if owner and not pid_alive(owner):
            log.warning("removing stale hold on node %d (owner pid %d is gone)", i, owner)
            with contextlib.suppress(FileNotFoundError):
                hold.unlink()
            return False
        return True

    async def supervise_once(self) -> None:
        """One pass: honour holds, restart exited nodes (with back-off)."""
        now = time.monotonic()
        for n in self.nodes.values():
            if n.index in self.internal_hold:
                continue
            if self._held(n.index):
                if n.proc is not None:
                    await self._stop(n)
                stopped = self.layout.stopped_file(n.index)
                if not stopped.exists():
                    write_atomic(stopped, f"{os.getpid()}\n")
                continue
            with contextlib.suppress(FileNotFoundError):
                self.layout.stopped_file(n.index).unlink()
            if n.proc is not None and n.proc.returncode is not None:
                rc = n.proc.returncode
                n.proc = None
                # A node that ran a while counts as healthy: reset the back-off.
                n.failures = 0 if now - n.started_at > 30 else n.failures + 1
                n.next_start = now + min(5.0, 0.5 * (2 ** max(0, n.failures - 1))) if n.failures else now
                n.restarts += 1
                log.warning("node %d exited with %s; restarting", n.index, rc)
                if rc != 0 and self._damaged(n):
                    n.failures, n.next_start = 0, now  # a fresh directory: start it at once
            if n.proc is None and now >= n.next_start and not self.stopping:
                try:
                    await self._start(n)
                except (OSError, RuntimeError) as e:
                    n.failures += 1
                    n.next_start = now + 5.0
                    log.error("cannot start node %d: %s", n.index, e)

    def gone(self) -> set[int]:
        """The nodes that cannot answer a probe: held stopped, or with no process running (in
        its restart back-off). A node whose process runs is not gone, even while it does not
        answer yet (starting, or too slow under load): unclean recovery waits for it
        (core/survivor.py ``decide_survivor``)."""
        return {
            n.index
            for n in self.nodes.values()
            if n.index in self.internal_hold
            or self._held(n.index)
            or n.proc is None
            or n.proc.returncode is not None
        }

    def corrupt_message(self, n: NodeProc) -> str | None:
        """The node's last ``CORRUPT_LOG`` line since its last start, if any."""
        path = self.layout.dir / f"node-{n.index}.log"
        try:
            with open(path, "rb") as f:
                f.seek(max(n.log_start, os.path.getsize(path) - 64 * 1024))
                text = f.read().decode(errors="replace")
        except OSError:
            return None
        lines = [ln.strip() for ln in text.splitlines() if "CORRUPT_LOG" in ln]
        return lines[-1][:500] if lines else None

    def _damaged(self, n: NodeProc) -> bool:
        """Node n stopped on a damaged log: move its directory aside if ``on_damage`` allows
        (module docstring). True if it was moved."""
        message = self.corrupt_message(n)
        if message is None or self.on_damage is None:
            return False
        note = {"message": message, "at": rfc3339()}
        if not self.on_damage(n.index, message):
            self.damage[n.index] = {**note, "action": "none: no healthy majority without this node"}
            return False
        src = self.layout.data_dir(n.index)
        dst = src.with_name(f"{src.name}.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
        try:
            os.rename(src, dst)
            # The move must outlive a power loss: otherwise the damaged log could come back
            # under node-<i>/ after the new disk was formatted beside it.
            fsync_dir(src.parent)
        except OSError as e:
            log.error("node %d: cannot move its damaged directory %s aside: %s", n.index, src, e)
            return False
        self.damage[n.index] = {**note, "action": "moved aside", "moved_to": str(dst)}
        log.warning(
            "node %d stopped on a damaged log (%s): its directory moved to %s; it restarts on a new disk",
            n.index,
            message,
            dst,
        )
        return True

    async def stop_all(self) -> None:
        self.stopping = True
        await asyncio.gather(*(self._stop(n) for n in self.nodes.values()))
        for n in self.nodes.values():
            if n.log_fh is not None:
                n.log_fh.close()
                n.log_fh = None
