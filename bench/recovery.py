"""Disk-failure recovery timing: how long a replaced replica takes to become a voter again.

For each log size: start a 3-node KRaftKeeper quorum, fill its log to the size with large values
(many concurrent ``PUT``), then simulate a volume replacement of node 3 (of node 2 if 3 leads):
SIGKILL, delete its directory, ``kraftkeeper format`` again (a new storage UUID, KIP-856),
restart it, and time the KIP-856 recovery by hand, as the operator would:

* **catch-up**: from the new replica's first Fetch (the ``last_fetch_timestamp`` the leader
  reports for observer (3, new UUID) when it first appears in ``describe``) until the leader
  reports its lag as 0. The engine may serve it through FetchSnapshot (KIP-630) once the log
  passed the snapshot threshold, so this covers both paths;
* **add-voter**: AddVoter (3, new UUID) until committed (KIP-856 handling step 7);
* **remove-voter**: RemoveVoter (3, old UUID) until committed;
* **total**: first Fetch until RemoveVoter committed;
* **copy limit**: beside it, in the same run, a plain copy of the bytes the replica received
  (its data directory right after catch-up: snapshot and log segments) to a fresh directory
  on the same disk, each file fsynced, read in 8 MB chunks: what the disk allows without any
  protocol. The headline is catch-up MB/s as a fraction of that copy's MB/s (the aim is
  catch-up of a 1 GB log at 300 MB/s or more; this ratio says how close to the disk it runs).

``--repeats N`` replaces the same follower's disk N times on one filled cluster (each time a
new storage UUID that catches up from nothing), each beside its own copy; the headline is the
median ratio. ``--py-spy PATH`` records the leader and the replica during the first catch-up
of each size (collapsed stacks): where the time goes.

Admin calls go to the node HTTP admin API (``POST /v1/quorum/voters``,
``DELETE /v1/quorum/voters/{id}/{uuid}``, ``GET /v1/quorum/describe``, docs/design.md) that
``kraftkeeper quorum add-voter|remove-voter|describe`` use, so the times exclude the CLI's
interpreter start-up. By default the nodes run without ``--tls-dir``: node-to-node traffic is
plaintext HTTP on loopback; ``--tls`` runs them with mutual TLS (and the bench's own calls with
an admin client certificate). The output says which. Run ``python -m bench.recovery
--help``. ``--restart`` measures something else: a node's restart with a 1 GB log, with and
without the fsync on open (``bench/restart.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as a file (`python bench/recovery.py`): import `bench` from the repository root, and keep
    # this directory off the path, where operator.py would shadow the standard library's module.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from bench.baseline import round_order
from bench.clusters import KraftKeeperCluster
from bench.common import NOT_YET
from bench.load import TlsFiles
from bench.procs import sigterm_as_interrupt
from bench.recovery_ops import (
    MB,
    admin,
    copy_limit,
    cpu_seconds,
    describe,
    describe_leader,
    dir_bytes,
    fill,
    leader_endpoint,
    parse_size,
    replica_entry,
    start_profilers,
    stop_profilers,
)
from bench.recovery_results import RecoveryResult, render
from quorum.security.pki import issue_client, load_ca
from testkit.polling import wait_until
from testkit.revision import BaselineTree, export_tree


@dataclass
class Setup:
    """How every size is run (the command line)."""

    value_size: int = 32 * 1024
    concurrency: int = 32
    fsync: bool = True
    snapshot_bytes: int | None = None
    repeats: int = 1
    py_spy: str | None = None
    profile_dir: Path | None = None
    raft: dict[str, int] = field(default_factory=dict)
    tls: bool = False


def run_one(work: Path, size: int, setup: Setup, log: Any,
            baseline: BaselineTree | None = None) -> list[RecoveryResult]:
    """Fill one cluster to ``size``, then replace the same follower's disk ``repeats`` times
    (each replacement gets a new storage UUID and catches up from scratch), measuring a plain
    copy of the bytes it received beside each catch-up. ``baseline``: run that revision's
    engine instead of the current one (``--baseline``)."""
    extra: dict[str, Any] = {}
    if setup.snapshot_bytes is not None:
        extra["snapshot"] = {"max_bytes": setup.snapshot_bytes}
    if setup.raft:
        extra["raft"] = dict(setup.raft)
    cluster = KraftKeeperCluster(work / f"size-{size}", fsync=setup.fsync, extra_config=extra,
                                 tls=setup.tls, baseline=baseline)
    rev = baseline.rev if baseline is not None else ""
    try:
        cluster.start()
        if setup.tls:
            # AddVoter / RemoveVoter need the admin role (quorum.security.auth); it may write too.
            ca = load_ca(cluster.work / "tls")
            cert, key = issue_client(ca, "bench-admin", "admin")
            cluster.tls = TlsFiles(str(cluster.work / "tls" / "ca.crt"), str(cert), str(key))
        leader = leader_endpoint(cluster)
        t0 = time.monotonic()
        filled = asyncio.run(fill([leader, *cluster.endpoints], size, setup.value_size, setup.concurrency,
                                  cluster.tls))
        fill_s = time.monotonic() - t0
        results = []
        for rnd in range(setup.repeats):
            r = _replace_and_time(cluster, size, filled, fill_s, setup.fsync, log, rnd == 0 and not rev,
                                  setup.py_spy, setup.profile_dir or work)
            r.rev = rev
            results.append(r)
        return results
    finally:
        cluster.stop()
        shutil.rmtree(cluster.work, ignore_errors=True)


def _replace_and_time(cluster: KraftKeeperCluster, size: int, filled: int, fill_s: float, fsync: bool,
                      log: Any, profile: bool, py_spy: str | None, profile_dir: Path) -> RecoveryResult:
    leader = leader_endpoint(cluster)
    before = describe(leader, cluster.tls)
    lead_id = int(before["leader_id"])
    # Replace node 3's disk, or node 2's if 3 leads: replacing the leader's disk would add an
    # election to what we measure, and any follower's recovery is the same protocol.
    victim = 3 if lead_id != 3 else 2
    old = next(v["uuid"] for v in before["voters"] if v["id"] == victim)
    lead_dir = dir_bytes(cluster.node_dir(lead_id))
    log(f"  filled {filled / MB:.1f} MB in {fill_s:.1f}s (leader {lead_id} dir {lead_dir / MB:.1f} MB); "
        f"replacing node {victim}'s disk")

    cluster.procs.kill(f"node-{victim}")
    shutil.rmtree(cluster.node_dir(victim))
    new = cluster.format_node(victim)
    t_restart_ms = time.time() * 1000
    cluster.start_node(victim)
    pids = {"leader": cluster.procs.procs[f"node-{lead_id}"].popen.pid,
            "replica": cluster.procs.procs[f"node-{victim}"].popen.pid}
    # the first replacement of each size only: one profile per size is enough
    profilers = start_profilers(py_spy if profile else None, profile_dir,
                                {f"{k}-{size // MB}MB": v for k, v in pids.items()})

    cached = [leader]
    seen = wait_until(
        f"observer ({victim}, {new}) in describe",
        lambda: replica_entry(describe_leader(cluster, cached), "observers", victim, new),
        120,
        0.02,
        errors=NOT_YET,
    )
    cpu0 = {k: cpu_seconds(v) for k, v in pids.items()}
    first_fetch_ms = float(seen.get("last_fetch_timestamp", -1))
    if first_fetch_ms <= 0:
        first_fetch_ms = time.time() * 1000

    def caught_up() -> float | None:
        cluster.procs.check_alive(f"node-{victim}")
        r = replica_entry(describe_leader(cluster, cached), "observers", victim, new)
        if r is not None and r.get("lag") == 0:
            return time.time() * 1000
        return None

    try:
        caught_ms = wait_until("the new replica to catch up (lag 0)", caught_up, 1800, 0.02, errors=NOT_YET)
    finally:
        stop_profilers(profilers)
    cpu = {k: cpu_seconds(v) - cpu0[k] for k, v in pids.items()}
    catch_up_s = max(1e-6, (caught_ms - first_fetch_ms) / 1000)
    # What the replica received (its snapshot and log files), measured before anything else
    # is written to it: the bytes catch-up moved, and the bytes the plain copy moves.
    received = dir_bytes(cluster.node_dir(victim))
    add_body = json.dumps({"id": victim, "uuid": new}).encode()
    add_s = admin(cluster, "POST", "/v1/quorum/voters", add_body, 120)
    remove_s = admin(cluster, "DELETE", f"/v1/quorum/voters/{victim}/{old}", None, 120)
    done_ms = time.time() * 1000
    after = describe(leader_endpoint(cluster), cluster.tls)
    voters = {(v["id"], v["uuid"]) for v in after["voters"]}
    if (victim, new) not in voters or (victim, old) in voters:
        raise RuntimeError(f"voter set after recovery is wrong: {sorted(voters)}")
    # Snapshots are `*.checkpoint` files (Kafka naming, KIP-630).
    via_snapshot = any(p.suffix == ".checkpoint" for p in cluster.node_dir(victim).rglob("*"))
    # The limit: the replica's files copied on the same disk (read back, written, fsynced),
    # taken right after the catch-up so both see the same machine load.
    copied, copy_s = copy_limit(cluster.node_dir(victim), cluster.work / "copy-limit", fsync)
    shutil.rmtree(cluster.work / "copy-limit", ignore_errors=True)
    copy_rate = copied / MB / copy_s
    rate = received / MB / catch_up_s
    log(f"  catch-up of {received / MB:.0f} MB: {catch_up_s:.2f}s ({rate:.0f} MB/s); plain copy of "
        f"{copied / MB:.0f} MB {copy_s:.2f}s ({copy_rate:.0f} MB/s); catch-up/copy {rate / copy_rate:.2f}; "
        f"CPU s leader {cpu['leader']:.2f} replica {cpu['replica']:.2f}")
    return RecoveryResult(
        size_bytes=size, filled_bytes=filled, leader_dir_bytes=lead_dir, received_bytes=received,
        fill_s=fill_s, catch_up_s=catch_up_s, catch_up_mb_per_s=rate,
        add_voter_s=add_s, remove_voter_s=remove_s, total_s=(done_ms - first_fetch_ms) / 1000,
        restart_to_first_fetch_s=(first_fetch_ms - t_restart_ms) / 1000, via_snapshot=via_snapshot,
        copy_s=copy_s, copy_mb_per_s=copy_rate, catch_up_to_copy=rate / copy_rate,
        leader_cpu_s=cpu["leader"], replica_cpu_s=cpu["replica"],
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--restart" in args:  # restart timing (the fsync on open): bench/restart.py
        from bench import restart

        args.remove("--restart")
        return restart.main(args)
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # The cluster was stopped by run_one's `finally` on the way here.
        print("interrupted: all benchmark processes stopped", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10MB,100MB",
                    help="log sizes, comma-separated (e.g. 10MB,100MB,1GB; default 10MB,100MB)")
    ap.add_argument("--value-bytes", type=int, default=32 * 1024, help="size of each filled value")
    ap.add_argument("--concurrency", type=int, default=32, help="concurrent writers during the fill")
    ap.add_argument("--no-fsync", action="store_true", help="run the nodes with fsync off")
    ap.add_argument("--tls", action="store_true",
                    help="run the nodes with --tls-dir: mutual TLS between them and for the bench's calls")
    ap.add_argument("--snapshot-bytes", type=int, default=None,
                    help="engine snapshot threshold (config snapshot.max_bytes); default: the engine's")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    ap.add_argument("--raft", action="append", default=[], metavar="KEY=N",
                    help="an engine raft setting for every node (config raft.KEY), e.g. "
                         "snapshot_chunk_bytes=33554432; repeatable")
    ap.add_argument("--repeats", type=int, default=1,
                    help="disk replacements per size on the same filled cluster (each beside its own copy)")
    ap.add_argument("--baseline", default=None, metavar="REV",
                    help="also run git revision REV's engine (testkit/revision.py), interleaved with the "
                         "current code for every size, and print both headlines")
    ap.add_argument("--py-spy", default=None, metavar="PATH",
                    help="profile the leader and the replaced replica during catch-up with this py-spy "
                         "binary (collapsed stacks under --profile-dir)")
    ap.add_argument("--profile-dir", type=Path, default=None, help="where --py-spy writes (default: workdir)")
    a = ap.parse_args(argv)
    try:
        sizes = [parse_size(s) for s in a.sizes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    if not sizes or a.value_bytes <= 0 or a.concurrency <= 0 or a.repeats <= 0:
        ap.error("--sizes must name at least one size; --value-bytes, --concurrency and --repeats "
                 "must be positive")

    raft: dict[str, int] = {}
    for item in a.raft:
        key, eq, num = item.partition("=")
        if not eq or not key or not num.isdigit():
            ap.error(f"--raft {item!r}: expected KEY=N (a positive integer)")
        raft[key] = int(num)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    setup = Setup(a.value_bytes, a.concurrency, not a.no_fsync, a.snapshot_bytes, a.repeats, a.py_spy,
                  a.profile_dir, raft, a.tls)
    work = a.workdir or Path(tempfile.mkdtemp(prefix="kk-recovery-"))
    results: list[RecoveryResult] = []
    failed = False
    try:
        engines: list[BaselineTree | None] = [None]
        if a.baseline is not None:
            try:
                engines.append(export_tree(a.baseline, work))
            except ValueError as e:
                ap.error(str(e))
        with sigterm_as_interrupt():
            for i, size in enumerate(sizes):
                # with --baseline, the two engines alternate which goes first (load drift)
                for k in round_order(i) if len(engines) > 1 else (0,):
                    tree = engines[k]
                    log(f"log size {size / MB:.0f} MB" + (f" (engine @{tree.rev})" if tree else ""))
                    try:
                        results.extend(run_one(work, size, setup, log, tree))
                    except (RuntimeError, TimeoutError, OSError, ValueError) as e:
                        failed = True
                        log(f"  FAILED for {size / MB:.0f} MB: {e}")
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(render(results, a.tls))
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
