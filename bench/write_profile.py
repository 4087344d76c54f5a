"""Where a write's CPU time goes: a 3-node KRaftKeeper cluster with fsync and mutual TLS under
the bench's closed-loop generator, its leader and one follower sampled by ``py-spy record
--native`` (the dev extra) for the whole run, and each sample put in one bucket by the
innermost frame that names a part of the path: fsync, TLS, WebSocket framing (peer streams),
HTTP (aiohttp's parser, router and writer), wire/JSON decoding and encoding, the Raft core,
storage, the event loop itself, other. Prints each bucket's share of the node's on-CPU samples
(shares, not times: the machine is shared and absolute numbers move with its load), and keeps
the raw collapsed stacks (flame graphs: any collapsed-stack viewer) in ``--out``.

    .venv/bin/python -m bench.write_profile --clients 1,128 --duration 15 --out /tmp/kk-profile
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from bench.clusters import KraftKeeperCluster
from bench.load import run_load

# (bucket, substrings of a frame): the first bucket, from the leaf up, whose substring a frame
# holds takes the sample.
BUCKETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("fsync", ("fdatasync", "fsync")),
    ("tls", ("SSL_", "ssl.py", "sslproto", "_ssl", "EVP_", "ecdsa", "sha256", "aes")),
    ("websocket", ("_websocket", "websocket", "peerstream")),
    ("wire/json", ("wire.py", "strictjson", "json/", "_json", "msgspec")),
    ("http", ("aiohttp/", "_http_parser", "http_writer", "multidict", "yarl")),
    ("raft core", ("quorum/core/",)),
    ("storage", ("quorum/storage/", "records.py")),
    ("node runtime", ("quorum/runtime/", "quorum/driver/")),
    # uvloop's own C frames (loop.c, libuv's uv_*, the C task step) name no package: without
    # them here they fell through to the frame above, run_node, and counted as node runtime.
    ("event loop", ("asyncio/", "uvloop", "epoll", "selectors", "loop.c", "uv_", "uv__", "task_step")),
)


# A thread that waits (a thread-pool worker on its queue, the loop in epoll_wait) is sampled
# too: its samples are "idle" and left out of the shares.
IDLE = (
    "_queue_SimpleQueue_get",
    "PyThread_acquire_lock",
    "pthread_cond",
    "epoll_wait",
    "epoll_pwait",
    "select (selectors",
)


def bucket_of(stack: str) -> str:
    frames = stack.split(";")
    if any(k in f for f in frames[-4:] for k in IDLE):
        return "idle"
    # The generator opens its connections (TLS handshakes included) before its clock starts but
    # while py-spy already samples: at 128 clients the handshakes were a quarter of the leader's
    # samples. They are connection set-up, not the cost of a write: kept out of the shares.
    if any("do_handshake" in f for f in frames):
        return "setup"
    for frame in reversed(frames):
        for name, keys in BUCKETS:
            if any(k in frame for k in keys):
                return name
    return "other"


def shares(raw: Path) -> tuple[Counter[str], int]:
    c: Counter[str] = Counter()
    total = 0
    if not raw.exists():
        return c, 0  # py-spy failed: its log beside it says why
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        b = bucket_of(stack)
        c[b] += int(n)
        total += int(n) if b not in ("idle", "setup") else 0
    return c, total


def record(pid: int, out: Path, duration: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"),
            "record",
            "--native",  # (pauses the process for each sample: --nonblocking cannot unwind C)
            "--rate",
            "100",
            "--format",
            "raw",
            "--duration",
            str(int(duration)),
            "--pid",
            str(pid),
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(out.with_suffix(".log"), "wb"),
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.write_profile", description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="1,128")
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "kk-profile")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kk-profile-"))
    cluster = KraftKeeperCluster(work, fsync=True, tls=True)
    try:
        cluster.start()
        for clients in (int(x) for x in a.clients.split(",")):
            leader = cluster.leader()
            idx = cluster.endpoints.index(leader) + 1
            follower = 1 if idx != 1 else 2
            pids = {
                "leader": cluster.procs.procs[f"node-{idx}"].popen.pid,
                "follower": cluster.procs.procs[f"node-{follower}"].popen.pid,
            }
            result: list[object] = []
            load = threading.Thread(
                target=lambda out, ep, n: out.append(
                    run_load(ep, "kv", 100, n, a.duration + 2, "asyncio", cluster.tls)
                ),
                args=(result, leader, clients),
            )
            load.start()
            spies = {
                role: record(pid, a.out / f"{role}-{clients}c.txt", a.duration) for role, pid in pids.items()
            }
            for p in spies.values():
                p.wait(timeout=a.duration + 60)
            load.join()
            res = result[0] if result else None
            # ok and errors both: a run whose writes all failed (0 writes/s) says so, not just 0
            print(
                f"{clients} clients: {getattr(res, 'writes_per_s', 0):.0f} writes/s, "
                f"{getattr(res, 'ok', 0)} ok, {getattr(res, 'errors', 0)} errors, "
                f"p50 {getattr(res, 'p50_ms', 0):.1f} ms" + ("" if res else " (the load generator raised)")
            )
            for role in spies:
                c, total = shares(a.out / f"{role}-{clients}c.txt")
                busy = [(k, v) for k, v in c.most_common() if k not in ("idle", "setup")]
                parts = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in busy) if total else "-"
                counts = f"{total} busy, {c['idle']} idle, {c['setup']} TLS set-up samples"
                print(f"  {role:8} ({counts}): {parts}")
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
