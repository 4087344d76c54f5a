"""The single-node Kubernetes of ``scripts/k8s-node.sh`` as the real operator bench
(:mod:`bench.operator_real`) uses it: ``kubectl`` and ``helm`` with the node's kubeconfig and
direct GETs for the fast polls (:class:`Kube`), the node brought up when it is not running and
stopped again at the end (:func:`node_cluster`), the chart installed and removed, and the local
PersistentVolumes recycled between runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import yaml

OP_NS, RELEASE = "kk-bench-system", "kkbench"
NS_LIVE, NS_IDLE = "kk-bench", "kk-bench-idle"
IMAGE = os.environ.get("KK_IMAGE", "kraftkeeper:dev")

REPO = Path(__file__).resolve().parents[1]


NODE_SH = REPO / "scripts" / "k8s-node.sh"


def _node(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(NODE_SH), *args], capture_output=True, text=True, timeout=timeout)


class Kube:
    """kubectl/helm with the node's kubeconfig, and direct GETs for the fast polls."""

    def __init__(self, kubeconfig: Path, bin_dir: Path) -> None:
        cfg = yaml.safe_load(kubeconfig.read_text())
        cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
        self.server = str(cluster["server"])
        self.ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.token = str(user["token"])
        self.bin_dir = bin_dir
        self.run_dir = kubeconfig.parent  # scripts/k8s-node.sh's run directory ($KK_NODE_DIR)
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig),
                    "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        helm_home = kubeconfig.parent / "helm"
        for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"),
                         ("HELM_DATA_HOME", "data")):
            self.env[var] = str(helm_home / sub)

    def get(self, path: str, accept: str = "application/json") -> Any:
        req = urllib.request.Request(self.server + path, headers={"Authorization": f"Bearer {self.token}",
                                                                  "Accept": accept})
        with urllib.request.urlopen(req, context=self.ctx, timeout=10) as r:
            body = r.read()
        return json.loads(body) if accept == "application/json" else body.decode()

    def run(self, tool: str, *args: str, stdin: str | None = None, check: bool = True,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.bin_dir / tool), *args], capture_output=True, text=True, env=self.env,
                              input=stdin, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)}: {proc.stderr.strip()[-2000:]}")
        return proc

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return self.run("kubectl", *args, stdin=stdin, check=check).stdout

    def apply(self, obj: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps(obj))

    def api_requests(self) -> float:
        total = 0.0
        for line in str(self.get("/metrics", accept="text/plain")).splitlines():
            if line.startswith("apiserver_request_total{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


@contextmanager
def node_cluster() -> Iterator[Kube]:
    """The single-node cluster (up here if it is not running, then down again), image imported."""
    if os.geteuid() != 0:
        raise RuntimeError("the single-node cluster needs root")
    check = _node("check", timeout=60)
    if check.returncode != 0:
        raise RuntimeError(f"scripts/k8s-node.sh check: {check.stdout.strip()[-1000:]}")
    started = _node("status", timeout=60).returncode != 0
    engine_was_running = _engine_running()
    if started:
        up = _node("up", timeout=600)
        if up.returncode != 0:
            _node("down", timeout=300)
            raise RuntimeError(f"scripts/k8s-node.sh up: {up.stderr[-2000:]}")
    try:
        env_out = _node("env", timeout=60).stdout
        kubeconfig = next(line.split("=", 1)[1].strip("'") for line in env_out.splitlines()
                          if line.startswith("export KUBECONFIG="))
        cache = Path(os.environ.get("KK_CACHE", str(Path.home() / ".cache" / "kraftkeeper")))
        build = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), "build"],
                               capture_output=True, text=True, timeout=1500,
                               env={**os.environ, "KK_IMAGE": IMAGE})
        if build.returncode != 0:
            raise RuntimeError(f"scripts/build-image.sh: {build.stderr[-2000:]}")
        load = _node("load-image", IMAGE, timeout=600)
        if load.returncode != 0:
            raise RuntimeError(f"k8s-node.sh load-image: {load.stderr[-2000:]}")
        yield Kube(Path(kubeconfig), cache / "bin")
    finally:
        if started:
            _node("down", timeout=300)
        if not engine_was_running:
            _stop_engine()


