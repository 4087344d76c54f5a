"""Helpers for process-level operator tests: real ``kraftkeeper`` node processes on loopback,
supervised by ``kraftkeeper operator local`` (optionally with recovery switched off, when the
Kubernetes operator is the one that must recover), and ``run_format_container``, which runs a
StatefulSet's format init container command locally the way the kubelet would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any, TypeVar

from kraftkeeper_operator.k8s.manifests import BOOTSTRAP_MOUNT, DATA_DIR
from kraftkeeper_operator.k8s.tlsspec import TLS_MOUNT, check_command

from testkit.launchers import (
    kraftkeeper_argv,
    reported_base_port,
    start_operator_local,
    stop_process,
    tail_of,
)
from testkit.polling import ANY_ERROR, wait_until

T = TypeVar("T")


def engine_missing() -> str | None:
    """Why real node processes cannot run here, or None if they can."""
    try:
        from quorum.core.raft import RaftCore  # noqa: F401
        from quorum.runtime.run import run_node  # noqa: F401
    except ImportError as e:
        return f"the quorum engine cannot start nodes yet ({e})"
    return None




def kk(
    *args: str, timeout: float = 60.0, client_config: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the CLI; ``client_config`` goes through ``KRAFTKEEPER_CLIENT_CONFIG`` (a TLS cluster)."""
    env = {k: v for k, v in os.environ.items() if k != "KRAFTKEEPER_CLIENT_CONFIG"}
    if client_config is not None:
        env["KRAFTKEEPER_CLIENT_CONFIG"] = str(client_config)
    return subprocess.run(
        kraftkeeper_argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


class LocalCluster:
    """``kraftkeeper operator local`` in a subprocess: TLS and credentials on (its default),
    unless ``insecure``; :meth:`kk` runs a client command with the cluster's ``client.json``."""

    def __init__(
        self,
        d: Path,
        nodes: int = 3,
        *,
        extra: list[str] | None = None,
        cluster_id: str | None = None,
        base_port: int | None = None,
        insecure: bool = False,
    ) -> None:
        self.dir = d
        self.nodes = nodes
        self.insecure = insecure
        self.log = d.parent / f"{d.name}-operator.log"
        self._extra = list(extra or [])
        # A given base port: supervising an existing cluster directory again (it is fixed there).
        # Otherwise the operator chooses a free block, binds its own port and only then reports
        # the block in cluster.json (no other process can take that port in between).
        if cluster_id is not None:
            # Stand-in for pods: the cluster id the StatefulSet's format command uses, so that the
            # pod's real init container accepts these node directories (--ignore-formatted checks
            # it). Base port 0: chosen by the operator at its first start.
            d.mkdir(parents=True, exist_ok=True)
            (d / "cluster.json").write_text(
                json.dumps({"cluster_id": cluster_id, "nodes": self.nodes, "base_port": 0}) + "\n"
            )
        extra_args = ["--interval", "0.3", *(["--insecure"] if self.insecure else []), *self._extra]
        self.proc = start_operator_local(d, self.nodes, base_port or 0, extra_args, self.log)
        self.base = base_port or reported_base_port(d, self.proc, self.log)

    def endpoint(self, i: int) -> str:
        return f"127.0.0.1:{self.base + i}"

    @property
    def client_config(self) -> Path | None:
        return None if self.insecure else self.dir / "client.json"

    def kk(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        if self.client_config is not None:
            wait_until("client.json written", self.client_config.exists, 60, errors=ANY_ERROR)
        return kk(*args, timeout=timeout, client_config=self.client_config)

    def bootstrap(self) -> str:
        return ",".join(self.endpoint(i) for i in range(1, self.nodes + 1))

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.base}/status", timeout=5) as r:
            data: dict[str, Any] = json.loads(r.read())
            return data

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.base}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def describe(self) -> dict[str, Any] | None:
        out = self.kk("quorum", "describe", "--bootstrap", self.bootstrap(), "--json", timeout=30)
        if out.returncode != 0:
            return None
        data: dict[str, Any] = json.loads(out.stdout)
        return data

    def describe_all_known(self) -> dict[str, Any] | None:
        """The describe object once every voter's storage UUID is known (None before)."""
        x = self.describe()
        ok = x is not None and x["leader_id"] > 0 and len(x["voters"]) == self.nodes
        return x if ok and x is not None and all(v["uuid"] for v in x["voters"]) else None

    def stop(self) -> int:
        return stop_process(self.proc)

    def tail(self, n: int = 40) -> str:
        return tail_of(self.log, n)


def hold(d: Path, node: int) -> Path:
    """Keep node ``node`` of the local cluster in ``d`` stopped (the replace-disk handshake: the
    supervisor stops a held node and starts nothing for it while the holder, this test process,
    lives). Returns the hold file; delete it to let the supervisor start the node again."""
    f = d / "control" / f"node-{node}.hold"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(f"{os.getpid()}\n")
    return f


