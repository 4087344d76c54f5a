"""Fixtures for the end-to-end tests on a real single-node Kubernetes (scripts/k8s-node.sh).

The cluster is the real thing: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
kubelet + containerd, kube-proxy and CoreDNS as host processes, pods on a private CNI bridge
that never leaves the machine. It is brought up once for this test package (package-scoped
fixtures: it is gone before the rest of the suite runs, so it takes no CPU from other tests) and
torn down at the end
(everything stopped by PID, mounts, iptables chains and sysctls put back); a cluster that was
already running (`scripts/k8s-node.sh up` by hand) is used as it is and left running.

Fixtures:

- ``node_cluster`` (package): a :class:`NodeCluster` with ``kubeconfig``, ``kubectl(...)``,
  ``helm(...)``, ``get_json(...)`` and ``wait_for(...)``;
- ``kk_image`` (package): the product image built by scripts/build-image.sh (as a user does;
  once per test run, tests/conftest.py ``image_build``) and imported into the node's
  containerd; its reference;
- ``operator_release`` (package): ``helm install`` of charts/kraftkeeper into namespace
  ``kraftkeeper-system`` (the operator runs as a pod from the image with the chart's RBAC,
  probes and security context); the namespace name;
- ``quorum_ns`` (package): namespace ``kk-e2e`` under the ``restricted`` Pod Security level
  with e2e/sample.yaml applied (KRaftQuorum ``demo``), waited until Available; plus a client
  pod ``client`` running the image, from which the tests write through the client Service.

Skips happen only where the machine truly lacks something (not root, no br_netfilter); when
KK_NODE_TESTS=1 (set by ``./dev.sh test``) a missing install is a failure, not a skip.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from testkit.polling import wait_until
from tests.conftest import ImageBuild

REPO = Path(__file__).resolve().parents[2]
NODE_SH = REPO / "scripts" / "k8s-node.sh"
CACHE = Path(os.environ.get("KK_CACHE", str(Path.home() / ".cache" / "kraftkeeper")))
IMAGE = os.environ.get("KK_IMAGE", "kraftkeeper:dev")
OPERATOR_NS = "kraftkeeper-system"
QUORUM_NS = "kk-e2e"
QUORUM = "demo"
T = TypeVar("T")


def _required() -> bool:
    return os.environ.get("KK_NODE_TESTS") == "1"


def _lacking(reason: str) -> None:
    """A missing install fails under ./dev.sh test (KK_NODE_TESTS=1), else skips with the reason."""
    if _required():
        pytest.fail(reason)
    pytest.skip(reason)


@dataclass
class NodeCluster:
    kubeconfig: Path
    bin_dir: Path
    started_here: bool
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.env = dict(os.environ)
        self.env["KUBECONFIG"] = str(self.kubeconfig)
        self.env["PATH"] = f"{self.bin_dir}{os.pathsep}{self.env.get('PATH', '')}"
        helm_home = self.kubeconfig.parent / "helm"
        for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"),
                         ("HELM_DATA_HOME", "data")):
            self.env[var] = str(helm_home / sub)

    def run(self, *args: str, check: bool = True, timeout: float = 120, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=self.env,
                              input=stdin)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120, stdin: str | None = None
                ) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.bin_dir / "kubectl"), *args, check=check, timeout=timeout, stdin=stdin)

    def helm(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.bin_dir / "helm"), *args, check=check, timeout=timeout)

    def get_json(self, *args: str) -> Any:
        """`kubectl get ... -o json`, decoded; None when the object does not exist."""
        proc = self.kubectl("get", *args, "-o", "json", check=False)
        if proc.returncode != 0:
            if "NotFound" in proc.stderr:
                return None
            raise AssertionError(f"kubectl get {' '.join(args)}: {proc.stderr}")
        return json.loads(proc.stdout)

    def wait_for(self, what: str, check: Callable[[], T | None], timeout: float = 180.0,
                 interval: float = 1.0, context: Callable[[], str] | None = None) -> T:
        """Poll check() until it returns something truthy; fail naming `what` (and context()) otherwise."""
        return wait_until(what, check, timeout, interval, context=context)

    def quorum(self, ns: str = QUORUM_NS, name: str = QUORUM) -> dict[str, Any]:
        obj = self.get_json("kraftquorum", name, "-n", ns)
        assert obj is not None, f"KRaftQuorum {ns}/{name} does not exist"
        return obj  # type: ignore[no-any-return]

    def describe(self, ns: str = QUORUM_NS) -> str:
        """What a person would look at when something hangs: pods, the quorum's status, events."""
        parts = []
        for args in (("get", "pods", "-n", ns, "-o", "wide"), ("get", "kraftquorum", "-n", ns, "-o", "yaml"),
                     ("get", "events", "-n", ns, "--sort-by=.lastTimestamp"),
                     ("logs", "-n", OPERATOR_NS, "deploy/kraftkeeper", "--tail=60")):
            proc = self.kubectl(*args, check=False)
            parts.append(f"$ kubectl {' '.join(args)}\n{proc.stdout[-6000:]}{proc.stderr[-2000:]}")
        return "\n".join(parts)


