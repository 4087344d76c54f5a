"""Local mode: ``kraftkeeper operator local`` supervises N ``kraftkeeper start`` processes on
loopback (supervisor.py) and runs the same :class:`RecoveryController` as the Kubernetes operator
against them; ``kraftkeeper cluster replace-disk`` simulates a volume replacement on such a cluster
(localcluster.py: the directory layout, the formatting rules and the replace-disk handshake).

The supervisor serves ``/metrics``, ``/status`` (JSON: the last controller status) and ``/healthz``
on 127.0.0.1:PORT. The controller runs a pass at the polling interval (``--interval``: how soon a
new replica is noticed) or earlier, as soon as a recorded deadline falls due
(``RecoveryController.wake_in``), and right after each voter change commits.

``operator-state.json`` (the file progress store, progressfile.py) keeps the recorded recovery
progress and the last voter set a leader reported, so that a restarted supervisor still knows
which replicas were voters when the quorum is lost (unclean recovery needs that); a damaged one
is refused, naming the file.

Unclean recovery (KIP-704 style, off by default) runs the coordinator both modes share
(unclean.py, local/unclean.py): the survivor is chosen by the same rule as in Kubernetes mode
(core/survivor.py: Raft's election order over each node's ``GET /v1/node/log-state``), among the
nodes whose storage UUID (from their ``meta.properties``) was a voter in that last voter set, and
only once every former voter answered or is gone (held stopped, or no process running): a running
node that did not answer yet may hold the newest epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

from quorum.client import QuorumClient
from quorum.cliparse import ArgumentParser
from quorum.runtime.config import load_config
from quorum.security.clientconfig import ENV_VAR as CLIENT_CONFIG_ENV
from quorum.security.clientconfig import ClientConfig, load_client_config
from quorum.types import KraftError

from .. import failpoints
from ..controller import ControllerStatus, RecoveryController
from ..core.options import add_policy_arguments, policy_from_args
from ..core.progress import Known, ProgressDamaged
from ..core.recovery import PolicyError, RecoveryPolicy
from ..core.rotation import CertRotator, healthy_majority_without
from ..core.view import QuorumView
from ..progressfile import FileProgressStore
from ..statusserver import StatusServer
from ..telemetry import EventLogSink, OperatorMetrics
from .cluster import DEFAULT_BASE_PORT, ClusterLayout, pid_alive, replace_disk, write_atomic
from .statusport import HOST, PortUnavailable, bind_free_block, bind_status
from .supervisor import Supervisor
from .tls import LocalTls, add_tls_args, remove_client_json, tls_from_args
from .unclean import LocalUnclean

log = logging.getLogger("kraftkeeper.operator.local")

STATE_FILE = "operator-state.json"


# ---------------------------------------------------------------------------------------------
# The supervisor's loop


def _claim(layout: ClusterLayout) -> Path:
    """Record this process as the cluster's supervisor (refusing a second one) and give a
    never-started cluster its initial format; returns the pid file."""
    pidfile = layout.control() / "supervisor.pid"
    if pidfile.exists():
        try:
            other = int(pidfile.read_text().strip())
        except ValueError:
            other = 0
        if other and other != os.getpid() and pid_alive(other):
            raise RuntimeError(f"{layout.dir} is already supervised by pid {other}")
    write_atomic(pidfile, f"{os.getpid()}\n")
    return pidfile


async def run_local(
    layout: ClusterLayout,
    policy: RecoveryPolicy,
    *,
    interval: float = 0.5,
    stop: asyncio.Event | None = None,
    node_config: Path | None = None,
    tls: LocalTls | None = None,
    status_sock: socket.socket | None = None,
) -> None:
    """Supervise the cluster and run the recovery controller until ``stop`` is set. With
    ``tls`` (the default of the command line) the nodes serve https with mutual TLS between
    them, the controller uses the admin credential, and certificates are renewed before expiry
    (localtls.py); without it the nodes serve plaintext HTTP on loopback and no client.json
    exists. ``status_sock`` is the status port, already listening (statusport.py); without it the
    port is bound here."""
    stop = stop or asyncio.Event()
    pidfile = _claim(layout)
    store = FileProgressStore(layout.dir / STATE_FILE)
    try:
        saved = await store.load()  # a damaged file is refused before anything starts
        # Before any node runs: the one moment an initial format is safe (localcluster.py).
        await asyncio.to_thread(layout.bootstrap)
        cfg: ClientConfig | None = None
        if tls is not None:
            cfg = await asyncio.to_thread(tls.provision)
        else:
            await asyncio.to_thread(remove_client_json, layout.dir)
    except BaseException:
        pidfile.unlink(missing_ok=True)
        if status_sock is not None:
            status_sock.close()
        raise
    metrics = OperatorMetrics()
    bootstrap = [layout.endpoint(i) for i in range(1, layout.nodes + 1)]
    client = QuorumClient(bootstrap, timeout=3.0, client_config=cfg)
    ctl = RecoveryController(
        client,
        policy,
        cluster=layout.name,
        sink=EventLogSink(layout.dir / "events", layout.name),
        metrics=metrics,
        records=saved.records,
        persist=store.save,
        # Membership repair: if the voter ids ever differ from 1..N (after an unclean recovery, or
        # an interrupted RemoveThenAdd whose progress file was lost), reassign back to 1..N.
        # --no-recovery means "never change voters": no repair either.
        desired_ids=list(range(1, layout.nodes + 1)) if policy.enabled else None,
    )
    ctl.known_voters = saved.known.voters
    store.known = lambda: Known(list(ctl.known_voters))
    server = StatusServer(metrics, redact=tls is not None)
    await server.start(HOST, layout.base_port, sock=status_sock)
    seen: dict[str, QuorumView | None] = {"view": None}

    def on_damage(i: int, message: str) -> bool:
        """A node stopped on a damaged log: a lost disk, replaced when the others commit without
        it; otherwise nothing automatic, and the log says which logs are undamaged and what to do
        (docs/operator.md "A damaged log")."""
        now_ms = int(time.time() * 1000)
        if policy.enabled and healthy_majority_without(seen["view"], i, policy.max_lag, now_ms, 5000):
            return True
        if sup.damage.get(i, {}).get("message") == message:
            return False  # said once per damage, not on every restart
        damaged = {*sup.damage, i}
        intact = [k for k in range(1, layout.nodes + 1) if k not in damaged]
        log.error(
            "node %d stopped on a damaged log (%s) and no healthy majority of the other voters is "
            "seen: nothing is moved automatically. Undamaged logs: node(s) %s. If a majority is "
            "damaged: stop the operator, run `kraftkeeper quorum recover-unclean --dir %s` on the "
            "undamaged node with the highest last epoch and end offset (its GET /v1/node/log-state), "
            "start the operator again, then `kraftkeeper cluster replace-disk` each "
            "damaged node",
            i,
            message,
            intact or "none",
            layout.data_dir(intact[0]) if intact else "DIR",
        )
        return False

    sup = Supervisor(
        layout,
        node_config,
        tls.node_args() if tls is not None else None,
        before_start=tls.ensure_node if tls is not None else None,
        on_damage=on_damage,
    )
    unclean = LocalUnclean(layout, sup, ctl, client, metrics=metrics)
    rotator = None
    if tls is not None:
        ids = tls.node_ids
        rotator = CertRotator(tls.due, tls.renew_node, sup.restart, lambda: ids, max_lag=policy.max_lag)
    try:
        while not stop.is_set():
            await sup.supervise_once()
            await unclean.maybe_run()
            view = seen["view"] = await _controller_pass(ctl, sup, server, interval)
            if tls is not None and rotator is not None:
                await _rotate(tls, rotator, view, ctl, unclean, bootstrap)
                server.last["certificateRotations"] = {str(k): v for k, v in rotator.rotations.items()}
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), ctl.wake_in(interval))
    finally:
        await sup.stop_all()
        await unclean.close()
        await server.stop()
        with contextlib.suppress(FileNotFoundError):
            pidfile.unlink()


async def _rotate(
    tls: LocalTls,
    rotator: CertRotator,
    view: QuorumView | None,
    ctl: RecoveryController,
    unclean: LocalUnclean,
    bootstrap: list[str],
) -> None:
    """Certificate renewal: the operator's own admin credential (then a new client, since the
    TLS context holds the old one), and the nodes' certificates one at a time (localtls.py)."""
    try:
        if await asyncio.to_thread(tls.renew_admin_if_due):
            old = unclean.client
            cfg = await asyncio.to_thread(load_client_config, tls.client_json)
            unclean.client = ctl.api = QuorumClient(bootstrap, timeout=3.0, client_config=cfg)
            await old.close()
        await rotator.step(view)
    except (KraftError, OSError, ValueError) as e:  # retried on the next pass
        log.error("certificate renewal failed: %s", e)


