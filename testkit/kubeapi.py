"""The test Kubernetes API server: one etcd and the pinned kube-apiserver on free loopback ports,
in a temporary directory, for the tests (``tests/k8s/conftest.py``'s ``kube`` fixture) and the
operator benchmark (``bench/operator.py``).

`scripts/k8s-testenv.sh install` installs etcd (Debian) and builds kube-apiserver into
``${KK_CACHE:-~/.cache/kraftkeeper}/bin`` along with helm and kubectl. There is no controller
manager, scheduler or kubelet: objects are stored and validated, but no pod ever runs.
:func:`start_kube_apiserver` raises :class:`KubeApiMissing` naming what is missing and the command
that installs it; the tests turn that into a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from quorum.localports import free_port
from testkit.polling import wait_until

INSTALL_HINT = "run scripts/k8s-testenv.sh install"
READY_TIMEOUT_S = 180.0


class KubeApiMissing(RuntimeError):
    """Something the test API server needs is not installed (the message says what and how)."""


def cache_bin() -> Path:
    return Path(os.environ.get("KK_CACHE", str(Path.home() / ".cache" / "kraftkeeper"))) / "bin"


def find_binary(name: str) -> Path | None:
    """The cached build first (the pinned version), then PATH for etcd (a Debian package)."""
    cached = cache_bin() / name
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    if name == "etcd":
        found = shutil.which("etcd")
        return Path(found) if found else None
    return None




@dataclass(frozen=True)
class KubeEnv:
    base_url: str
    token: str
    kubeconfig: Path
    bin_dir: Path
    workdir: Path
    # The API server's audit log (JSON lines, Metadata level): who asked for what, to count the
    # operator's requests by verb and path (test_operator_cost.py).
    audit_log: Path | None = None

    def _ssl(self) -> ssl.SSLContext:
        # The API server's serving certificate is self-signed (generated into --cert-dir);
        # only loopback is involved, so verification buys nothing here.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
        accept: str = "application/json",
    ) -> tuple[int, Any]:
        """One REST call; returns (HTTP status, decoded JSON body or text). Never raises on 4xx/5xx."""
        url = self.base_url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = None
        if body is not None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", accept)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return status, raw.decode(errors="replace")

    def apply(
        self, obj: dict[str, Any], dry_run: bool = False, field_manager: str = "kk-tests"
    ) -> tuple[int, Any]:
        """Server-side apply of one object (strict field validation), like `kubectl apply --server-side`."""
        path = object_path(obj, named=True)
        params = {"fieldManager": field_manager, "force": "true", "fieldValidation": "Strict"}
        if dry_run:
            params["dryRun"] = "All"
        return self.request("PATCH", path, json.dumps(obj), params,
                            content_type="application/apply-patch+yaml")

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A token for ServiceAccount namespace/name (TokenRequest API), to act with exactly its RBAC."""
        status, body = self.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": seconds}})
        if status != 201:
            raise AssertionError(f"TokenRequest for {namespace}/{name} failed: {status} {body}")
        return str(body["status"]["token"])

    def kubeconfig_for(self, namespace: str, name: str) -> Path:
        """A kubeconfig file that authenticates as ServiceAccount namespace/name (e.g. to run the
        operator under the chart's least-privilege RBAC instead of the admin token)."""
        path = self.workdir / f"kubeconfig-{namespace}-{name}"
        path.write_text(yaml.safe_dump(_kubeconfig(self.base_url, f"{namespace}-{name}",
                                                   self.service_account_token(namespace, name))))
        return path

    def env(self) -> dict[str, str]:
        """Environment for subprocesses (kubectl, helm, the operator) pointed at this API server."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        # helm writes caches and config under HOME-derived paths; keep them inside the workdir.
        for var, sub in (("HELM_CACHE_HOME", "helm/cache"), ("HELM_CONFIG_HOME", "helm/config"),
                         ("HELM_DATA_HOME", "helm/data")):
            env[var] = str(self.workdir / sub)
        return env

    def wait_for(self, what: str, check: Any, timeout: float = 60.0) -> Any:
        """Poll check() until it returns a truthy value; fail naming `what` otherwise."""
        return wait_until(what, check, timeout)


# Resource paths for the kinds the tests and the chart use (no discovery needed).
_PLURALS = {
    "Namespace": ("v1", "namespaces", False),
    "ServiceAccount": ("v1", "serviceaccounts", True),
    "Service": ("v1", "services", True),
    "ConfigMap": ("v1", "configmaps", True),
    "Pod": ("v1", "pods", True),
    "PersistentVolumeClaim": ("v1", "persistentvolumeclaims", True),
    "Deployment": ("apps/v1", "deployments", True),
    "StatefulSet": ("apps/v1", "statefulsets", True),
    "CronJob": ("batch/v1", "cronjobs", True),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings", True),
    "NetworkPolicy": ("networking.k8s.io/v1", "networkpolicies", True),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets", True),
    "CustomResourceDefinition": ("apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "KRaftQuorum": ("kraftkeeper.io/v1alpha1", "kraftquorums", True),
    "ServiceMonitor": ("monitoring.coreos.com/v1", "servicemonitors", True),
}


def object_path(obj: dict[str, Any], named: bool = True, namespace: str | None = None) -> str:
    kind = obj["kind"]
    if kind not in _PLURALS:
        raise ValueError(f"object_path: no REST path known for kind {kind!r}; add it to _PLURALS")
    api_version, plural, namespaced = _PLURALS[kind]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    ns = namespace or obj.get("metadata", {}).get("namespace") or "default"
    path = f"{prefix}/namespaces/{ns}/{plural}" if namespaced else f"{prefix}/{plural}"
    if named:
        path += "/" + obj["metadata"]["name"]
    return path


def _kubeconfig(server: str, user: str, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "kk", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "kk", "context": {"cluster": "kk", "user": user}}],
        "current-context": "kk",
    }


def _wait_ready(env: KubeEnv, proc: subprocess.Popen[bytes], log: Path) -> None:
    def ready() -> str | None:
        if proc.poll() is not None:
            raise RuntimeError(f"kube-apiserver exited with {proc.returncode}:\n{_tail(log)}")
        status, _body = env.request("GET", "/readyz", timeout=5)
        return "ready" if status == 200 else None

    # OSError: connection refused while it starts.
    wait_until("kube-apiserver /readyz", ready, READY_TIMEOUT_S, 0.25, errors=(OSError,),
               context=lambda: _tail(log))


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_child(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 20 s: a child process started by a fixture."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def start_kube_apiserver() -> Iterator[KubeEnv]:
    """etcd and kube-apiserver, running until the block ends; then stopped and their data removed."""
    etcd = find_binary("etcd")
    apiserver = find_binary("kube-apiserver")
    if etcd is None:
        raise KubeApiMissing(f"etcd is not installed ({INSTALL_HINT})")
    if apiserver is None:
        where = cache_bin() / "kube-apiserver"
        raise KubeApiMissing(f"kube-apiserver is not built at {where} ({INSTALL_HINT})")
    if shutil.which("openssl") is None:
        raise KubeApiMissing("openssl is not installed (needed for the service-account key)")
    workdir = Path(tempfile.mkdtemp(prefix="kk-k8s-"))
    certs = workdir / "certs"
    certs.mkdir()
    sa_key, sa_pub = certs / "sa.key", certs / "sa.pub"
    subprocess.run(["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True)
    subprocess.run(["openssl", "rsa", "-in", str(sa_key), "-pubout", "-out", str(sa_pub)],
                   check=True, capture_output=True)
    token = uuid.uuid4().hex
    # Static token file: token,user,uid,"group". system:masters bypasses RBAC authorization.
    (certs / "tokens.csv").write_text(f'{token},kk-admin,kk-admin,"system:masters"\n')
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    etcd_log, api_log = workdir / "etcd.log", workdir / "apiserver.log"
    audit_log, audit_policy = workdir / "audit.jsonl", workdir / "audit-policy.yaml"
    # Metadata only (no bodies), and not the API server's own loopback client.
    audit_policy.write_text(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n"
        "- level: None\n  users: [system:apiserver]\n- level: Metadata\n"
    )
    etcd_proc = subprocess.Popen(
        [str(etcd), "--data-dir", str(workdir / "etcd"), "--name", "kk",
         "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
         "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-cluster", f"kk=http://127.0.0.1:{peer_port}",
         # The API server's data is throwaway; skipping fsync-heavy defaults is not possible in
         # 3.4, but a small snapshot count keeps the WAL short.
         "--snapshot-count", "5000"],
        stdout=etcd_log.open("wb"), stderr=subprocess.STDOUT,
    )
    api_proc = subprocess.Popen(
        [str(apiserver),
         f"--etcd-servers=http://127.0.0.1:{etcd_port}",
         "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={api_port}",
         f"--cert-dir={certs}", f"--token-auth-file={certs / 'tokens.csv'}",
         "--authorization-mode=RBAC",
         f"--service-account-key-file={sa_pub}", f"--service-account-signing-key-file={sa_key}",
         "--service-account-issuer=https://kubernetes.default.svc",
         "--service-cluster-ip-range=10.96.0.0/16",
         # ServiceAccount admission needs the token controller of a controller manager (which we
         # do not run) before any pod is admitted; everything else stays at its default.
         "--disable-admission-plugins=ServiceAccount",
         # One user, one client: API priority and fairness only adds background work here.
         "--enable-priority-and-fairness=false",
         "--profiling=false",
         f"--audit-policy-file={audit_policy}", f"--audit-log-path={audit_log}",
         "--audit-log-format=json", "--audit-log-maxsize=0"],
        stdout=api_log.open("wb"), stderr=subprocess.STDOUT,
    )
    base_url = f"https://127.0.0.1:{api_port}"
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(_kubeconfig(base_url, "kk-admin", token)))
    env = KubeEnv(base_url=base_url, token=token, kubeconfig=kubeconfig, bin_dir=cache_bin(), workdir=workdir,
                  audit_log=audit_log)
    try:
        if etcd_proc.poll() is not None:
            raise RuntimeError(f"etcd exited at once:\n{_tail(etcd_log)}")
        _wait_ready(env, api_proc, api_log)
        # The bootstrap controller creates the `default` namespace shortly after /readyz.
        env.wait_for("namespace default", lambda: env.request("GET", "/api/v1/namespaces/default")[0] == 200)
        yield env
    finally:
        stop_child(api_proc)
        stop_child(etcd_proc)
        shutil.rmtree(workdir, ignore_errors=True)