def _node(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(NODE_SH), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="package")
def node_cluster() -> Iterator[NodeCluster]:
    if os.geteuid() != 0:
        pytest.skip("the single-node cluster needs root (kubelet, containerd, iptables, mounts)")
    if shutil.which("modprobe"):
        subprocess.run(["modprobe", "br_netfilter"], capture_output=True)
    if not Path("/proc/sys/net/bridge").is_dir():
        pytest.skip("the kernel has no br_netfilter: kube-proxy cannot route Services between pods")
    check = _node("check", timeout=60)
    if check.returncode != 0:
        _lacking("the single-node cluster is not installed (run scripts/k8s-node.sh install):\n"
                 + check.stdout)
    already = _node("status", timeout=60).returncode == 0
    if not already:
        up = _node("up", timeout=600)
        if up.returncode != 0:
            _node("down", timeout=300)
            raise AssertionError(f"scripts/k8s-node.sh up failed ({up.returncode}):\n{up.stderr[-6000:]}")
    env_out = _node("env", timeout=60).stdout
    kubeconfig = next(line.split("=", 1)[1].strip("'") for line in env_out.splitlines()
                      if line.startswith("export KUBECONFIG="))
    cluster = NodeCluster(kubeconfig=Path(kubeconfig), bin_dir=CACHE / "bin", started_here=not already)
    try:
        yield cluster
    finally:
        if cluster.started_here:
            down = _node("down", timeout=300)
            assert down.returncode == 0, f"scripts/k8s-node.sh down failed:\n{down.stderr[-4000:]}"


DOCKER = "/usr/bin/docker"


def _engine_running() -> bool:
    try:
        return subprocess.run([DOCKER, "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _stop_engine() -> None:
    """Stops the dockerd that scripts/build-image.sh started for this session (by its pid file)."""
    pid_file = Path("/var/run/docker.pid")
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    os.kill(pid, 15)
    try:
        wait_until(f"dockerd {pid} to exit", lambda: not Path(f"/proc/{pid}").exists(), 30)
    except AssertionError:
        pass  # best effort, as before: the deadline only bounds how long the session waits for it


@pytest.fixture(scope="package")
def kk_image(node_cluster: NodeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    engine_was_running = _engine_running()
    # Built once per test run (tests/conftest.py; tests/k8s/test_image.py may have built it and
    # stopped the engine it had started, so start that again for `docker save`).
    build: ImageBuild = request.getfixturevalue("image_build")
    if build.returncode != 0:
        raise AssertionError(f"scripts/build-image.sh failed:\n{build.stderr[-6000:]}")
    assert build.image == IMAGE, (build.image, IMAGE)
    if not _engine_running():
        engine = build.engine()
        assert engine.returncode == 0, f"scripts/build-image.sh engine failed:\n{engine.stderr[-4000:]}"
    load = _node("load-image", IMAGE, timeout=600)
    assert load.returncode == 0, f"importing {IMAGE} into containerd failed:\n{load.stderr[-4000:]}"
    try:
        yield IMAGE
    finally:
        if not engine_was_running:
            _stop_engine()


def _quorum_namespace(c: NodeCluster) -> None:
    """Namespace kk-e2e under the `restricted` Pod Security level."""
    if c.get_json("namespace", QUORUM_NS) is None:
        c.kubectl("create", "namespace", QUORUM_NS)
    c.kubectl("label", "--overwrite", "namespace", QUORUM_NS,
              "pod-security.kubernetes.io/enforce=restricted",
              "pod-security.kubernetes.io/enforce-version=v1.30")


@pytest.fixture(scope="package")
def operator_release(node_cluster: NodeCluster, kk_image: str) -> str:
    repo, tag = kk_image.rsplit(":", 1)
    # The watched namespace exists before the install: the chart puts the operator's Role there.
    _quorum_namespace(node_cluster)
    node_cluster.helm("upgrade", "--install", "kraftkeeper", str(REPO / "charts" / "kraftkeeper"),
                      "--namespace", OPERATOR_NS, "--create-namespace",
                      "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
                      "--set", "image.pullPolicy=Never", "--set", "operator.persistence.enabled=true",
                      # The chart's default namespace-scoped RBAC: Role + RoleBinding in
                      # the quorum's namespace only, nothing cluster-wide.
                      "--set", "rbac.scope=namespace", "--set", f"operator.watchNamespaces={{{QUORUM_NS}}}",
                      "--wait", "--timeout", "5m")
    return OPERATOR_NS


# Where the client pod mounts the quorum's application credential when the operator issues one
# (Secret NAME-client with client.json, TLS on): the tests' clients use it when it is there.
CLIENT_CONFIG = "/etc/kraftkeeper/client/client.json"
CLIENT_POD = {
    "apiVersion": "v1", "kind": "Pod",
    # kraftkeeper.io/client: the label the quorum's NetworkPolicy lets in by default.
    "metadata": {"name": "client", "labels": {"app": "kk-e2e-client", "kraftkeeper.io/client": QUORUM}},
    "spec": {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "client", "image": IMAGE, "imagePullPolicy": "Never",
            # The image's entrypoint is the CLI; the client pod only needs to stay up for exec.
            "command": ["python", "-c", "import signal; signal.pause()"],
            "env": [{"name": "HOME", "value": "/tmp"}],
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                             {"name": "client", "mountPath": "/etc/kraftkeeper/client", "readOnly": True}],
            "resources": {"requests": {"cpu": "10m", "memory": "48Mi"}, "limits": {"memory": "192Mi"}},
        }],
        "volumes": [{"name": "tmp", "emptyDir": {}},
                    {"name": "client", "secret": {"secretName": f"{QUORUM}-client", "optional": True}}],
    },
}