async def _controller_pass(
    ctl: RecoveryController, sup: Supervisor, server: StatusServer, interval: float
) -> QuorumView | None:
    try:
        st: ControllerStatus = await asyncio.wait_for(ctl.reconcile(), timeout=max(5.0, 4 * interval))
    except TimeoutError:
        log.warning("reconcile took too long; retrying")
        return None
    except Exception:  # the supervisor must outlive any controller bug
        log.exception("reconcile failed")
        return None
    last = st.to_status()
    last["supervisor"] = {
        str(n.index): {"pid": n.proc.pid if n.proc else None, "restarts": n.restarts}
        for n in sup.nodes.values()
    }
    if sup.damage:  # node -> its CORRUPT_LOG stop and what was done (supervisor.py)
        last["damagedLogs"] = {str(k): dict(v) for k, v in sup.damage.items()}
    server.last = last
    return st.view




def _claim_ports(d: Path, nodes: int | None, requested: int | None) -> tuple[ClusterLayout, socket.socket]:
    """The cluster directory's layout, with its operator port already listening (statusport.py).
    ``requested`` 0 chooses a free block for a new directory (or one prepared with base port 0);
    a directory that has its block keeps it."""
    if requested == 0:
        existing = ClusterLayout.load(d) if (d / "cluster.json").exists() else None
        if existing is None or existing.base_port == 0:
            base, sock = bind_free_block(nodes or (existing.nodes if existing else 3))
            try:
                return ClusterLayout.load_or_create(d, nodes, base), sock
            except BaseException:
                sock.close()
                raise
        requested = None
    layout = ClusterLayout.load_or_create(d, nodes, requested)
    return layout, bind_status(layout.base_port)


