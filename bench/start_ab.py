"""A/B of a node's start on the host: ``kraftkeeper format`` then ``kraftkeeper start`` (two
processes, as quorum pods did) against ``kraftkeeper start --format-cluster-id`` (one), each timed
from the first spawn to the node's ``listening on`` line, alternating which goes first
(``python -m bench.start_ab [ROUNDS]``, default 8). A single-voter node on loopback, no TLS."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quorum.localports import free_ports

KK = [sys.executable, "-m", "quorum.cli"]
CLUSTER = "abcdefghijklmnopqrstuv"


def _until_listening(cmd: list[str]) -> float:
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.stdout is not None
    for line in p.stdout:
        if "listening on" in line:
            break
    else:
        raise RuntimeError(f"{' '.join(cmd)} exited ({p.wait()}) without listening")
    t = time.monotonic()
    p.terminate()
    p.wait(10)
    return t


def one_start(mode: str, root: Path) -> float:
    data = root / mode / "data"
    port = free_ports(1)[0]
    addr = f"127.0.0.1:{port}"
    start = [*KK, "start", "--dir", str(data), "--listen", addr, "--voters", f"1@{addr}"]
    t0 = time.monotonic()
    if mode == "two":
        subprocess.run([*KK, "format", "--dir", str(data), "--cluster-id", CLUSTER, "--node-id", "1",
                        "--ignore-formatted"], check=True, capture_output=True)
        return _until_listening(start) - t0
    return _until_listening([*start, "--format-cluster-id", CLUSTER, "--format-node-id", "1"]) - t0


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    res: dict[str, list[float]] = {"two": [], "one": []}
    for i in range(rounds):
        for mode in ("two", "one") if i % 2 == 0 else ("one", "two"):
            root = Path(tempfile.mkdtemp(prefix="kk-start-ab-"))
            try:
                res[mode].append(one_start(mode, root))
            finally:
                shutil.rmtree(root, ignore_errors=True)
    for mode, v in res.items():
        print(f"{mode} process(es) to listening: median {statistics.median(v):.2f} s, "
              f"min {min(v):.2f} s, max {max(v):.2f} s (n={len(v)})")
    print(f"ratio one/two: {statistics.median(res['one']) / statistics.median(res['two']):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
