"""Helpers for process-level operator tests: real ``kraftkeeper`` node processes on loopback,
supervised by ``kraftkeeper operator local`` (optionally with recovery switched off, when the
Kubernetes operator is the one that must recover), and ``run_format_container``, which runs a
StatefulSet's format init container command locally the way the kubelet would."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kraftkeeper_operator.manifests import BOOTSTRAP_MOUNT, DATA_DIR

T = TypeVar("T")


def engine_missing() -> str | None:
    """Why real node processes cannot run here, or None if they can."""
    try:
        from quorum.core.raft import RaftCore  # noqa: F401
        from quorum.runtime.run import run_node  # noqa: F401
    except ImportError as e:
        return f"the quorum engine cannot start nodes yet ({e})"
    return None


def free_base_port(n: int) -> int:
    """A base port with base..base+n free on loopback (best effort; bind-and-release)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + n >= 65535:
            continue
        ok = True
        for i in range(n + 1):
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", base + i))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range")


def poll(what: str, fn: Callable[[], T | None], timeout: float = 60.0, every: float = 0.2) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as e:  # keep polling through transient errors, report the last one
            last = e
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def kk(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quorum.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class LocalCluster:
    """``kraftkeeper operator local`` in a subprocess."""

    def __init__(
        self, d: Path, nodes: int = 3, *, extra: list[str] | None = None, cluster_id: str | None = None
    ) -> None:
        self.dir = d
        self.nodes = nodes
        self.base = free_base_port(nodes)
        if cluster_id is not None:
            # Stand-in for pods: the cluster id the StatefulSet's format command uses, so that the
            # pod's real init container accepts these node directories (--ignore-formatted checks it).
            d.mkdir(parents=True, exist_ok=True)
            (d / "cluster.json").write_text(
                json.dumps({"cluster_id": cluster_id, "nodes": nodes, "base_port": self.base}) + "\n"
            )
        self.log = d.parent / f"{d.name}-operator.log"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "quorum.cli",
                "operator",
                "local",
                "--dir",
                str(d),
                "--nodes",
                str(nodes),
                "--base-port",
                str(self.base),
                "--interval",
                "0.3",
                *(extra or []),
            ],
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def endpoint(self, i: int) -> str:
        return f"127.0.0.1:{self.base + i}"

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
        out = kk("quorum", "describe", "--bootstrap", self.bootstrap(), "--json", timeout=30)
        if out.returncode != 0:
            return None
        data: dict[str, Any] = json.loads(out.stdout)
        return data

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return int(self.proc.returncode or 0)

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def hold(d: Path, node: int) -> Path:
    """Keep node ``node`` of the local cluster in ``d`` stopped (the replace-disk handshake: the
    supervisor stops a held node and starts nothing for it while the holder, this test process,
    lives). Returns the hold file; delete it to let the supervisor start the node again."""
    f = d / "control" / f"node-{node}.hold"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(f"{os.getpid()}\n")
    return f


def run_format_container(
    sts: dict[str, Any], ordinal: int, data: Path, flag_dir: Path
) -> subprocess.CompletedProcess[str]:
    """Run the StatefulSet's format init container command for pod ``ordinal`` the way the kubelet
    would (the one part that cannot run here), with its volumes at local paths. The same command
    performs a requested unclean recovery (manifests.format_command)."""
    (fmt,) = sts["spec"]["template"]["spec"]["initContainers"]
    assert fmt["command"][:2] == ["sh", "-c"]
    script = fmt["command"][2].replace(BOOTSTRAP_MOUNT, str(flag_dir)).replace(DATA_DIR, str(data))
    env = {
        **os.environ,
        "POD_NAME": f"{sts['metadata']['name']}-{ordinal}",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False
    )
