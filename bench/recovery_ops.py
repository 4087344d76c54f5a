"""What the disk-failure recovery bench (:mod:`bench.recovery`) does to a cluster and measures
around it: fill the log with concurrent writes (:func:`fill`), the plain-copy limit of the disk
(:func:`copy_limit`), the admin calls and describe on the leader, the bytes and CPU seconds
used, and py-spy profilers on the leader and the replica.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.clusters import KraftKeeperCluster
from bench.common import NOT_YET, http_call
from bench.load import TlsFiles, value_bytes
from quorum.storage.segment import PREALLOCATE_BYTES
from testkit.polling import wait_until

MB = 1_000_000


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux ``/proc``; 0 elsewhere). On a
    shared machine the CPU a catch-up costs varies far less than its wall time."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def dir_bytes(path: Path) -> int:
    """Bytes in the files under ``path``, without the zero tail of a preallocated log segment
    (not data: docs/design.md); a file the running node removes meanwhile counts 0."""
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file():
                size = p.stat().st_size
                total += size - (_zero_tail(p, size) if p.suffix == ".log" else 0)
        except FileNotFoundError:
            pass
    return total


def _zero_tail(p: Path, size: int) -> int:
    with open(p, "rb") as f:  # the tail is at most one preallocation step
        f.seek(max(0, size - PREALLOCATE_BYTES))
        chunk = f.read()
    return len(chunk) - len(chunk.rstrip(b"\0"))


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

    return wait_until("a leader in describe", find, 60, 0.1, errors=NOT_YET)


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


def replica_entry(d: dict[str, Any], group: str, rid: int, uuid: str) -> dict[str, Any] | None:
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
