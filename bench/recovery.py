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
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

if __package__ in (None, ""):
    # Run as a file (`python bench/recovery.py`): import `bench` from the repository root, and keep
    # this directory off the path, where operator.py would shadow the standard library's module.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from bench.baseline import round_order
from bench.clusters import KraftKeeperCluster
from bench.common import TlsFiles, http_call, sigterm_as_interrupt, value_bytes, wait_until
from quorum.security.pki import issue_client, load_ca
from testkit.revision import BaselineTree, export_tree

MB = 1_000_000
# Said with every result: by default the nodes run without --tls-dir, so catch-up
# crosses plaintext HTTP on loopback (``--tls``: mutual TLS). With node TLS (TLS 1.3,
# AES-256-GCM) the leader also encrypts and the replica decrypts every byte (measured on this
# project's VM: about 0.9 and 0.7 CPU s per GB, OpenSSL through the ssl module); sendfile is
# impossible under TLS.
TRANSPORT_NOTE = ("node-to-node transport: plaintext HTTP on loopback (nodes started without --tls-dir; "
                  "--tls for mutual TLS)")
TLS_NOTE = "node-to-node transport: mutual TLS on loopback (--tls: nodes started with --tls-dir)"


@dataclass
class RecoveryResult:
    size_bytes: int
    filled_bytes: int
    leader_dir_bytes: int
    received_bytes: int  # what the replaced replica holds after catch-up: the bytes it received
    fill_s: float
    catch_up_s: float
    catch_up_mb_per_s: float
    add_voter_s: float
    remove_voter_s: float
    total_s: float
    restart_to_first_fetch_s: float
    via_snapshot: bool
    copy_s: float = 0.0
    copy_mb_per_s: float = 0.0
    catch_up_to_copy: float = 0.0  # catch-up MB/s / copy MB/s: the headline
    leader_cpu_s: float = 0.0  # CPU seconds the leader and the replica spent during catch-up
    replica_cpu_s: float = 0.0
    rev: str = ""  # the --baseline revision that ran it; "" for the current code


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux ``/proc``; 0 elsewhere). On a
    shared machine the CPU a catch-up costs varies far less than its wall time."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def dir_bytes(path: Path) -> int:
    """Bytes in the files under ``path``; a file the running node removes meanwhile counts 0."""
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_size
        except FileNotFoundError:
            pass
    return total


