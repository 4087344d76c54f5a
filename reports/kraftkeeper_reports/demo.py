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
progress as it goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kraftkeeper_reports import events as ev
from kraftkeeper_reports.intervals import CATCH_UP, EXPOSURE, TOTAL, durations, first_timestamps, fmt_ms
from kraftkeeper_reports.job import run_report
from quorum.client import QuorumClient
from quorum.security.clientconfig import load_client_config
from quorum.types import KraftError


class DemoError(Exception):
    pass


def _say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _free_base_port(n: int) -> int:
    """A base port with base..base+n all free on loopback (checked, then released)."""
    for _ in range(50):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        base = int(s.getsockname()[1])
        s.close()
        if base + n >= 65535:
            continue
        socks = []
        try:
            for p in range(base, base + n + 1):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise DemoError("UNAVAILABLE: no free range of loopback ports")


def _kk(*args: str) -> list[str]:
    return [sys.executable, "-m", "quorum.cli", *args]


async def _wait(cond: Any, limit: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + limit
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            v = await cond()
            if v:
                return v
        except (KraftError, OSError) as e:
            last = e
        await asyncio.sleep(interval)
    suffix = f" (last error: {last})" if last else ""
    raise DemoError(f"REQUEST_TIMED_OUT: waited {limit:.0f}s for {what}{suffix}")


def _events(events_dir: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not events_dir.exists():
        return out
    for p in sorted(events_dir.rglob("*.jsonl")):
        for line in p.read_text(errors="replace").splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


async def _run_cluster(d: Path, recoveries: int, keys_per_round: int, stabilization: float) -> None:
    base = _free_base_port(3)
    bootstrap = ",".join(f"127.0.0.1:{base + i}" for i in (1, 2, 3))
    log_path = d / "operator.log"
    _say(f"starting a 3-node quorum under `kraftkeeper operator local` in {d} (ports {base + 1}-{base + 3})")
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        sup = await asyncio.create_subprocess_exec(
            *_kk(
                "operator",
                "local",
                "--dir",
                str(d),
                "--nodes",
                "3",
                "--base-port",
                str(base),
                "--stabilization-seconds",
                str(stabilization),
                "--interval",
                "0.25",
            ),
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        os.close(log_fd)
    try:
        # TLS is on by default: the supervisor writes the admin client config before any node runs.
        cfg_file = d / "client.json"
        await _wait(lambda: _exists(cfg_file), 60, f"{cfg_file} (the admin client config)")
        async with QuorumClient(bootstrap, timeout=30, client_config=load_client_config(cfg_file)) as client:
            desc = await _wait(lambda: _described(client), 90, "a leader to be elected")
            _say(
                f"leader is node {desc['leader_id']} at epoch {desc['leader_epoch']}; voters "
                + ", ".join(f"{v['id']}:{v['uuid'][:8]}" for v in desc["voters"])
            )
            acked: list[str] = []
            await _write(client, acked, 0, keys_per_round)
            _say(f"wrote {len(acked)} keys")
            events_dir = d / "events"
            for r in range(recoveries):
                desc = await client.describe()
                # Rotate through the nodes; the second replacement hits the current leader.
                node = desc["leader_id"] if r == 1 else (r % 3) + 1
                old = next(v["uuid"] for v in desc["voters"] if v["id"] == node)
                _say(
                    f"recovery {r + 1}/{recoveries}: replacing the disk of node {node}"
                    + (" (the leader)" if node == desc["leader_id"] else "")
                    + f", old UUID {old[:8]}"
                )
                t0 = time.monotonic()
                rd = await asyncio.create_subprocess_exec(
                    *_kk("cluster", "replace-disk", "--dir", str(d), "--node", str(node)),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                out, err = await asyncio.wait_for(rd.communicate(), 120)
                if rd.returncode != 0:
                    raise DemoError(err.decode().strip() or f"replace-disk failed ({rd.returncode})")
                new = out.decode().strip().splitlines()[-1]
                _say(f"  node {node} restarted empty with new UUID {new[:8]}; the controller takes over")
                writer = asyncio.create_task(_write(client, acked, len(acked), keys_per_round))

                async def swapped(node: int = node, old: str = old, new: str = new) -> bool:
                    dd = await client.describe()
                    keys = {(v["id"], v["uuid"]) for v in dd["voters"]}
                    return (
                        (node, new) in keys and (node, old) not in keys and dd["pending_voter_change"] is None
                    )

                await _wait(swapped, 180, f"node {node} to be swapped to its new UUID")
                wall = time.monotonic() - t0
                await writer
                _say(
                    "  voters now "
                    + ", ".join(f"{v['id']}:{v['uuid'][:8]}" for v in (await client.describe())["voters"])
                )
                await _report_recovery(events_dir, new, wall)
            _say(f"checking all {len(acked)} acknowledged keys are readable")
            missing = []
            for i in range(0, len(acked), 200):
                chunk = acked[i : i + 200]
                vals = await asyncio.gather(*(client.get(k) for k in chunk))
                missing += [k for k, v in zip(chunk, vals, strict=True) if v != k.encode()]
            if missing:
                raise DemoError(f"CORRUPT_LOG: {len(missing)} acknowledged keys lost, e.g. {missing[:3]}")
            _say("every acknowledged key is there")
            await _wait(
                lambda: _all_completed(events_dir, recoveries), 30, "the event log to record every recovery"
            )
    finally:
        if sup.returncode is None:
            os.killpg(sup.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(sup.wait(), 30)
            except TimeoutError:
                os.killpg(sup.pid, signal.SIGKILL)
                await sup.wait()
        _say("cluster stopped")


async def _report_recovery(events_dir: Path, new_uuid: str, wall_s: float) -> None:
    """Print the recovery's intervals as the report defines them (``intervals``), from its own
    events, each with the interval's name, then the demo's wall clock, named as what it is."""

    async def logged() -> list[dict[str, Any]] | None:
        evs = [e for e in _events(events_dir) if e.get("new_uuid") == new_uuid]
        return evs if any(e.get("type") == ev.RECOVERY_COMPLETED for e in evs) else None

    try:
        evs = await _wait(logged, 30, "the event log to record the recovery's completion", interval=0.1)
    except DemoError as e:
        _say(f"  {e}")
        evs = [e for e in _events(events_dir) if e.get("new_uuid") == new_uuid]
    d = durations(first_timestamps(evs))
    for i in (TOTAL, EXPOSURE, CATCH_UP):
        _say(f"  {i.title}: {fmt_ms(d[i.name])}")
    _say(f"  (demo wall clock, replace-disk command started → new voter set seen: {fmt_ms(wall_s * 1000)}; "
         "it includes stopping, formatting and restarting the node before detection)")


async def _exists(p: Path) -> bool:
    return await asyncio.to_thread(p.exists)


async def _all_completed(events_dir: Path, n: int) -> bool:
    return sum(1 for e in _events(events_dir) if e.get("type") == "recovery_completed") >= n


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kraftkeeper demo", description="The main job on one machine.")
    ap.add_argument("--dir", default="demo", help="working directory (created if missing; default ./demo)")
    ap.add_argument("--recoveries", type=int, default=3, help="simulated disk replacements (default 3)")
    ap.add_argument("--keys", type=int, default=2000, help="keys written before and during each recovery")
    ap.add_argument(
        "--stabilization-seconds",
        type=float,
        default=2.0,
        help="how long a new replica must stay caught up before it is promoted",
    )
    ap.add_argument("--master", default=None, help="Spark master for the report (default local[*])")
    a = ap.parse_args(argv)
    if a.recoveries < 0 or a.keys < 1:
        sys.stderr.write("INVALID_REQUEST: --recoveries must be >= 0 and --keys >= 1\n")
        return 2
    d = Path(a.dir).resolve()
    marker = d / ".kraftkeeper-demo"
    if (d / "cluster.json").exists():
        if not marker.exists():
            sys.stderr.write(f"INVALID_REQUEST: {d} already holds a cluster; pass a new --dir or delete it\n")
            return 2
        # A previous demo run (the marker says the demo made it): start over, so running the
        # README's first command twice just works.
        _say(f"removing the previous demo run in {d}")
        shutil.rmtree(d)
    d.mkdir(parents=True, exist_ok=True)
    marker.write_text("created by kraftkeeper demo; the next demo run in this directory replaces it\n")
    try:
        asyncio.run(_run_cluster(d, a.recoveries, a.keys, a.stabilization_seconds))
    except DemoError as e:
        sys.stderr.write(f"{e}\n" if ":" in str(e).split(" ")[0] else f"UNAVAILABLE: {e}\n")
        _say(f"see {d / 'operator.log'} and {d}/node-*.log")
        return 1
    _say("building the Spark report over the recovery event log (local Spark, first start takes a while)")
    report = run_report([str(d / "events")], str(d / "report"), a.master)
    _say("done")
    print(report)
    return 0
