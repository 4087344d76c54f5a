"""``kraftkeeper demo``: the main job on one machine.

1. Start a local 3-node quorum under ``kraftkeeper operator local`` (the embedded recovery
   controller supervising real node processes on loopback).
2. Write keys.
3. K times: simulate a volume replacement with ``kraftkeeper cluster replace-disk`` (rotating
   through the nodes, the current leader included), wait until the controller has added the
   new (id, UUID) and removed the old one, and keep writing meanwhile.
   After each recovery it prints the recovery's intervals from the event log, named and
   measured as the report measures them (``kraftkeeper_reports.intervals``), and its own wall
   clock separately, named as such.
4. Check every acknowledged key is still readable, stop the cluster.
5. Run the Spark report over ``DIR/events/`` into ``DIR/report/``; print its path last.

Everything the demo does goes through the same public commands a user would run; it prints
progress as it goes. ``--engine kafka`` runs ``demo_kafka`` instead: real Apache Kafka
controllers healed by ``operator watch`` and by Kafka's own auto-join, in one report.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kraftkeeper_operator.core.policy import RecoveryPolicy
from kraftkeeper_operator.local.cluster import ClusterLayout
from kraftkeeper_reports import events as ev
from kraftkeeper_reports.intervals import fmt_ms
from kraftkeeper_reports.job import run_report

from kraftkeeper_demo import demo_kafka
from kraftkeeper_demo.demo_common import (
    DemoError,
    prepare_dir,
    print_intervals,
    read_events,
    say,
)
from quorum.client import QuorumClient
from quorum.polling import TimedOut, async_wait_until
from quorum.security.clientconfig import load_client_config
from quorum.types import KraftError


def _kk(*args: str) -> list[str]:
    return [sys.executable, "-m", "quorum.cli", *args]


async def _wait(cond: Any, limit: float, what: str, interval: float = 0.2) -> Any:
    """:func:`quorum.polling.async_wait_until` (a node's error means "not yet"), failing as the
    demo's ``REQUEST_TIMED_OUT``."""
    try:
        return await async_wait_until(what, cond, limit, interval, errors=(KraftError, OSError))
    except TimedOut as e:
        raise DemoError(f"REQUEST_TIMED_OUT: {e}") from None


@dataclass
class _Run:
    """What every step of one demo run shares."""

    d: Path
    client: QuorumClient
    recoveries: int
    keys_per_round: int
    acked: list[str] = field(default_factory=list)

    @property
    def events_dir(self) -> Path:
        return self.d / "events"


async def _run_cluster(d: Path, recoveries: int, keys_per_round: int, stabilization: float) -> None:
    say(f"starting a 3-node quorum under `kraftkeeper operator local` in {d}")
    sup = await _start_supervisor(d, stabilization)
    try:
        # `--base-port 0`: operator local draws a free block, listens on its first port, then
        # records the block in cluster.json; nothing else here picks or probes a port.
        base = await _wait(lambda: _reported_base_port(d), 60, f"{d / 'cluster.json'} (the ports it holds)")
        bootstrap = ",".join(f"127.0.0.1:{base + i}" for i in (1, 2, 3))
        say(f"  nodes on 127.0.0.1 ports {base + 1}-{base + 3}, the operator's /status on {base}")
        # TLS is on by default: the supervisor writes the admin client config before any node runs.
        cfg_file = d / "client.json"
        await _wait(lambda: _exists(cfg_file), 60, f"{cfg_file} (the admin client config)")
        async with QuorumClient(bootstrap, timeout=30, client_config=load_client_config(cfg_file)) as client:
            run = _Run(d, client, recoveries, keys_per_round)
            desc = await _wait(lambda: _described(client), 90, "a leader to be elected")
            say(f"leader is node {desc['leader_id']} at epoch {desc['leader_epoch']}; voters {_voters(desc)}")
            await _write(client, run.acked, 0, keys_per_round)
            say(f"wrote {len(run.acked)} keys")
            for r in range(recoveries):
                await _recover_one(run, r)
            await _check_keys(run)
    finally:
        await _stop_supervisor(sup)


async def _start_supervisor(d: Path, stabilization: float) -> asyncio.subprocess.Process:
    """``kraftkeeper operator local`` in its own session (so stopping it stops its nodes too),
    its output appended to ``operator.log``."""
    log_fd = os.open(d / "operator.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return await asyncio.create_subprocess_exec(
            *_kk("operator", "local", "--dir", str(d), "--nodes", "3", "--base-port", "0",
                 "--stabilization-seconds", str(stabilization), "--interval", "0.25"),
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        os.close(log_fd)


async def _stop_supervisor(sup: asyncio.subprocess.Process) -> None:
    if sup.returncode is None:
        os.killpg(sup.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(sup.wait(), 30)
        except TimeoutError:
            os.killpg(sup.pid, signal.SIGKILL)
            await sup.wait()
    say("cluster stopped")


def _voters(desc: dict[str, Any]) -> str:
    return ", ".join(f"{v['id']}:{v['uuid'][:8]}" for v in desc["voters"])


async def _recover_one(run: _Run, r: int) -> None:
    """Replace one node's disk (the ``r``-th recovery), keep writing while the controller swaps
    its (id, UUID), then print the recovery's intervals."""
    client = run.client
    desc = await client.describe()
    # Rotate through the nodes; the second replacement hits the current leader.
    node = desc["leader_id"] if r == 1 else (r % 3) + 1
    old = next(v["uuid"] for v in desc["voters"] if v["id"] == node)
    say(
        f"recovery {r + 1}/{run.recoveries}: replacing the disk of node {node}"
        + (" (the leader)" if node == desc["leader_id"] else "")
        + f", old UUID {old[:8]}"
    )
    t0 = time.monotonic()
    new = await _replace_disk(run.d, node)
    say(f"  node {node} restarted empty with new UUID {new[:8]}; the controller takes over")
    writer = asyncio.create_task(_write(client, run.acked, len(run.acked), run.keys_per_round))

    async def swapped() -> bool:
        dd = await client.describe()
        keys = {(v["id"], v["uuid"]) for v in dd["voters"]}
        return (node, new) in keys and (node, old) not in keys and dd["pending_voter_change"] is None

    await _wait(swapped, 180, f"node {node} to be swapped to its new UUID")
    wall = time.monotonic() - t0
    await writer
    say(f"  voters now {_voters(await client.describe())}")
    await _report_recovery(run.events_dir, new, wall)


async def _replace_disk(d: Path, node: int) -> str:
    """``kraftkeeper cluster replace-disk``: the node restarted on an empty disk; its new UUID."""
    rd = await asyncio.create_subprocess_exec(
        *_kk("cluster", "replace-disk", "--dir", str(d), "--node", str(node)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(rd.communicate(), 120)
    if rd.returncode != 0:
        raise DemoError(err.decode().strip() or f"replace-disk failed ({rd.returncode})")
    return out.decode().strip().splitlines()[-1]


async def _check_keys(run: _Run) -> None:
    """Every acknowledged key reads back, and the event log records every recovery."""
    acked = run.acked
    say(f"checking all {len(acked)} acknowledged keys are readable")
    missing = []
    for i in range(0, len(acked), 200):
        chunk = acked[i : i + 200]
        vals = await asyncio.gather(*(run.client.get(k) for k in chunk))
        missing += [k for k, v in zip(chunk, vals, strict=True) if v != k.encode()]
    if missing:
        raise DemoError(f"CORRUPT_LOG: {len(missing)} acknowledged keys lost, e.g. {missing[:3]}")
    say("every acknowledged key is there")
    await _wait(
        lambda: _all_completed(run.events_dir, run.recoveries), 30, "the event log to record every recovery"
    )


async def _report_recovery(events_dir: Path, new_uuid: str, wall_s: float) -> None:
    """Print the recovery's intervals as the report defines them (``intervals``), from its own
    events, each with the interval's name, then the demo's wall clock, named as what it is."""

    async def logged() -> list[dict[str, Any]] | None:
        evs = [e for e in read_events(events_dir) if e.get("new_uuid") == new_uuid]
        return evs if any(e.get("type") == ev.RECOVERY_COMPLETED for e in evs) else None

    try:
        evs = await _wait(logged, 30, "the event log to record the recovery's completion", interval=0.1)
    except DemoError as e:
        say(f"  {e}")
        evs = [e for e in read_events(events_dir) if e.get("new_uuid") == new_uuid]
    print_intervals(evs)
    say(f"  (demo wall clock, replace-disk command started → new voter set seen: {fmt_ms(wall_s * 1000)}; "
        "it includes stopping, formatting and restarting the node before detection)")


async def _exists(p: Path) -> bool:
    return await asyncio.to_thread(p.exists)


async def _reported_base_port(d: Path) -> int | None:
    """The block ``operator local`` chose and holds, once it wrote cluster.json (None before)."""
    if not await _exists(d / "cluster.json"):
        return None
    return ClusterLayout.load(d).base_port or None


async def _all_completed(events_dir: Path, n: int) -> bool:
    return sum(1 for e in read_events(events_dir) if e.get("type") == ev.RECOVERY_COMPLETED) >= n


async def _described(client: QuorumClient) -> dict[str, Any] | None:
    d = await client.describe()
    voters = d.get("voters", [])
    # Ready once the leader has written the bootstrap voter records (every voter has its UUID).
    ok = d.get("leader_id", -1) >= 0 and len(voters) == 3 and all(v.get("uuid") for v in voters)
    return d if ok else None


async def _write(client: QuorumClient, acked: list[str], start: int, n: int) -> None:
    sem = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        key = f"demo-{i:06d}"
        async with sem:
            for _ in range(5):
                try:
                    await client.put(key, key.encode())
                    acked.append(key)
                    return
                except KraftError:
                    await asyncio.sleep(0.2)

    await asyncio.gather(*(one(i) for i in range(start, start + n)))


# The demo's own stabilization window, shorter on purpose than the operator's default
# (RecoveryPolicy.stabilization_seconds, 10 s, the one default of `operator local`, `operator watch`
# and the CRD): three disk replacements then fit in about a minute on a laptop.
DEMO_STABILIZATION_SECONDS = 2.0

ENGINE_HELP = (
    "kraftkeeper (default): our engine, 3 nodes under `kraftkeeper operator local`. "
    "kafka: three real Apache Kafka 4.4.0 controllers (SASL_SSL on their listener) healed by "
    "`kraftkeeper operator watch`, then the same replacements healed by Kafka's own auto-join, compared "
    "in the report; each healer replaces the controllers' disks in turn, the leader's first (3 "
    "recoveries: every disk once). On its first run it fetches the Kafka 4.4.0 jars from Maven Central "
    "(about 90 MB, "
    "scripts/kafka.sh install, which installs Debian's maven if missing; cached under "
    "~/.cache/kraftkeeper)"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kraftkeeper demo", description="The main job on one machine.")
    ap.add_argument("--engine", choices=("kraftkeeper", "kafka"), default="kraftkeeper", help=ENGINE_HELP)
    ap.add_argument("--dir", default="demo", help="working directory (created if missing; default ./demo)")
    ap.add_argument(
        "--recoveries",
        type=int,
        default=3,
        help="simulated disk replacements (default 3; with --engine kafka, per healer)",
    )
    ap.add_argument(
        "--keys", type=int, default=2000, help="keys written before and during each recovery (our engine)"
    )
    ap.add_argument(
        "--stabilization-seconds",
        type=float,
        default=DEMO_STABILIZATION_SECONDS,
        help=f"how long a new replica must stay caught up before it is promoted (default "
        f"{DEMO_STABILIZATION_SECONDS:g}, shorter than the operator's own default of "
        f"{RecoveryPolicy().stabilization_seconds:g} so the demo is quick)",
    )
    ap.add_argument(
        "--base-port",
        type=int,
        default=0,
        help="--engine kafka: controllers on 127.0.0.1 BASE+1..BASE+3, the watcher's /status on "
        "BASE+4 (default: a free range)",
    )
    ap.add_argument("--master", default=None, help="Spark master for the report (default local[*])")
    a = ap.parse_args(argv)
    if a.recoveries < 0 or a.keys < 1 or a.stabilization_seconds < 0:
        sys.stderr.write(
            "INVALID_REQUEST: --recoveries must be >= 0, --keys >= 1, --stabilization-seconds >= 0\n"
        )
        return 2
    if a.base_port and not 1024 <= a.base_port <= 65530:
        sys.stderr.write(f"INVALID_REQUEST: --base-port {a.base_port}: must be within 1024..65530\n")
        return 2
    d = Path(a.dir).resolve()
    problem = prepare_dir(d, "cluster.json", "kafka")
    if problem:
        sys.stderr.write(f"INVALID_REQUEST: {problem}\n")
        return 2
    if a.engine == "kafka":
        return demo_kafka.run(d, a.recoveries, a.stabilization_seconds, a.base_port, a.master)
    try:
        asyncio.run(_run_cluster(d, a.recoveries, a.keys, a.stabilization_seconds))
    except DemoError as e:
        sys.stderr.write(f"{e}\n" if ":" in str(e).split(" ")[0] else f"UNAVAILABLE: {e}\n")
        say(f"see {d / 'operator.log'} and {d}/node-*.log")
        return 1
    say("building the Spark report over the recovery event log (local Spark, first start takes a while)")
    report = run_report([str(d / "events")], str(d / "report"), a.master)
    say("done")
    print(report)
    return 0
