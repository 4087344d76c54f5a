"""Side-by-side write benchmark: KRaftKeeper against etcd and PySyncObj on one machine.

Every system runs as a 3-node cluster on loopback and takes the same work from the same load
generator in the same invocation: committed writes per second and p50/p99 commit latency for
each value size and each number of concurrent clients (each client is one keep-alive HTTP/1.1
connection), plus the p99 of an open-loop run at half of the system's measured peak.

Systems (rows of the output):

* ``kraftkeeper fsync`` / ``kraftkeeper nofsync``: ``kraftkeeper start`` x3, writes are
  ``PUT /v1/kv/{key}`` to the leader (docs/reference.md); fsync is toggled through the config knob
  ``bench.common.FSYNC_CONFIG_KEY``.
* ``kraftkeeper fsync+tls``: the same with ``--tls-dir``: mutual TLS between the
  nodes, and every write over HTTPS with a ``readwrite`` client certificate.
* ``etcd``: Debian's ``etcd`` (3.4) x3, writes through its grpc-gateway ``POST /v3/kv/put``
  (base64 key and value in JSON); etcd always fsyncs its WAL before acknowledging.
* ``etcd tls``: the same with client and peer TLS and certificate checks on both
  (``--client-cert-auth``, ``--peer-client-cert-auth``); certificates from ``quorum.security.pki``
  (ECDSA P-256, as KRaftKeeper's), writes over HTTPS with a client certificate.

TLS rows need a generator that presents a client certificate: the asyncio one. When any TLS row
is requested and ``--generator auto``, every row uses it, so the cost of TLS printed at the end
compares like with like.
* ``pysyncobj batch`` / ``pysyncobj nobatch``: PySyncObj (a Python Raft library) x3, each node a
  process with an in-memory dict, no journal file (so no fsync), with the library's default
  ``appendEntriesUseBatch=True`` and with ``appendEntriesUseBatch=False``. A tiny aiohttp front
  end per node (``pysyncobj-node`` below) turns ``PUT /v1/kv/{key}`` into a replicated call and
  answers once PySyncObj reports it committed, 421 + ``leader_endpoint`` on a follower, like
  KRaftKeeper. The front end is the same aiohttp stack KRaftKeeper's server uses; its own cost
  is the "aiohttp no-op" ceiling printed at the top (a handler that answers at once).

Run ``python -m bench.engine --help``; ``bench/README.md`` explains the columns.

The pieces, one role a module (imports point one way, from this CLI down):

* ``bench/clusters.py``: the systems under test, started and stopped as 3-node clusters;
* ``bench/pysyncobj_node.py``: one PySyncObj node and its front end (``pysyncobj-node`` below);
* ``bench/measure.py``: the runs of the load generators (``bench/common.py``) against them;
* ``bench/results.py``: the result rows, the side-by-side table and the ``--json`` document;
* this module: the command line, which runs the rows in turn and prints the results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    # Run as a file (`python bench/engine.py`): import `bench` from the repository root, and keep
    # this directory off the path, where operator.py would shadow the standard library's module.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from bench.baseline import Pair, ratio_lines
from bench.clusters import Cluster, EtcdCluster, KraftKeeperCluster, PySyncObjCluster
from bench.load import LoadResult, have_wrk, value_bytes
from bench.measure import measure, measure_ceiling, measure_floor, measure_pair
from bench.procs import sigterm_as_interrupt
from bench.pysyncobj_node import pysyncobj_node
from bench.results import Row, _tls_cost, ceiling_lines, render, results_json
from testkit.revision import BaselineTree, export_tree, missing_start_flags


def parse_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{what}: expected positive integers, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Every process was stopped by the `finally` blocks on the way here.
        print("interrupted: all benchmark processes stopped", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["pysyncobj-node"]:
        return pysyncobj_node(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short runs, one value size (smoke test)")
    ap.add_argument("--duration", type=float, default=None, help="seconds per run (default 10, --quick 2)")
    ap.add_argument("--clients", type=lambda s: parse_list(s, "--clients"), default=[1, 16, 128])
    ap.add_argument(
        "--sizes",
        type=lambda s: parse_list(s, "--sizes"),
        default=None,
        help="value sizes in bytes (default 100,1024; --quick 100)",
    )
    ap.add_argument(
        "--peers",
        default="etcd,etcd-tls,pysyncobj",
        help="comma-separated peers from etcd,etcd-tls,pysyncobj; 'none' for kraftkeeper alone",
    )
    ap.add_argument(
        "--kraftkeeper",
        default="fsync,nofsync,fsync+tls",
        help="kraftkeeper configs from fsync,nofsync,fsync+tls; 'none' to run the peers alone",
    )
    ap.add_argument(
        "--generator",
        choices=["auto", "wrk", "asyncio"],
        default="auto",
        help="closed-loop generator (auto: wrk if installed)",
    )
    ap.add_argument("--no-half-load", action="store_true", help="skip the open-loop run at half of peak")
    ap.add_argument(
        "--workdir", type=Path, default=None, help="where data dirs and logs go (default: a temp dir)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--json", type=Path, default=None, help="also write all results as JSON here")
    ap.add_argument(
        "--baseline",
        metavar="REV",
        default=None,
        help="also run each kraftkeeper row with git revision REV's code, interleaved with the "
        "current code in this invocation, and print the ratio now/REV (no half-load runs for them)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="with --baseline: interleaved rounds per client count (default 3, --quick 1)",
    )
    a = ap.parse_args(argv)
    duration = a.duration if a.duration is not None else (2.0 if a.quick else 10.0)
    sizes = a.sizes or ([100] if a.quick else [100, 1024])
    if duration <= 0:
        ap.error("--duration must be > 0")
    peers = [] if a.peers == "none" else [p.strip() for p in a.peers.split(",") if p.strip()]
    kk = [] if a.kraftkeeper == "none" else [p.strip() for p in a.kraftkeeper.split(",") if p.strip()]
    bad = [p for p in peers if p not in ("etcd", "etcd-tls", "pysyncobj")] + [
        k for k in kk if k not in ("fsync", "nofsync", "fsync+tls")
    ]
    if bad:
        ap.error(
            f"unknown system(s) {', '.join(bad)}: "
            "--peers takes etcd,etcd-tls,pysyncobj and --kraftkeeper fsync,nofsync,fsync+tls"
        )
    any_tls = "etcd-tls" in peers or "fsync+tls" in kk
    generator = a.generator
    if generator == "auto":
        # TLS rows need client certificates, which only the asyncio generator presents; every
        # row then uses it so the cost of TLS compares like with like.
        generator = "wrk" if have_wrk() and not any_tls else "asyncio"
    if generator == "wrk" and not have_wrk():
        ap.error("--generator wrk: wrk is not installed (scripts/install-bench.sh install)")
    if generator == "wrk" and any_tls:
        ap.error("--generator wrk cannot present client certificates: leave out the TLS rows or use asyncio")
    if {"etcd", "etcd-tls"} & set(peers) and shutil.which("etcd") is None:
        ap.error("--peers etcd: etcd is not installed (scripts/install-bench.sh install), or leave it out")

    rounds = a.rounds if a.rounds is not None else (1 if a.quick else 3)
    if rounds <= 0:
        ap.error("--rounds must be > 0")
    if a.rounds is not None and a.baseline is None:
        ap.error("--rounds applies to --baseline only")
    if a.baseline is not None and not kk:
        ap.error("--baseline needs at least one --kraftkeeper row to compare")

    work = a.workdir or Path(tempfile.mkdtemp(prefix="kk-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    tree: BaselineTree | None = None
    if a.baseline is not None:
        try:
            tree = export_tree(a.baseline, work)
            missing = missing_start_flags(tree, ["--tls-dir"] if "fsync+tls" in kk else [])
        except ValueError as e:
            if a.workdir is None:
                shutil.rmtree(work, ignore_errors=True)
            ap.error(str(e))
        if missing:
            if a.workdir is None:
                shutil.rmtree(work, ignore_errors=True)
            ap.error(
                f"--baseline {a.baseline}: its `kraftkeeper start` has no {', '.join(missing)}: "
                "leave the fsync+tls row out"
            )

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    clusters: list[Cluster | tuple[KraftKeeperCluster, KraftKeeperCluster]] = []
    for k in kk:
        cur = KraftKeeperCluster(work, fsync=k.startswith("fsync"), tls=k.endswith("+tls"))
        if tree is None:
            clusters.append(cur)
        else:
            fsync, tls = k.startswith("fsync"), k.endswith("+tls")
            clusters.append((cur, KraftKeeperCluster(work, fsync=fsync, tls=tls, baseline=tree)))
    if "etcd" in peers:
        clusters.append(EtcdCluster(work))
    if "etcd-tls" in peers:
        clusters.append(EtcdCluster(work, tls=True))
    if "pysyncobj" in peers:
        clusters += [PySyncObjCluster(work, batch=True), PySyncObjCluster(work, batch=False)]

    rows: list[Row] = []
    pairs: list[Pair] = []
    ceiling: dict[str, LoadResult] = {}
    floor: dict[str, float] = {}
    try:
        with sigterm_as_interrupt():
            log(f"work dir {work}; generator {generator}; {duration:g}s per run; machine: {_machine()}")
            # The ceiling needs no long runs: it is a sanity line, not a result.
            ceiling = measure_ceiling(sizes, max(a.clients), min(duration, 5.0), generator, work, tls=any_tls)
            floor = measure_floor(work)
            log(
                f"  floor: fdatasync p50 {floor['fdatasync_p50_ms']:.3f} ms + loopback round trip p50 "
                f"{floor['loopback_rtt_p50_ms']:.3f} ms = {floor['writes_per_s']:.0f} writes/s for 1 client"
            )
            for name, res in ceiling.items():
                log(
                    f"  generator ceiling ({name} -> aiohttp no-op, {res.clients} conns): "
                    f"{res.writes_per_s:.0f} req/s"
                )
            for item in clusters:
                group: tuple[Cluster, ...] = item if isinstance(item, tuple) else (item,)
                try:
                    for cl in group:
                        log(f"starting {cl.label}")
                        cl.start()
                    for size in sizes:
                        if isinstance(item, tuple):
                            cur_row, base_row, pair = measure_pair(
                                item, size, a.clients, duration, generator, rounds, log
                            )
                            rows += [cur_row, base_row]
                            pairs.append(pair)
                        else:
                            rows.append(
                                measure(item, size, a.clients, duration, generator, not a.no_half_load, log)
                            )
                except (RuntimeError, TimeoutError, OSError) as e:
                    log(f"  {' / '.join(cl.label for cl in group)} FAILED: {e}")
                    for cl in group:
                        for size in sizes:
                            if not any(r.label == cl.label and r.size == size for r in rows):
                                rows.append(Row(cl.label, cl.family, size, error=str(e).splitlines()[0]))
                finally:
                    for cl in group:
                        cl.stop()
    finally:
        for item in clusters:
            for cl in item if isinstance(item, tuple) else (item,):
                cl.stop()
        if not a.keep and a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)

    print(f"machine: {_machine()}; generator: {generator}; {duration:g}s per run")
    for line in ceiling_lines(ceiling, sizes):
        print(line)
    print(render(rows, a.clients, sizes))
    for line in ratio_lines(pairs, a.clients):
        print(line)
    for line in floor_lines(floor, rows):
        print(line)
    if a.json:
        doc = results_json(generator, duration, a.clients, sizes, ceiling, rows, pairs)
        doc["floor"] = floor
        a.json.write_text(json.dumps(doc, indent=2))
    return 1 if any(r.error for r in rows) else 0


def floor_lines(floor: dict[str, float], rows: list[Row]) -> list[str]:
    """The floor (bench.measure.measure_floor) and each 1-client row's share of it."""
    if not floor:
        return []
    out = [
        f"floor (1 client): fdatasync p50 {floor['fdatasync_p50_ms']:.3f} ms + loopback round trip p50 "
        f"{floor['loopback_rtt_p50_ms']:.3f} ms -> {floor['writes_per_s']:.0f} writes/s"
    ]
    for r in rows:
        one = r.runs.get(1)
        if one is not None and one.writes_per_s > 0:
            out.append(
                f"  {r.label} {r.size} B, 1 client: {one.writes_per_s:.0f} w/s = "
                f"{one.writes_per_s / floor['writes_per_s']:.2f}x the floor"
            )
    return out


def _machine() -> str:
    import platform

    # The load average tells the reader whether other work shared the cores during the runs.
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    py = platform.python_version()
    return f"{platform.machine()} {os.cpu_count()} cpus, python {py}, load average {load}"


# `value_bytes` is re-exported for the recovery benchmark's fills; `Row` and `_tls_cost` stay
# importable from here for tests/bench/test_bench_tls.py.
__all__ = [
    "Cluster",
    "EtcdCluster",
    "KraftKeeperCluster",
    "PySyncObjCluster",
    "Row",
    "_tls_cost",
    "main",
    "value_bytes",
]

if __name__ == "__main__":
    sys.exit(main())