def copy_limit(src: Path, dst: Path, fsync: bool) -> tuple[int, float]:
    """Copy every file under ``src`` to ``dst`` (same disk) in 8 MB reads, fsyncing each file
    (and the directory) when ``fsync``; returns (bytes, seconds). The plain-copy limit that
    catch-up is compared with. Each file is read once untimed first (the engine frees a
    catch-up's page cache once fsynced): the copy always reads from memory."""
    chunk = 8 * 1024 * 1024
    buf = bytearray(chunk)
    total = 0
    took = 0.0
    dst.mkdir(parents=True)
    for i, p in enumerate(sorted(q for q in src.rglob("*") if q.is_file())):
        try:
            fin = open(p, "rb")  # closed by the with below; the node may remove the file first
        except FileNotFoundError:
            continue
        with fin:
            while fin.readinto(buf):
                pass
            fin.seek(0)
            t0 = time.monotonic()
            with open(dst / f"{i:06d}-{p.name}", "wb") as fout:
                while block := fin.read(chunk):
                    fout.write(block)
                    total += len(block)
                fout.flush()
                if fsync:
                    os.fsync(fout.fileno())
            took += time.monotonic() - t0
    t0 = time.monotonic()
    if fsync:
        fd = os.open(dst, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return total, max(1e-6, took + time.monotonic() - t0)


def parse_size(text: str) -> int:
    """``10MB``, ``1GB``, ``500KB`` or a plain byte count (decimal units)."""
    t = text.strip().upper().removesuffix("B")
    mult = {"K": 1000, "M": MB, "G": 1000 * MB}.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in ("K", "M", "G") else t
    try:
        value = int(float(num) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad size {text!r}: expected e.g. 10MB, 1GB or a byte count"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: must be positive")
    return value


async def fill(endpoints: list[str], total: int, value_size: int, concurrency: int,
               tls: TlsFiles | None = None) -> int:
    """Write distinct keys until ``total`` value bytes are committed; returns bytes written.
    Distinct keys keep the state (and so any snapshot) as large as the log."""
    value = value_bytes(value_size)
    count = (total + value_size - 1) // value_size
    next_no = 0
    leader = endpoints[0]
    written = 0
    timeout = aiohttp.ClientTimeout(total=60)
    scheme = "https" if tls is not None else "http"
    connector = aiohttp.TCPConnector(ssl=tls.context() if tls is not None else False)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def worker() -> None:
            nonlocal next_no, leader, written
            while next_no < count:
                no = next_no
                next_no += 1
                for _attempt in range(50):
                    target = leader
                    try:
                        url = f"{scheme}://{target}/v1/kv/fill-{no:09d}"
                        async with session.put(url, data=value) as resp:
                            body = await resp.read()
                            if resp.status == 200:
                                written += value_size
                                break
                            if resp.status == 421:
                                hint = json.loads(body or b"{}").get("leader_endpoint")
                                if hint:
                                    leader = str(hint)
                                    continue
                            # 503 (timed out / leadership lost) or no hint yet: retry the same key;
                            # re-writing a key is idempotent for the size of the log we want.
                    except (TimeoutError, aiohttp.ClientError):
                        pass
                    await asyncio.sleep(0.1)
                else:
                    raise RuntimeError(f"could not write key fill-{no:09d} after 50 tries (leader {leader})")

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return written


def describe(endpoint: str, tls: TlsFiles | None) -> dict[str, Any]:
    status, body = http_call(endpoint, "GET", "/v1/quorum/describe", timeout=5, tls=tls)
    if status != 200:
        raise ValueError(f"describe on {endpoint}: HTTP {status}: {body[:200]!r}")
    d: dict[str, Any] = json.loads(body)
    return d


def describe_leader(cluster: KraftKeeperCluster, hint: list[str]) -> dict[str, Any]:
    """Describe from the leader (only the leader answers it); ``hint[0]`` caches the leader and
    is refreshed when leadership moved, so polling survives an election."""
    try:
        return describe(hint[0], cluster.tls)
    except (OSError, ValueError):
        hint[0] = leader_endpoint(cluster)
        return describe(hint[0], cluster.tls)


def leader_endpoint(cluster: KraftKeeperCluster) -> str:
    def find() -> str | None:
        for ep in cluster.endpoints:
            try:
                d = describe(ep, cluster.tls)
            except (OSError, ValueError):
                continue
            lid = d.get("leader_id")
            for v in d.get("voters", []):
                if v.get("id") == lid and v.get("endpoint"):
                    return str(v["endpoint"])
            if isinstance(lid, int) and 1 <= lid <= len(cluster.endpoints):
                return cluster.endpoints[lid - 1]
        return None

    return wait_until(find, 60, "a leader in describe", interval=0.1)


def admin(cluster: KraftKeeperCluster, method: str, path: str, body: bytes | None, timeout: float) -> float:
    """Send a leader-only admin request, following 421; return seconds until the 200."""
    deadline = time.monotonic() + timeout
    target = leader_endpoint(cluster)
    while True:
        t0 = time.monotonic()
        status, data = http_call(target, method, path, body, timeout=timeout,
                                 headers={"Content-Type": "application/json"}, tls=cluster.tls)
        took = time.monotonic() - t0
        if status == 200:
            return took
        if status == 421 and time.monotonic() < deadline:
            hint = json.loads(data or b"{}").get("leader_endpoint")
            target = str(hint) if hint else leader_endpoint(cluster)
            continue
        raise RuntimeError(f"{method} {path} -> HTTP {status}: {data[:300].decode(errors='replace')}")


def _replica(d: dict[str, Any], group: str, rid: int, uuid: str) -> dict[str, Any] | None:
    for r in d.get(group, []):
        if r.get("id") == rid and r.get("uuid") == uuid:
            return dict(r)
    return None


def start_profilers(py_spy: str | None, out: Path, pids: dict[str, int]) -> list[subprocess.Popen[bytes]]:
    """``py-spy record`` on each named process (the leader and the replaced replica) into
    ``out/<name>.txt`` (collapsed stacks): where catch-up time goes, for ``--py-spy``."""
    if py_spy is None:
        return []
    out.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [py_spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "--nonblocking",
             "--output", str(out / f"{name}.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        for name, pid in pids.items()
    ]


def stop_profilers(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


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
    seen = wait_until(lambda: _replica(describe_leader(cluster, cached), "observers", victim, new), 120,
                      f"observer ({victim}, {new}) in describe", interval=0.02)
    cpu0 = {k: cpu_seconds(v) for k, v in pids.items()}
    first_fetch_ms = float(seen.get("last_fetch_timestamp", -1))
    if first_fetch_ms <= 0:
        first_fetch_ms = time.time() * 1000

    def caught_up() -> float | None:
        cluster.procs.check_alive(f"node-{victim}")
        r = _replica(describe_leader(cluster, cached), "observers", victim, new)
        if r is not None and r.get("lag") == 0:
            return time.time() * 1000
        return None

    try:
        caught_ms = wait_until(caught_up, 1800, "the new replica to catch up (lag 0)", interval=0.02)
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


def render(results: list[RecoveryResult], tls: bool = False) -> str:
    """The table, then one headline per size: catch-up as a fraction of the plain copy (the
    median over the rounds, each round's ratio taken beside its own copy)."""
    head = (f"{'engine':>8} {'log size':>9} {'received':>9} {'catch-up s':>10} {'MB/s':>7} {'copy MB/s':>9} "
            f"{'ratio':>6} {'snapshot':>8} {'restart->fetch s':>16} {'add-voter ms':>12} "
            f"{'remove-voter ms':>15} {'total s':>8} {'fill s':>7} {'lead cpu':>7} {'repl cpu':>8}")
    lines = [TLS_NOTE if tls else TRANSPORT_NOTE, head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{'@' + r.rev if r.rev else 'current':>8} {r.size_bytes / MB:>7.0f}MB "
            f"{r.received_bytes / MB:>7.1f}MB {r.catch_up_s:>10.2f} "
            f"{r.catch_up_mb_per_s:>7.1f} {r.copy_mb_per_s:>9.1f} {r.catch_up_to_copy:>6.2f} "
            f"{'yes' if r.via_snapshot else 'no':>8} {r.restart_to_first_fetch_s:>16.2f} "
            f"{r.add_voter_s * 1000:>12.1f} {r.remove_voter_s * 1000:>15.1f} {r.total_s:>8.2f} "
            f"{r.fill_s:>7.1f} {r.leader_cpu_s:>7.2f} {r.replica_cpu_s:>8.2f}"
        )
    lines.append("")
    for size, rev in dict.fromkeys((r.size_bytes, r.rev) for r in results):
        rs = [r for r in results if r.size_bytes == size and r.rev == rev]
        ratio = statistics.median(r.catch_up_to_copy for r in rs)
        rate = statistics.median(r.catch_up_mb_per_s for r in rs)
        copy = statistics.median(r.copy_mb_per_s for r in rs)
        cpu = statistics.median(r.replica_cpu_s / max(1e-9, r.received_bytes / (1000 * MB)) for r in rs)
        who = f" @{rev}" if rev else ""
        lines.append(f"{size / MB:.0f} MB{who}: catch-up at {ratio:.2f}x the plain copy of the same bytes "
                     f"({rate:.0f} vs {copy:.0f} MB/s), replica {cpu:.2f} CPU s per GB, median of {len(rs)}")
    lines.extend(compare_revs(results))
    return "\n".join(lines)


def compare_revs(results: list[RecoveryResult]) -> list[str]:
    """With --baseline: per size, the current code's catch-up against REV's in the same run,
    as the ratio of their medians (copy-relative and MB/s), with each round's pair."""
    out: list[str] = []
    for size in dict.fromkeys(r.size_bytes for r in results):
        now = [r for r in results if r.size_bytes == size and not r.rev]
        for rev in dict.fromkeys(r.rev for r in results if r.size_bytes == size and r.rev):
            old = [r for r in results if r.size_bytes == size and r.rev == rev]
            if not now or not old:
                continue
            x_copy = statistics.median(r.catch_up_to_copy for r in now) / max(
                1e-9, statistics.median(r.catch_up_to_copy for r in old))
            x_rate = statistics.median(r.catch_up_mb_per_s for r in now) / max(
                1e-9, statistics.median(r.catch_up_mb_per_s for r in old))
            pairs = ", ".join(f"{a.catch_up_mb_per_s / max(1e-9, b.catch_up_mb_per_s):.2f}"
                              for a, b in zip(now, old, strict=False))
            out.append(f"{size / MB:.0f} MB current / @{rev}: {x_copy:.2f}x (copy-relative), "
                       f"{x_rate:.2f}x (MB/s); per round MB/s {pairs}")
    return out


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