def run_format_container(
    sts: dict[str, Any], ordinal: int, data: Path, flag_dir: Path, tls_dir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the volume preparation of the StatefulSet's node container for pod ``ordinal`` (its
    command up to the ``exec`` of the node) the way the kubelet would (the one part that cannot run
    here), with its volumes at local paths. The same command performs a requested unclean recovery
    (manifests.format_command). ``tls_dir`` stands for the pod's own directory of the TLS volume
    (default: none, and the command's check that the certificate is there is left out)."""
    node = next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "node")
    assert node["command"][:2] == ["sh", "-c"]
    prepare, _, start = node["command"][2].partition("\nexec kraftkeeper start ")
    # The node's own process formats the volume before it serves (start --format-cluster-id):
    # that part runs here as the `kraftkeeper format --ignore-formatted` it stands for.
    cluster_id = start.split("--format-cluster-id ", 1)[1].split(" ", 1)[0]
    assert start.startswith(f'--format-cluster-id {cluster_id} --format-node-id "$ID" "$@" '), start
    prepare += (
        f'\nexec kraftkeeper format --dir {DATA_DIR} --cluster-id {cluster_id} --node-id "$ID" '
        '--ignore-formatted "$@"'
    )
    if tls_dir is None:
        prepare = prepare.replace(f"{check_command()}\n", "")
    script = prepare.replace(BOOTSTRAP_MOUNT, str(flag_dir)).replace(DATA_DIR, str(data))
    script = script.replace(TLS_MOUNT, str(tls_dir or data.parent / "no-tls-volume"))
    env = {
        **os.environ,
        "POD_NAME": f"{sts['metadata']['name']}-{ordinal}",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False
    )


# ---------------------------------------------------------------------------------------------
# A longer but stale log (unclean-recovery survivor tests)

# Nodes keep a leader without a majority for this long (and followers wait as long before an
# election): the window in which a cut-off leader appends records it can never commit.
STALE_NODE_CONFIG = {"raft": {"fetch_timeout_ms": 8000}}


def wait_held_stopped(d: Path, node: int) -> None:
    """Wait until the supervisor of the local cluster in ``d`` stopped held node ``node``."""
    f = d / "control" / f"node-{node}.stopped"
    wait_until(f"node {node} stopped", f.exists, 60, 0.05)


def log_state(endpoint: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{endpoint}/v1/node/log-state", timeout=3) as r:
        data: dict[str, Any] = json.loads(r.read())
        return data


def _put_nowait(endpoint: str, key: str, value: str) -> None:
    """A PUT whose answer nobody waits for (it cannot commit)."""
    req = urllib.request.Request(f"http://{endpoint}/v1/kv/{key}", data=value.encode(), method="PUT")
    try:
        urllib.request.urlopen(req, timeout=0.5).close()
    except OSError:
        pass


def make_stale_longer_log(c: LocalCluster, holds: list[Path]) -> tuple[int, int]:
    """On a healthy 5-node cluster run with :data:`STALE_NODE_CONFIG`, build the case where the
    longest log is the stale one, and leave exactly two replicas running (no majority):

    1. every node but the leader A is held (stopped); A, still leader until its fetch timeout,
       appends ``stale-*`` writes that can never commit;
    2. A is held; three others elect a leader at a newer epoch and commit ``fresh = yes``;
    3. two of those three are held again and, once B leads no more, A is released.

    Running: A (last epoch e, the longest log) and B (last epoch > e, shorter). Returns (A, B).
    Hold files are appended to ``holds`` (the caller deletes them)."""
    ids = list(range(1, c.nodes + 1))
    first = wait_until("a leader with every voter's UUID known", c.describe_all_known, 120, errors=ANY_ERROR)
    a = int(first["leader_id"])
    others = [i for i in ids if i != a]
    held = {i: hold(c.dir, i) for i in others}
    holds.extend(held.values())
    for i in others:
        wait_held_stopped(c.dir, i)
    before = log_state(c.endpoint(a))
    assert before["role"] == "leader", f"node {a} resigned before the stale writes: {before}"
    writers = [
        threading.Thread(
            target=_put_nowait, args=(c.endpoint(a), f"stale-{k}", "never-committed"), daemon=True
        )
        for k in range(40)
    ]
    for t in writers:  # at once: the window closes at A's fetch timeout
        t.start()
    stale = wait_until(
        f"node {a} appended the stale writes",
        lambda: (s := log_state(c.endpoint(a)))["end_offset"] >= before["end_offset"] + 20 and s,
        30,
        errors=ANY_ERROR,
    )
    for t in writers:
        t.join()
    holds.append(hold(c.dir, a))
    wait_held_stopped(c.dir, a)
    b, rest = others[0], others[1:3]
    for i in (b, *rest):
        held[i].unlink()
    eps = ",".join(c.endpoint(i) for i in (b, *rest))
    put = wait_until(
        "fresh = yes committed at a newer epoch",
        lambda: (p := c.kk("kv", "put", "--bootstrap", eps, "fresh", "yes")).returncode == 0 and p,
        120,
        0.5,
        errors=ANY_ERROR,
    )
    assert put.returncode == 0
    fresh = wait_until(
        f"node {b} has the committed write",
        lambda: (
            (s := log_state(c.endpoint(b)))["high_watermark"] >= s["end_offset"] > 0
            and s["last_epoch"] > stale["last_epoch"]
            and s
        ),
        60,
        errors=ANY_ERROR,
    )
    for i in rest:
        holds.append(hold(c.dir, i))
        wait_held_stopped(c.dir, i)
    # B may be the leader; alone it resigns after its fetch timeout. Only then may A come back,
    # or A would follow B and lose its stale tail before anyone looked at it.
    wait_until(
        f"node {b} not leading", lambda: log_state(c.endpoint(b))["role"] != "leader", 60, errors=ANY_ERROR,
    )
    holds[holds.index(c.dir / "control" / f"node-{a}.hold")].unlink()
    st = wait_until(f"node {a} back", lambda: log_state(c.endpoint(a)), 60, errors=ANY_ERROR)
    # The case under test: the longer log is the stale one.
    assert st["end_offset"] > fresh["end_offset"] and st["last_epoch"] < fresh["last_epoch"], (st, fresh)
    return a, b
