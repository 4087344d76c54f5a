"""The Helm chart: lint, render (default and every toggle on), validate offline against the
Kubernetes 1.30 schemas (kubernetes-validate), and apply with server-side dry run to the real
test kube-apiserver, including Pod Security admission at the `restricted` level.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

if TYPE_CHECKING:
    from tests.k8s.conftest import KubeEnv

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kraftkeeper"
K8S_SCHEMA_VERSION = "1.30.0"  # the version of the pinned test kube-apiserver


def render(helm: Path, *args: str, namespace: str = "kk-system") -> list[dict[str, Any]]:
    proc = subprocess.run([str(helm), "template", "kk", str(CHART), "--namespace", namespace, *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def all_toggles(watch: list[str] | None = None) -> list[str]:
    args = ["--set", "metrics.serviceMonitor.enabled=true", "--set", "networkPolicy.enabled=true",
            "--set", "operator.persistence.enabled=true", "--set", "operator.logLevel=DEBUG",
            "--set", "report.enabled=true",
            "--set", "serviceAccount.annotations.team=kraft", "--set", "operator.priorityClassName=high"]
    if watch:
        args += ["--set", "operator.watchNamespaces={" + ",".join(watch) + "}"]
    return args


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


# -- no cluster needed ------------------------------------------------------------------------


def test_chart_crd_is_the_same_file_as_crds_dir() -> None:
    top = (REPO / "crds" / "kraftquorums.kraftkeeper.io.yaml").read_bytes()
    assert (CHART / "crds" / "kraftquorums.kraftkeeper.io.yaml").read_bytes() == top, (
        "charts/kraftkeeper/crds/ must be a copy of crds/: cp crds/*.yaml charts/kraftkeeper/crds/")


def test_every_value_is_commented() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    missing = []
    for i, line in enumerate(lines):
        m = re.match(r"^\s*([A-Za-z][\w.-]*):", line)
        if not m:
            continue
        j = i - 1
        while j >= 0 and lines[j].strip() == "":
            j -= 1
        if j < 0 or not lines[j].strip().startswith("#"):
            missing.append(f"line {i + 1}: {m.group(1)}")
    assert not missing, "values.yaml keys without a comment right above: " + ", ".join(missing)


def test_values_schema_is_valid_json_and_strict() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])


# -- helm ------------------------------------------------------------------------------------


def test_helm_lint(helm: Path) -> None:
    for args in ([], all_toggles(["team-a"])):
        proc = subprocess.run([str(helm), "lint", "--strict", str(CHART), *args],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--set", "operator.replicas=2"], "/operator/replicas"),
        (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
        (["--set", "operatr.replicas=1"], "operatr"),
        (["--set", "operator.logLevel=LOUD"], "/operator/logLevel"),
        (["--set", "networkPolicy.apiServerPorts={70000}"], "/networkPolicy/apiServerPorts"),
        (["--set", "serviceAccount.create=false"], "serviceAccount.name is required"),
        (["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.service.enabled=false"],
         "metrics.serviceMonitor.enabled needs metrics.service.enabled"),
        (["--set", "rbac.scope=everywhere"], "/rbac/scope"),
        (["--set-string", "testing.failpointOnce=/etc/passwd"], "/testing/failpointOnce"),
        (["--set", "report.enabled=true"], "report.enabled needs operator.persistence.enabled"),
        (["--set", "report.enabled=true", "--set", "operator.persistence.enabled=true",
          "--set", "report.outDir=/etc"], "/report/outDir"),
        (["--set", "report.master=spark://elsewhere:7077"], "/report/master"),
    ],
    ids=["two-replicas", "bad-pull-policy", "misspelt-key", "bad-log-level", "bad-port", "sa-without-name",
         "monitor-without-service", "bad-rbac-scope",
         "failpoint-file-outside-data", "report-without-persistence", "report-out-outside-data",
         "report-remote-master"],
)
def test_bad_values_are_refused_naming_the_value(helm: Path, args: list[str], expected: str) -> None:
    proc = subprocess.run([str(helm), "template", "kk", str(CHART), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert expected in proc.stderr, proc.stderr


def test_default_render(helm: Path) -> None:
    docs = render(helm)
    kinds = sorted(d["kind"] for d in docs)
    # Namespace-scoped RBAC by default: the operator watches the release namespace only.
    assert kinds == ["Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]
    dep = by_kind(docs, "Deployment")[0]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][:3] == ["operator", "run", "--standalone"]
    assert "--namespace=kk-system" in c["args"] and "--all-namespaces" not in c["args"]
    assert by_kind(docs, "Role")[0]["metadata"]["namespace"] == "kk-system"
    assert c["image"] == "kraftkeeper:0.1.0"


def pod_labels(cron: dict[str, Any]) -> dict[str, str]:
    return cron["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]  # type: ignore[no-any-return]


def test_report_cronjob(helm: Path) -> None:
    """Off by default; when on, a CronJob that runs on the operator's node (the /data claim is
    ReadWriteOnce), mounts that claim, runs as non-root on a read-only root with limits, and
    carries no API token (it talks to nothing)."""
    assert not by_kind(render(helm, "--set", "operator.persistence.enabled=true"), "CronJob")
    docs = render(helm, "--set", "operator.persistence.enabled=true", "--set", "report.enabled=true",
                  "--set", "report.schedule=*/5 * * * *")
    (cron,) = by_kind(docs, "CronJob")
    assert cron["spec"]["schedule"] == "*/5 * * * *" and cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    dep_pod = by_kind(docs, "Deployment")[0]["spec"]["template"]
    (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= dep_pod["metadata"]["labels"].items()
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"kk-kraftkeeper-data"}
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["image"] == "kraftkeeper-report:0.1.0"
    assert c["args"] == ["report", "--events", "/data/events", "--out", "/data/report",
                         "--master", "local[2]"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]
    # With network policies on, the job gets one that lets nothing in or out.
    pols = by_kind(render(helm, "--set", "operator.persistence.enabled=true", "--set", "report.enabled=true",
                          "--set", "networkPolicy.enabled=true"), "NetworkPolicy")
    (deny,) = [p for p in pols if p["metadata"]["name"] == "kk-kraftkeeper-report"]
    assert deny["spec"]["podSelector"]["matchLabels"].items() <= pod_labels(cron).items()
    assert deny["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in deny["spec"] and "egress" not in deny["spec"]


def test_failpoint_test_hook_is_set_only_when_asked(helm: Path) -> None:
    def env(*args: str) -> dict[str, str]:
        pod = by_kind(render(helm, *args), "Deployment")[0]["spec"]["template"]["spec"]
        return {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}

    assert not {"KRAFTKEEPER_FAILPOINT", "KRAFTKEEPER_FAILPOINT_ONCE"} & set(env())
    got = env("--set-string", "testing.failpoint=after-add-voter-committed=hang",
              "--set-string", "testing.failpointOnce=/data/fp-1")
    assert got["KRAFTKEEPER_FAILPOINT"] == "after-add-voter-committed=hang"
    assert got["KRAFTKEEPER_FAILPOINT_ONCE"] == "/data/fp-1"


def test_rbac_scope_cluster_and_watch_namespaces(helm: Path) -> None:
    # rbac.scope=cluster: one ClusterRole (+ CRD and namespace reads for kopf), all namespaces.
    docs = render(helm, "--set", "rbac.scope=cluster")
    assert sorted(d["kind"] for d in docs) == ["ClusterRole", "ClusterRoleBinding", "Deployment", "Service",
                                               "ServiceAccount"]
    args = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args and not [a for a in args if a.startswith("--namespace")]
    binding = by_kind(docs, "ClusterRoleBinding")[0]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kk-kraftkeeper",
                                    "namespace": "kk-system"}]
    # Cluster scope narrowed to named namespaces: kopf watches only those.
    docs = render(helm, "--set", "rbac.scope=cluster", "--set", "operator.watchNamespaces={a,b}")
    args = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=a", "--namespace=b"]
    # Namespace scope with named namespaces: a Role + RoleBinding in each (not in the release
    # namespace, which is not watched), bound to the release's ServiceAccount, nothing cluster-wide.
    docs = render(helm, "--set", "operator.watchNamespaces={kk-e2e,b}")
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in by_kind(docs, "Role")) == ["b", "kk-e2e"]
    for rb in by_kind(docs, "RoleBinding"):
        assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                 "name": "kk-kraftkeeper"}
        assert rb["subjects"][0]["namespace"] == "kk-system"
    args = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=kk-e2e", "--namespace=b"]
    # No RBAC objects at all when the user manages RBAC.
    docs = render(helm, "--set", "rbac.create=false")
    assert not {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"} & {d["kind"] for d in docs}


def test_restricted_security_context(helm: Path) -> None:
    for docs in (render(helm), render(helm, *all_toggles(["a"]))):
        pod = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = pod["containers"][0]["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        # A read-only root needs writable scratch: /tmp (HOME) and /data (event logs).
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert {"/tmp", "/data"} <= mounts


def test_rbac_is_least_privilege(helm: Path) -> None:
    cluster_scope = render(helm, "--set", "rbac.scope=cluster")
    for docs in (render(helm), render(helm, *all_toggles(["a", "b"])), cluster_scope):
        roles = by_kind(docs, "ClusterRole") + by_kind(docs, "Role")
        assert roles
        for role in roles:
            for rule in role["rules"]:
                assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
                if "secrets" in rule["resources"]:  # by name only: never list or watch Secrets
                    assert rule["resources"] == ["secrets"], rule
                    assert "list" not in rule["verbs"] and "watch" not in rule["verbs"], rule
                if rule["resources"] == ["pods"]:
                    assert sorted(rule["verbs"]) == ["delete", "get", "list", "watch"]
                if rule["resources"] == ["persistentvolumeclaims"]:
                    assert "create" not in rule["verbs"] and "update" not in rule["verbs"]
    # The chart pins the event-log directory (spec.eventLog.path cannot leave it) and tells the
    # operator its own pods' namespace and labels (the quorums' NetworkPolicies admit them).
    pod = by_kind(render(helm), "Deployment")[0]["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["KRAFTKEEPER_EVENT_LOG_DIR"]["value"] == "/data"
    assert "app.kubernetes.io/component=operator" in env["KRAFTKEEPER_OPERATOR_POD_LABELS"]["value"]
    assert env["KRAFTKEEPER_OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # Watching named namespaces with the default (namespace) scope: no cluster-wide grant at all.
    docs = render(helm, *all_toggles(["a", "b"]))
    assert sorted(r["metadata"]["namespace"] for r in by_kind(docs, "Role")) == ["a", "b"]
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")


@pytest.mark.parametrize("toggles", [False, True], ids=["default", "all-toggles"])
def test_rendered_manifests_pass_offline_schema_validation(helm: Path, toggles: bool) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = render(helm, *(all_toggles(["a"]) if toggles else []))
    checked = 0
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            # Not a Kubernetes kind; kubernetes-validate ships no schema for it.
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            assert doc["spec"]["endpoints"][0]["port"] == "metrics"
            continue
        kubernetes_validate.validate(doc, K8S_SCHEMA_VERSION, strict=True)
        checked += 1
    crd = yaml.safe_load((CHART / "crds" / "kraftquorums.kraftkeeper.io.yaml").read_text())
    kubernetes_validate.validate(crd, K8S_SCHEMA_VERSION, strict=True)
    assert checked == len(docs) - (1 if toggles else 0)


# -- against the test kube-apiserver ----------------------------------------------------------


@pytest.mark.k8s
def test_default_render_server_side_dry_run_with_kubectl(kube: KubeEnv, helm: Path, kubectl: Path,
                                                         namespace: str) -> None:
    docs = render(helm, namespace=namespace)
    manifest = yaml.safe_dump_all(docs)
    proc = subprocess.run(
        [str(kubectl), "apply", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", "-"],
        input=manifest, capture_output=True, text=True, env=kube.env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "deployment.apps/kk-kraftkeeper created (server dry run)" in proc.stdout, proc.stdout
    # Dry run stored nothing.
    assert kube.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/kk-kraftkeeper")[0] == 404


@pytest.mark.k8s
def test_all_toggles_render_server_side_dry_run(kube: KubeEnv, helm: Path, namespace: str) -> None:
    other = f"{namespace}-w"
    status, body = kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": other}})
    assert status == 201, body
    docs = render(helm, *all_toggles([namespace, other]), namespace=namespace)
    applied = 0
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            continue  # its CRD belongs to prometheus-operator, which the test cluster lacks
        status, body = kube.apply(doc, dry_run=True)
        assert status in (200, 201), f"{doc['kind']} {doc['metadata']['name']}: {body}"
        applied += 1
    assert applied == len(docs) - 1


@pytest.mark.k8s
def test_operator_pod_is_admitted_by_restricted_pod_security(
    kube: KubeEnv, helm: Path, namespace: str
) -> None:
    # Pod Security admission enforces per namespace; the Deployment's pods must be admitted
    # under `restricted`. No controller manager runs here, so create the pod (dry run) directly
    # from the Deployment's template.
    status, body = kube.request(
        "PATCH", f"/api/v1/namespaces/{namespace}",
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted",
                                 "pod-security.kubernetes.io/enforce-version": "v1.30"}}},
        content_type="application/merge-patch+json")
    assert status == 200, body
    dep = by_kind(render(helm, namespace=namespace), "Deployment")[0]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "operator-probe", "namespace": namespace,
                        "labels": dep["spec"]["template"]["metadata"]["labels"]},
           "spec": dep["spec"]["template"]["spec"]}
    status, body = kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod, {"dryRun": "All"})
    assert status == 201, body
    # The check is real: the same pod without the hardening is refused.
    weak = json.loads(json.dumps(pod))
    del weak["spec"]["containers"][0]["securityContext"]["capabilities"]
    status, body = kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", weak, {"dryRun": "All"})
    assert status == 403, body
    assert "restricted" in body["message"] and "capabilities" in body["message"]


@pytest.mark.k8s
def test_helm_install_against_the_api_server(
    kube: KubeEnv, helm: Path, kubectl: Path, namespace: str
) -> None:
    # A real install: helm sends the CRD (crds/) and the templates; nothing runs the Deployment,
    # but every object must be accepted and the release recorded.
    proc = subprocess.run([str(helm), "install", "kk", str(CHART), "--namespace", namespace,
                           "--set", f"operator.watchNamespaces={{{namespace}}}", "--wait=false"],
                          capture_output=True, text=True, env=kube.env(), timeout=180)
    if proc.returncode != 0 and "unknown flag: --wait" in proc.stderr:
        proc = subprocess.run([str(helm), "install", "kk", str(CHART), "--namespace", namespace,
                               "--set", f"operator.watchNamespaces={{{namespace}}}"],
                              capture_output=True, text=True, env=kube.env(), timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "KRaftKeeper 0.1.0 is installed" in proc.stdout
    status, dep = kube.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/kk-kraftkeeper")
    assert status == 200, dep
    status, role = kube.request("GET", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles/"
                                       "kk-kraftkeeper")
    assert status == 200, role
    status, crd = kube.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                      "kraftquorums.kraftkeeper.io")
    assert status == 200, crd
    # The bound permissions, as the API server's authorizer sees them for the operator's account.
    sa = f"system:serviceaccount:{namespace}:kk-kraftkeeper"
    allowed = [
        ("kraftkeeper.io", "kraftquorums", "", "watch"),
        ("kraftkeeper.io", "kraftquorums", "status", "patch"),
        ("apps", "statefulsets", "", "create"), ("apps", "statefulsets", "", "patch"),
        ("", "services", "", "patch"), ("policy", "poddisruptionbudgets", "", "patch"),
        ("", "pods", "", "delete"), ("", "persistentvolumeclaims", "", "delete"),
        ("", "events", "", "create"),
        ("", "configmaps", "", "create"), ("", "configmaps", "", "patch"),  # the <name>-bootstrap flag
        ("", "secrets", "", "get"), ("", "secrets", "", "create"),  # TLS: the quorum's Secrets, by name
        ("networking.k8s.io", "networkpolicies", "", "patch"),
        ("cert-manager.io", "certificates", "", "patch"),
    ]
    denied = [
        ("", "secrets", "", "list"), ("", "secrets", "", "watch"),  # never enumerate Secrets
        ("", "pods", "exec", "create"),
        ("", "persistentvolumeclaims", "", "create"),
        ("apps", "deployments", "", "create"), ("kraftkeeper.io", "kraftquorums", "", "delete"),
    ]
    for group, resource, sub, verb in allowed + denied:
        expect = (group, resource, sub, verb) in allowed
        assert _can(kube, sa, namespace, group, resource, sub, verb) is expect, (resource, sub, verb)
    # Nothing outside the watched namespace.
    assert _can(kube, sa, "default", "apps", "statefulsets", "", "create") is False
    # And for real, with the ServiceAccount's own token (what the operator pod would use).
    sa_kubeconfig = kube.kubeconfig_for(namespace, "kk-kraftkeeper")
    for args, ok in (
        (["get", "kraftquorums", "-n", namespace], True),
        (["get", "statefulsets,services,pods,persistentvolumeclaims", "-n", namespace], True),
        (["get", "secrets", "-n", namespace], False),
        (["get", "kraftquorums", "-n", "default"], False),
    ):
        proc = subprocess.run([str(kubectl), *args], capture_output=True, text=True,
                              env={**kube.env(), "KUBECONFIG": str(sa_kubeconfig)}, timeout=60)
        assert (proc.returncode == 0) is ok, (args, proc.stderr)
        if not ok:
            assert "forbidden" in proc.stderr, proc.stderr
    proc = subprocess.run([str(helm), "uninstall", "kk", "--namespace", namespace],
                          capture_output=True, text=True, env=kube.env(), timeout=180)
    assert proc.returncode == 0, proc.stderr
    # The CRD stays after uninstall (charts' crds/ are never deleted by helm), so quorums survive.
    assert kube.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                               "kraftquorums.kraftkeeper.io")[0] == 200


def _can(kube: KubeEnv, user: str, namespace: str, group: str, resource: str, sub: str, verb: str) -> bool:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user, "groups": ["system:serviceaccounts", "system:authenticated"],
                       "resourceAttributes": {"namespace": namespace, "group": group, "resource": resource,
                                              "subresource": sub, "verb": verb}}}
    status, body = kube.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    assert status == 201, body
    return bool(body["status"].get("allowed"))


# -- the installer scripts ----------------------------------------------------------------------


@pytest.mark.parametrize("script", ["k8s-testenv.sh", "build-image.sh"])
def test_scripts_refuse_an_unknown_command_with_usage(script: str) -> None:
    proc = subprocess.run([str(REPO / "scripts" / script), "frobnicate"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage:"), proc.stderr


def test_testenv_check_reports_what_is_missing(tmp_path: Path) -> None:
    # An empty cache: `check` must fail and name the kube-apiserver binary it expects.
    proc = subprocess.run([str(REPO / "scripts" / "k8s-testenv.sh"), "check"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "KK_CACHE": str(tmp_path)})
    assert proc.returncode == 1
    assert f"missing: {tmp_path}/bin/kube-apiserver v1.30." in proc.stdout, proc.stdout
    assert "helm" in proc.stdout


def test_network_policy_extra_egress_reaches_kafka_controllers(helm: Path, tmp_path: Path) -> None:
    """A `spec.kafka` quorum's controllers live outside the chart's view: extraEgress opens them."""
    values = tmp_path / "values.yaml"
    values.write_text(
        "networkPolicy:\n  enabled: true\n  extraEgress:\n"
        "    - to: [{ipBlock: {cidr: 10.0.12.0/24}}]\n      ports: [{port: 9093, protocol: TCP}]\n"
    )
    (policy,) = by_kind(render(helm, "-f", str(values)), "NetworkPolicy")
    egress = policy["spec"]["egress"]
    assert egress[-1] == {"to": [{"ipBlock": {"cidr": "10.0.12.0/24"}}],
                          "ports": [{"port": 9093, "protocol": "TCP"}]}
    (plain,) = by_kind(render(helm, "--set", "networkPolicy.enabled=true"), "NetworkPolicy")
    assert len(plain["spec"]["egress"]) == len(egress) - 1
    values.write_text("networkPolicy:\n  extraEgress:\n    - toCidr: 10.0.0.0/8\n")
    proc = subprocess.run([str(helm), "template", "kk", str(CHART), "-f", str(values)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "extraEgress" in proc.stderr, proc.stderr
