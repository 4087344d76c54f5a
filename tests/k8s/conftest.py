"""Fixtures for tests against a real Kubernetes API: etcd + the pinned kube-apiserver.

`scripts/k8s-testenv.sh install` installs etcd (Debian) and builds kube-apiserver into
``${KK_CACHE:-~/.cache/kraftkeeper}/bin`` along with helm and kubectl. This module starts one
etcd and one kube-apiserver per test session (:mod:`testkit.kubeapi`, shared with the operator
benchmark) and stops them at the end. There is no controller manager, scheduler or kubelet: objects are
stored and validated, but no pod ever runs (tests that need pods to run fake the kubelet's
status writes, the one part that cannot run here).

Fixtures (all test modules under tests/k8s may use them):

- ``kube`` (session): a :class:`KubeEnv` with ``base_url``, ``token``, ``kubeconfig`` (a file
  path usable by kubectl, helm and kubernetes_asyncio), ``bin_dir`` and a small synchronous REST
  helper ``kube.request(method, path, body=None, params=None) -> (status, json)``;
  ``kube.kubeconfig_for(namespace, service_account)`` gives a kubeconfig acting as that
  ServiceAccount (TokenRequest), to exercise exactly the RBAC the chart grants.
- ``kraftquorum_crd`` (session): applies ``crds/kraftquorums.kraftkeeper.io.yaml`` and waits
  until the CRD is Established; returns the CRD object.
- ``namespace`` (function): a fresh namespace name, created for the test.
- ``helm`` / ``kubectl`` (session): paths of the binaries (skip when absent).

Everything that is missing turns into a skip whose reason names the missing binary and the
command that installs it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from quorum.localports import free_port
from testkit.kubeapi import (
    INSTALL_HINT,
    KubeApiMissing,
    KubeEnv,
    cache_bin,
    find_binary,
    object_path,
    start_kube_apiserver,
)

# Names other test modules import from here.
__all__ = ["KubeEnv", "cache_bin", "find_binary", "free_port", "object_path"]

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "kraftquorums.kraftkeeper.io.yaml"


@pytest.fixture(scope="session")
def kube() -> Iterator[KubeEnv]:
    try:
        with start_kube_apiserver() as env:
            yield env
    except KubeApiMissing as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def kraftquorum_crd(kube: KubeEnv) -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text())
    status, body = kube.apply(crd)
    assert status in (200, 201), f"applying the CRD failed: {status} {body}"
    name = crd["metadata"]["name"]

    def established() -> dict[str, Any] | None:
        st, obj = kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        # A CRD just created may carry ``status: null`` or ``conditions: null``: not yet established.
        conds = {c["type"]: c["status"] for c in ((obj or {}).get("status") or {}).get("conditions") or []}
        if st == 200 and conds.get("Established") == "True":
            return obj  # type: ignore[no-any-return]
        return None

    obj = kube.wait_for("CRD Established", established)
    # Discovery of the new group lags a little behind Established; wait until it serves.
    kube.wait_for("kraftquorums served",
                  lambda: kube.request("GET", "/apis/kraftkeeper.io/v1alpha1/kraftquorums")[0] == 200)
    return obj  # type: ignore[no-any-return]


@pytest.fixture
def namespace(kube: KubeEnv) -> str:
    # No namespace controller runs, so deleted namespaces would stay Terminating: each test
    # gets a fresh one and the whole etcd is thrown away at the end of the session.
    name = f"kk-{uuid.uuid4().hex[:10]}"
    status, body = kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                               "metadata": {"name": name}})
    assert status == 201, f"creating namespace {name}: {status} {body}"
    return name


def _tool(name: str) -> Path:
    path = find_binary(name)
    if path is None:
        pytest.skip(f"{name} is not installed at {cache_bin() / name} ({INSTALL_HINT})")
    return path


@pytest.fixture(scope="session")
def helm() -> Path:
    return _tool("helm")


@pytest.fixture(scope="session")
def kubectl() -> Path:
    return _tool("kubectl")