def _engine_running() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _stop_engine() -> None:
    """Stops the dockerd that scripts/build-image.sh started for this bench (by its pid file)."""
    try:
        pid = int(Path("/var/run/docker.pid").read_text().strip())
    except (OSError, ValueError):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.2)


def recycle_pvs(k: Kube) -> int:
    """Empties Released local PVs whose claim was in the bench's namespaces; makes them Available."""
    n = 0
    for pv in k.get("/api/v1/persistentvolumes")["items"]:
        ref = pv["spec"].get("claimRef") or {}
        if pv.get("status", {}).get("phase") != "Released" or ref.get("namespace") not in (NS_LIVE, NS_IDLE):
            continue
        path = Path(pv["spec"]["local"]["path"])
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        os.chown(path, 0, 0)
        path.chmod(0o755)
        k.kubectl("patch", "pv", pv["metadata"]["name"], "--type=json",
                  "-p", '[{"op": "remove", "path": "/spec/claimRef"}]')
        n += 1
    return n


IMMEDIATE_CLASS = "kk-bench-immediate"
_IMMEDIATE_LABEL = "kraftkeeper.io/bench-class"


def immediate_class(k: Kube, count: int = 8) -> str:
    """A StorageClass with ``volumeBindingMode: Immediate`` and ``count`` local PVs of its own (under
    the node's run directory, so ``scripts/k8s-node.sh down`` removes them): the PV controller binds
    a new claim as soon as it exists, and the scheduler has no volume to bind (its VolumeBinding
    PreBind, which waits for a WaitForFirstConsumer claim in 1 s polls, has nothing to do). Correct
    on one node only: a local PV bound before scheduling may sit on a node the pod cannot use."""
    node = k.get("/api/v1/nodes")["items"][0]["metadata"]["name"]
    docs: list[dict[str, Any]] = [{
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": IMMEDIATE_CLASS},
        "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "Immediate",
        "reclaimPolicy": "Retain",
    }]
    for i in range(count):
        path = k.run_dir / "pv-immediate" / f"pv{i}"
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o755)
        docs.append({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"{IMMEDIATE_CLASS}-pv{i}", "labels": {_IMMEDIATE_LABEL: "immediate"}},
            "spec": {
                "capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain", "storageClassName": IMMEDIATE_CLASS,
                "local": {"path": str(path)},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
            },
        })
    k.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    return IMMEDIATE_CLASS


def install(k: Kube) -> None:
    for ns in (NS_LIVE, NS_IDLE):
        k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    k.apply({"apiVersion": "v1", "kind": "ResourceQuota",
             "metadata": {"name": "no-pods", "namespace": NS_IDLE}, "spec": {"hard": {"pods": "0"}}})
    repo, tag = IMAGE.rsplit(":", 1)
    k.run("helm", "upgrade", "--install", RELEASE, str(REPO / "charts" / "kraftkeeper"), "--namespace", OP_NS,
          "--create-namespace", "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
          "--set", "image.pullPolicy=Never", "--set", f"operator.watchNamespaces={{{NS_LIVE},{NS_IDLE}}}",
          "--set", "metrics.service.enabled=false",
          # 100 KRaftQuorums (each with its clients and, in Operator TLS mode, its CA) need more
          # than the chart's default limit.
          "--set", "operator.resources.limits.memory=1Gi", "--wait", "--timeout", "5m", timeout=600)


def uninstall(k: Kube) -> None:
    for ns in (NS_LIVE, NS_IDLE):
        k.kubectl("delete", "kraftquorums", "--all", "-n", ns, "--wait=true", "--timeout=180s", check=False)
        k.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=180s", check=False)
    k.run("helm", "uninstall", RELEASE, "--namespace", OP_NS, "--wait", check=False)
    k.kubectl("delete", "namespace", OP_NS, "--wait=true", "--timeout=180s", check=False)
    with suppress(Exception):
        recycle_pvs(k)
    k.kubectl("delete", "pv", "-l", f"{_IMMEDIATE_LABEL}=immediate", "--wait=false", check=False)
    k.kubectl("delete", "storageclass", IMMEDIATE_CLASS, "--ignore-not-found", check=False)