def quorum_available(cluster: NodeCluster, ns: str = QUORUM_NS, name: str = QUORUM, voters: int = 3
                     ) -> dict[str, Any] | None:
    """The KRaftQuorum's status when it shows `voters` voters with UUIDs, a leader and Available."""
    st = (cluster.get_json("kraftquorum", name, "-n", ns) or {}).get("status") or {}
    conds = {c.get("type"): c.get("status") for c in st.get("conditions") or []}
    vs = st.get("voters") or []
    if (conds.get("Available") == "True" and st.get("leaderId", -1) >= 0 and len(vs) == voters
            and all(v.get("uuid") for v in vs)):
        return st  # type: ignore[no-any-return]
    return None


def quorum_pods(cluster: NodeCluster, ns: str = QUORUM_NS, instance: str | None = None
                ) -> list[dict[str, Any]]:
    """The quorum pods of namespace ``ns`` (of KRaftQuorum ``instance`` only, when given)."""
    selector = "app.kubernetes.io/component=quorum"
    if instance is not None:
        selector = f"app.kubernetes.io/instance={instance},{selector}"
    return cluster.get_json("pods", "-n", ns, "-l", selector)["items"]  # type: ignore[no-any-return]


def pod_ready(pod: dict[str, Any]) -> bool:
    """Ready and not being deleted (a terminating pod may still report Ready)."""
    conds = {x["type"]: x["status"] for x in pod.get("status", {}).get("conditions") or []}
    return pod.get("metadata", {}).get("deletionTimestamp") is None and conds.get("Ready") == "True"


def secret_data(cluster: NodeCluster, name: str, ns: str = QUORUM_NS) -> dict[str, bytes] | None:
    """Secret ``ns/name``'s data, decoded; None when it does not exist."""
    obj = cluster.get_json("secret", name, "-n", ns)
    return None if obj is None else {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}


def wait_available(cluster: NodeCluster, voters: int = 3) -> dict[str, Any]:
    """Each test starts from a quorum the operator reports Available (it may still be settling
    after the previous test's restarts)."""
    return cluster.wait_for(f"KRaftQuorum demo Available with {voters} voters",
                            lambda: quorum_available(cluster, voters=voters), timeout=180,
                            context=cluster.describe)


@pytest.fixture(scope="package")
def quorum_ns(node_cluster: NodeCluster, operator_release: str) -> str:
    c = node_cluster
    c.kubectl("apply", "-n", QUORUM_NS, "-f", str(REPO / "e2e" / "sample.yaml"))
    c.wait_for("KRaftQuorum demo Available with 3 voters", lambda: quorum_available(c), timeout=300,
               context=c.describe)
    # After the quorum is up, so that its client credential (if any) exists when the pod mounts it.
    c.kubectl("apply", "-n", QUORUM_NS, "-f", "-", stdin=json.dumps(CLIENT_POD))
    c.kubectl("wait", "-n", QUORUM_NS, "--for=condition=Ready", "pod/client", "--timeout=120s")
    return QUORUM_NS