def local_main(argv: list[str]) -> int:
    """``kraftkeeper operator local --dir DIR [--nodes 3] [--base-port PORT] [policy options]``."""
    p = ArgumentParser(prog="kraftkeeper operator local")
    p.add_argument("--dir", required=True)
    p.add_argument("--nodes", type=int, default=None, help="number of nodes (default 3; fixed at creation)")
    p.add_argument(
        "--base-port",
        type=int,
        default=None,
        help=f"operator port; node i on PORT+i (default {DEFAULT_BASE_PORT}; 0: choose a free block, "
        "written to DIR/cluster.json once the operator port is bound)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=0.5,
        help="seconds between controller passes when no deadline is due (how soon a new replica is noticed)",
    )
    p.add_argument(
        "--node-config",
        default=None,
        help="JSON/TOML config file passed to every node (`kraftkeeper start --config`)",
    )
    add_policy_arguments(p)
    add_tls_args(p)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        policy = policy_from_args(a)
        failpoints.check()  # a test hook (KRAFTKEEPER_FAILPOINT): refused before anything starts
        if a.node_config is not None:
            # The nodes' own loader: a bad file is refused here, naming the key, not by N crash loops.
            load_config(a.node_config)
        layout, status_sock = _claim_ports(Path(a.dir), a.nodes, a.base_port)
    except (PolicyError, ValueError) as e:
        sys.stderr.write(f"INVALID_REQUEST: {e}\n")
        return 2
    except KraftError as e:
        sys.stderr.write(f"INVALID_REQUEST: --node-config {a.node_config}: {e.message}\n")
        return 2
    except PortUnavailable as e:  # the port is taken, or no free block was found
        sys.stderr.write(f"UNAVAILABLE: operator port: {e}\n")
        return 1
    log.info("operator local: %s on %s:%d, node i on port %d+i", layout.dir, HOST, layout.base_port,
             layout.base_port)
    try:
        tls = tls_from_args(a, layout.dir, layout.cluster_id, list(range(1, layout.nodes + 1)))
    except ValueError as e:
        status_sock.close()
        sys.stderr.write(f"INVALID_REQUEST: {e}\n")
        return 2

    node_config = Path(a.node_config).resolve() if a.node_config else None

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_local(
            layout, policy, interval=a.interval, stop=stop, node_config=node_config, tls=tls,
            status_sock=status_sock,
        )

    try:
        asyncio.run(main())
    except KraftError as e:  # the TLS directory belongs to another cluster, or does not parse
        sys.stderr.write(f"{e.code.value}: {e.message}\n")
        return 2
    except ProgressDamaged as e:
        sys.stderr.write(f"INVALID_REQUEST: {e}\n")
        return 2
    except (RuntimeError, OSError) as e:
        sys.stderr.write(f"UNAVAILABLE: {e}\n")
        return 1
    return 0


def replace_disk_main(argv: list[str]) -> int:
    """``kraftkeeper cluster replace-disk --dir DIR --node N``: prints the new storage UUID."""
    p = ArgumentParser(prog="kraftkeeper cluster replace-disk")
    p.add_argument("--dir", required=True)
    p.add_argument("--node", type=int, required=True)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument(
        "--client-config",
        default=None,
        help="client config JSON (as every client command; default $KRAFTKEEPER_CLIENT_CONFIG); "
        "checked, though replace-disk itself only acts on the directory",
    )
    a = p.parse_args(argv)
    try:
        if a.client_config or os.environ.get(CLIENT_CONFIG_ENV):
            load_client_config(a.client_config or os.environ[CLIENT_CONFIG_ENV])
    except KraftError as e:
        sys.stderr.write(f"{e.code.value}: {e.message}\n")
        return 2
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
