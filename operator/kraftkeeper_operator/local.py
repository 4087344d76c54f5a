"""Local mode: ``kraftkeeper operator local`` supervises N ``kraftkeeper start`` processes on
loopback and runs the same :class:`RecoveryController` as the Kubernetes operator against them;
``kraftkeeper cluster replace-disk`` simulates a volume replacement on such a cluster.

Layout under DIR (created if missing)::

    cluster.json          cluster id, node count, base port (fixed at first start)
    node-<i>/             node i's data directory (meta.properties, log, quorum-state)
    node-<i>.log          node i's stdout+stderr, appended across restarts
    events/               the recovery event log (cluster name = DIR's base name)
    operator-state.json   recorded recovery progress (the quorum stays the source of truth)
    control/supervisor.pid, control/node-<i>.pid
    control/node-<i>.hold, control/node-<i>.stopped   the replace-disk handshake

Node i listens on 127.0.0.1:PORT+i; the supervisor serves ``/metrics``, ``/status`` (JSON: the
last controller status) and ``/healthz`` on 127.0.0.1:PORT.

Supervision rules: a node that exits is restarted (back-off doubling from 0.5 s to 5 s while it
keeps crashing). A node whose data directory has no meta.properties is formatted first, with a new
storage UUID (KIP-856 says a node must never invent its identity by itself; here the supervisor
plays the human who formats a replaced volume).

Initial versus replacement formatting (invariant): only the first formatting of a brand-new
cluster is *initial*. The supervisor formats every node directory before it starts any node, then
records ``"bootstrapped": true`` in cluster.json (so the rule survives supervisor restarts; a
crash in between simply formats the remaining directories initially on the next start, since no
node has run yet). Every later format - ``cluster replace-disk``, or the supervisor finding a wiped
directory - runs ``kraftkeeper format --no-initial-controllers`` (meta.properties gets
``bootstrap.initial=false``). A replacement disk must never count itself as one of the uuid-less
bootstrap voters: otherwise two replaced disks with empty logs could elect each other and
overwrite committed records (KIP-856 "storage UUID" motivation; the same flag as Kafka's KIP-853
``format --no-initial-controllers``). A cluster.json written before this key existed counts as
bootstrapped when any node directory is formatted. ``cluster replace-disk`` on a cluster that was
never started is refused: there is no disk to replace yet.

replace-disk handshake (so the supervisor never restarts a node whose directory is being wiped):
the command creates ``control/node-N.hold`` holding its pid; the supervisor stops node N (SIGTERM,
SIGKILL after a grace period), writes ``control/node-N.stopped`` and starts nothing for N while the
hold exists; the command then deletes ``node-N/``, formats it again, removes the hold, and the
supervisor starts the node with its new storage UUID. A hold whose owner process is gone is
removed by the supervisor, so a killed command cannot block a node forever. Without a running
supervisor the command does the same steps directly (there is no node process to stop).

Node processes get PR_SET_PDEATHSIG (Linux), so a supervisor killed with SIGKILL does not leave
orphaned nodes behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid as _uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from kraftkeeper_reports.events import RecoveryEvent
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .controller import ControllerStatus, RecoveryController
from .recovery import Order, PolicyError, Recovery, RecoveryPolicy
from .telemetry import EventLogSink, OperatorMetrics

log = logging.getLogger("kraftkeeper.operator.local")

DEFAULT_BASE_PORT = 19400
STOP_GRACE_S = 10.0


def _kraftkeeper_cmd() -> list[str]:
    """How to run the CLI: the same interpreter, so it works inside a venv without PATH."""
    return [sys.executable, "-m", "quorum.cli"]


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass
class ClusterLayout:
    """Paths and identity of a local cluster directory."""

    dir: Path
    cluster_id: str
    nodes: int
    base_port: int
    # True once every node directory got its initial format (see the module docstring).
    bootstrapped: bool = False

    @classmethod
    def _from_json(cls, d: Path) -> ClusterLayout:
        cfg = d / "cluster.json"
        try:
            data = json.loads(cfg.read_text())
            have = cls(d, str(data["cluster_id"]), int(data["nodes"]), int(data["base_port"]))
            flag = data.get("bootstrapped")
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(
                f"{cfg} is damaged ({type(e).__name__}: {e}); it names the cluster: fix it by hand"
            ) from None
        if flag is None:
            # Written before the flag existed: formatted directories mean nodes may have run.
            flag = any((have.data_dir(i) / "meta.properties").exists() for i in range(1, have.nodes + 1))
        have.bootstrapped = bool(flag)
        return have

    def save(self) -> None:
        _write_atomic(
            self.dir / "cluster.json",
            json.dumps(
                {
                    "cluster_id": self.cluster_id,
                    "nodes": self.nodes,
                    "base_port": self.base_port,
                    "bootstrapped": self.bootstrapped,
                }
            )
            + "\n",
        )

    @classmethod
    def load_or_create(cls, d: Path, nodes: int | None, base_port: int | None) -> ClusterLayout:
        d.mkdir(parents=True, exist_ok=True)
        cfg = d / "cluster.json"
        if cfg.exists():
            have = cls._from_json(d)
            if nodes is not None and nodes != have.nodes:
                raise ValueError(f"--nodes {nodes}: {d} was created with {have.nodes} nodes")
            if base_port is not None and base_port != have.base_port:
                raise ValueError(f"--base-port {base_port}: {d} was created with base port {have.base_port}")
            return have
        n = 3 if nodes is None else nodes
        if not 1 <= n <= 9:
            raise ValueError(f"--nodes {n}: must be between 1 and 9")
        port = DEFAULT_BASE_PORT if base_port is None else base_port
        if not 1024 <= port <= 65535 - n:
            raise ValueError(f"--base-port {port}: must leave room for {n} node ports below 65536")
        layout = cls(d, _uuid.uuid4().hex[:22], n, port)
        layout.save()
        return layout

    @classmethod
    def load(cls, d: Path) -> ClusterLayout:
        cfg = d / "cluster.json"
        if not cfg.exists():
            raise FileNotFoundError(
                f"{d} is not a cluster run by `kraftkeeper operator local` (no cluster.json)"
            )
        return cls._from_json(d)

    @property
    def name(self) -> str:
        return self.dir.resolve().name

    def endpoint(self, i: int) -> str:
        return f"127.0.0.1:{self.base_port + i}"

    def voters(self) -> str:
        return ",".join(f"{i}@{self.endpoint(i)}" for i in range(1, self.nodes + 1))

    def data_dir(self, i: int) -> Path:
        return self.dir / f"node-{i}"

    def control(self) -> Path:
        p = self.dir / "control"
        p.mkdir(exist_ok=True)
        return p

    def hold_file(self, i: int) -> Path:
        return self.control() / f"node-{i}.hold"

    def stopped_file(self, i: int) -> Path:
        return self.control() / f"node-{i}.stopped"

    def format(self, i: int, *, initial: bool = False) -> str:
        """Format node i's directory (new storage UUID); returns the UUID. ``initial`` only for
        the first formatting of a cluster that was never bootstrapped (:meth:`bootstrap`); any
        other format is a replacement disk (``--no-initial-controllers``)."""
        if initial and self.bootstrapped:
            raise ValueError(f"node {i}: {self.dir} is bootstrapped already; only replacement formats remain")
        out = subprocess.run(
            [
                *_kraftkeeper_cmd(),
                "format",
                "--dir",
                str(self.data_dir(i)),
                "--cluster-id",
                self.cluster_id,
                "--node-id",
                str(i),
                *([] if initial else ["--no-initial-controllers"]),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"format of node {i} failed: {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout.strip().splitlines()[-1].strip()

    def formatted(self, i: int) -> bool:
        return (self.data_dir(i) / "meta.properties").exists()

    def bootstrap(self) -> None:
        """Give every unformatted node directory its initial format, then record the cluster as
        bootstrapped. Must run before any node starts; a no-op once bootstrapped."""
        if self.bootstrapped:
            return
        for i in range(1, self.nodes + 1):
            if not self.formatted(i):
                log.info("formatted node %d (initial): storage uuid %s", i, self.format(i, initial=True))
        self.bootstrapped = True
        self.save()

    def ensure_formatted(self, i: int) -> str | None:
        """Format node i's directory as a replacement disk if it has no meta.properties (wiped by
        hand); returns the new UUID, or None if it was formatted already."""
        if self.formatted(i):
            return None
        if not self.bootstrapped:
            raise RuntimeError(f"node {i}: {self.dir} was never bootstrapped; refusing to start nodes")
        return self.format(i)


@dataclass
class NodeProc:
    index: int
    proc: asyncio.subprocess.Process | None = None
    failures: int = 0
    next_start: float = 0.0
    started_at: float = 0.0
    restarts: int = 0
    log_fh: Any = field(default=None, repr=False)


class Supervisor:
    """Starts, watches and restarts the node processes of one local cluster."""

    def __init__(self, layout: ClusterLayout) -> None:
        self.layout = layout
        self.nodes = {i: NodeProc(i) for i in range(1, layout.nodes + 1)}
        self.stopping = False
        self.internal_hold: set[int] = set()  # nodes the supervisor itself keeps stopped

    async def run_offline(self, i: int, *cli_args: str) -> subprocess.CompletedProcess[str]:
        """Stop node i, run ``kraftkeeper CLI_ARGS`` against its stopped directory, restart it."""
        self.internal_hold.add(i)
        try:
            await self._stop(self.nodes[i])
            return await asyncio.to_thread(
                subprocess.run,
                [*_kraftkeeper_cmd(), *cli_args],
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
        if n.log_fh is None:
            # Kept open across restarts; opening a local file does not block the loop noticeably.
            n.log_fh = open(lay.dir / f"node-{n.index}.log", "ab")  # noqa: ASYNC230
        n.proc = await asyncio.create_subprocess_exec(
            *_kraftkeeper_cmd(),
            "start",
            "--dir",
            str(lay.data_dir(n.index)),
            "--listen",
            lay.endpoint(n.index),
            "--voters",
            lay.voters(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=n.log_fh,
            stderr=n.log_fh,
            preexec_fn=_set_pdeathsig,
        )
        n.started_at = time.monotonic()
        _write_atomic(lay.control() / f"node-{n.index}.pid", f"{n.proc.pid}\n")
        log.info("started node %d (pid %d) on %s", n.index, n.proc.pid, lay.endpoint(n.index))

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
        if owner and not _pid_alive(owner):
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
                    _write_atomic(stopped, f"{os.getpid()}\n")
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
            if n.proc is None and now >= n.next_start and not self.stopping:
                try:
                    await self._start(n)
                except (OSError, RuntimeError) as e:
                    n.failures += 1
                    n.next_start = now + 5.0
                    log.error("cannot start node %d: %s", n.index, e)

    async def stop_all(self) -> None:
        self.stopping = True
        await asyncio.gather(*(self._stop(n) for n in self.nodes.values()))
        for n in self.nodes.values():
            if n.log_fh is not None:
                n.log_fh.close()
                n.log_fh = None


def _load_records(path: Path) -> list[Recovery]:
    if not path.exists():
        return []
    try:
        return [Recovery.from_dict(d) for d in json.loads(path.read_text())]
    except (ValueError, KeyError, TypeError) as e:
        # Only a hint: the quorum is the source of truth, so a damaged file costs nothing.
        log.warning("ignoring unreadable %s: %s", path, e)
        return []


async def run_local(
    layout: ClusterLayout,
    policy: RecoveryPolicy,
    *,
    interval: float = 0.5,
    stop: asyncio.Event | None = None,
) -> None:
    """Supervise the cluster and run the recovery controller until ``stop`` is set."""
    from quorum.client import QuorumClient

    stop = stop or asyncio.Event()
    control = layout.control()
    pidfile = control / "supervisor.pid"
    if pidfile.exists():
        try:
            other = int(pidfile.read_text().strip())
        except ValueError:
            other = 0
        if other and other != os.getpid() and _pid_alive(other):
            raise RuntimeError(f"{layout.dir} is already supervised by pid {other}")
    _write_atomic(pidfile, f"{os.getpid()}\n")
    try:
        # Before any node runs: the one moment an initial format is safe (module docstring).
        await asyncio.to_thread(layout.bootstrap)
    except BaseException:
        pidfile.unlink(missing_ok=True)
        raise

    metrics = OperatorMetrics()
    state_path = layout.dir / "operator-state.json"

    async def persist(records: list[dict[str, Any]]) -> None:
        await asyncio.to_thread(_write_atomic, state_path, json.dumps(records, indent=1) + "\n")

    client = QuorumClient([layout.endpoint(i) for i in range(1, layout.nodes + 1)], timeout=3.0)
    ctl = RecoveryController(
        client,
        policy,
        cluster=layout.name,
        sink=EventLogSink(layout.dir / "events", layout.name),
        metrics=metrics,
        records=_load_records(state_path),
        persist=persist,
        # Membership repair: if the voter ids ever differ from 1..N (after an unclean recovery, or
        # an interrupted RemoveThenAdd whose progress file was lost), reassign back to 1..N.
        # --no-recovery means "never change voters": no repair either.
        desired_ids=list(range(1, layout.nodes + 1)) if policy.enabled else None,
    )
    last: dict[str, Any] = {"conditions": [], "recoveries": []}

    async def h_metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def h_status(_: web.Request) -> web.Response:
        return web.json_response(last)

    async def h_health(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application()
    app.add_routes(
        [web.get("/metrics", h_metrics), web.get("/status", h_status), web.get("/healthz", h_health)]
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", layout.base_port)
    await site.start()
    sup = Supervisor(layout)
    unclean_done = False
    try:
        while not stop.is_set():
            await sup.supervise_once()
            if ctl.unreachable_since_ms is None:
                unclean_done = False
            elif policy.unclean_allowed and not unclean_done:
                gone_s = time.time() - ctl.unreachable_since_ms / 1000
                if gone_s >= policy.unclean_after_seconds:
                    unclean_done = await _unclean_recovery(layout, sup, ctl, gone_s)
            try:
                st: ControllerStatus = await asyncio.wait_for(ctl.reconcile(), timeout=max(5.0, 4 * interval))
                last = st.to_status()
                last["supervisor"] = {
                    str(n.index): {"pid": n.proc.pid if n.proc else None, "restarts": n.restarts}
                    for n in sup.nodes.values()
                }
            except TimeoutError:
                log.warning("reconcile took too long; retrying")
            except Exception:  # the supervisor must outlive any controller bug
                log.exception("reconcile failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
    finally:
        await sup.stop_all()
        await client.close()
        await runner.cleanup()
        with contextlib.suppress(FileNotFoundError):
            pidfile.unlink()


def _meta_uuid(d: Path) -> str | None:
    try:
        for line in (d / "meta.properties").read_text().splitlines():
            if line.startswith("directory.id="):
                return line.split("=", 1)[1].strip()
    except OSError:
        return None
    return None


def _log_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*.log") if f.is_file())


async def _unclean_recovery(
    layout: ClusterLayout, sup: Supervisor, ctl: RecoveryController, gone_s: float
) -> bool:
    """KIP-704 style last resort, only when the policy allows it and the quorum has had no live
    majority for ``unclean_after_seconds``: among the nodes whose storage UUID was a voter in the
    last healthy view, the one with the highest log end offset in that view (then the most log
    bytes on disk: reading the log of a running node is not safe) is stopped, ``kraftkeeper quorum
    recover-unclean`` makes it the sole voter (RECOVERING, then RECOVERED once it verified its
    state), and it is restarted; the reassignment to nodes 1..N then re-adds the others. Records
    committed only on the lost replicas are lost: the event log says so. Returns True if done."""
    view = ctl.last_good_view
    if view is None:
        log.error("quorum lost, unclean recovery allowed, but no healthy view was ever seen: not guessing")
        return True
    voter_keys = {(v.id, v.uuid) for v in view.voters}
    cands = [i for i in range(1, layout.nodes + 1) if (i, _meta_uuid(layout.data_dir(i))) in voter_keys]
    if not cands:
        log.error("quorum lost and no former voter's disk survives: unclean recovery impossible")
        return True
    # Most up to date first by what the leader last reported (log end offset), then by bytes on
    # disk; the lower id breaks ties.
    leo = {(v.id, v.uuid): v.log_end_offset for v in view.voters}
    survivor = max(
        cands,
        key=lambda i: (
            leo.get((i, _meta_uuid(layout.data_dir(i)) or ""), -1),
            _log_bytes(layout.data_dir(i)),
            -i,
        ),
    )
    out = await sup.run_offline(
        survivor, "quorum", "recover-unclean", "--dir", str(layout.data_dir(survivor))
    )
    detail = {
        "reason": f"no live majority for {gone_s:.0f}s",
        "candidates": cands,
        "exit_code": out.returncode,
        "output": (out.stdout or out.stderr).strip()[-500:],
    }
    ctl.sink.emit(
        RecoveryEvent(
            "unclean_recovery",
            str(_uuid.uuid4()),
            survivor,
            None,
            _meta_uuid(layout.data_dir(survivor)),
            detail=detail,
        )
    )
    log.warning("unclean recovery of node %d: %s", survivor, detail["output"])
    return True


def _policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--stabilization-seconds",
        type=float,
        default=5.0,
        help="how long a new replica must stay caught up before AddVoter (default 5)",
    )
    p.add_argument("--max-lag", type=int, default=100, help="records behind still counted as caught up")
    p.add_argument("--order", choices=[o.value for o in Order], default=Order.ADD_THEN_REMOVE.value)
    p.add_argument("--timeout-seconds", type=float, default=600.0)
    p.add_argument("--live-window-seconds", type=float, default=5.0)
    p.add_argument("--no-recovery", action="store_true", help="supervise only; never change voters")
    p.add_argument(
        "--unclean-after-seconds",
        type=float,
        default=None,
        help="allow KIP-704 unclean recovery after this long without a live majority (off by default: "
        "records committed only on the lost replicas are lost)",
    )


def policy_from_args(a: argparse.Namespace) -> RecoveryPolicy:
    spec = {
        "enabled": not a.no_recovery,
        "order": a.order,
        "stabilizationSeconds": a.stabilization_seconds,
        "maxLagRecords": a.max_lag,
        "timeoutSeconds": a.timeout_seconds,
        "liveWindowSeconds": a.live_window_seconds,
    }
    unclean = None
    if a.unclean_after_seconds is not None:
        unclean = {"enabled": True, "afterSeconds": a.unclean_after_seconds}
    return RecoveryPolicy.from_spec(spec, unclean)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"INVALID_REQUEST: {self.prog}: {message}\n")
        raise SystemExit(2)


def local_main(argv: list[str]) -> int:
    """``kraftkeeper operator local --dir DIR [--nodes 3] [--base-port PORT] [policy options]``."""
    p = _Parser(prog="kraftkeeper operator local")
    p.add_argument("--dir", required=True)
    p.add_argument("--nodes", type=int, default=None, help="number of nodes (default 3; fixed at creation)")
    p.add_argument(
        "--base-port",
        type=int,
        default=None,
        help=f"operator port; node i on PORT+i (default {DEFAULT_BASE_PORT})",
    )
    p.add_argument("--interval", type=float, default=0.5, help="seconds between controller passes")
    _policy_args(p)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        policy = policy_from_args(a)
        layout = ClusterLayout.load_or_create(Path(a.dir), a.nodes, a.base_port)
    except (PolicyError, ValueError) as e:
        sys.stderr.write(f"INVALID_REQUEST: {e}\n")
        return 2

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_local(layout, policy, interval=a.interval, stop=stop)

    try:
        asyncio.run(main())
    except (RuntimeError, OSError) as e:
        sys.stderr.write(f"UNAVAILABLE: {e}\n")
        return 1
    return 0


def replace_disk(layout: ClusterLayout, node: int, *, timeout: float = 60.0) -> str:
    """Stop node ``node`` (through the supervisor if one runs), wipe and re-format its data
    directory; returns the new storage UUID. Raises ValueError/TimeoutError with a clear message."""
    if not 1 <= node <= layout.nodes:
        raise ValueError(f"--node {node}: the cluster has nodes 1..{layout.nodes}")
    if not layout.bootstrapped:
        raise ValueError(
            f"{layout.dir} has never been started (cluster.json: not bootstrapped), so there is no disk"
            " to replace yet; run `kraftkeeper operator local` first"
        )
    hold, stopped = layout.hold_file(node), layout.stopped_file(node)
    try:
        fd = os.open(hold, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        raise ValueError(f"node {node} is already being replaced ({hold} exists)") from None
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    try:
        pidfile = layout.control() / "supervisor.pid"
        sup = int(pidfile.read_text().strip() or 0) if pidfile.exists() else 0
        if sup and _pid_alive(sup):
            deadline = time.monotonic() + timeout
            while not stopped.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"supervisor (pid {sup}) did not stop node {node} within {timeout:g}s")
                time.sleep(0.05)
        else:
            node_pid = layout.control() / f"node-{node}.pid"
            if node_pid.exists():
                pid = int(node_pid.read_text().strip() or 0)
                if pid and _pid_alive(pid):
                    raise ValueError(f"node {node} (pid {pid}) runs without a supervisor; stop it first")
        shutil.rmtree(layout.data_dir(node), ignore_errors=True)
        return layout.format(node)
    finally:
        with contextlib.suppress(FileNotFoundError):
            hold.unlink()


def replace_disk_main(argv: list[str]) -> int:
    """``kraftkeeper cluster replace-disk --dir DIR --node N``: prints the new storage UUID."""
    p = _Parser(prog="kraftkeeper cluster replace-disk")
    p.add_argument("--dir", required=True)
    p.add_argument("--node", type=int, required=True)
    p.add_argument("--timeout", type=float, default=60.0)
    a = p.parse_args(argv)
    try:
        layout = ClusterLayout.load(Path(a.dir))
        new = replace_disk(layout, a.node, timeout=a.timeout)
    except (FileNotFoundError, ValueError) as e:
        sys.stderr.write(f"INVALID_REQUEST: {e}\n")
        return 2
    except (TimeoutError, RuntimeError) as e:
        sys.stderr.write(f"UNAVAILABLE: {e}\n")
        return 1
    print(f"Replaced the disk of node {a.node} in {a.dir}")
    print(new)
    return 0
