"""The Kubernetes side of the operator without an API server: which API errors are permanent
(the spec's fault, never retried) and which are temporary (kube.py), and the operator's settings
from its environment (quorums.py). The same code against a real kube-apiserver is exercised in
tests/k8s/test_operator*.py."""

from __future__ import annotations

import json

import kopf
import pytest
from kraftkeeper_operator.k8s.context import OperatorContext
from kraftkeeper_operator.k8s.kube import api_error
from kubernetes_asyncio.client.exceptions import ApiException


def _exc(status: int, message: str) -> ApiException:
    e = ApiException(status=status, reason="x")
    e.body = json.dumps({"kind": "Status", "message": message}).encode()
    return e


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (422, 'StatefulSet.apps "q" is invalid: spec.template.spec.affinity: bogusField'),
        (400, "bad request"),
        (
            500,
            "failed to create typed patch object: .spec.affinity.nodeAffinity.bogusField: field not declared",
        ),
    ],
)
def test_refusals_of_the_object_itself_are_permanent(status: int, message: str) -> None:
    err = api_error("StatefulSet ns/q", _exc(status, message))
    assert isinstance(err, kopf.PermanentError)
    assert "StatefulSet ns/q" in str(err) and message in str(err)


@pytest.mark.parametrize(
    ("status", "message"), [(409, "conflict"), (503, "unavailable"), (500, "etcd timeout")]
)
def test_everything_else_is_retried(status: int, message: str) -> None:
    err = api_error("ConfigMap ns/q-bootstrap", _exc(status, message))
    assert isinstance(err, kopf.TemporaryError) and str(status) in str(err) and message in str(err)


def test_settings_from_the_environment_and_bad_values_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KRAFTKEEPER_RECONCILE_INTERVAL", raising=False)
    monkeypatch.delenv("KRAFTKEEPER_QUORUM_TIMEOUT", raising=False)
    assert OperatorContext.settings_from_env() == (2.0, 3.0)
    monkeypatch.setenv("KRAFTKEEPER_RECONCILE_INTERVAL", "0.5")
    assert OperatorContext.settings_from_env() == (0.5, 3.0)
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv("KRAFTKEEPER_QUORUM_TIMEOUT", bad)
        with pytest.raises(ValueError, match="KRAFTKEEPER_QUORUM_TIMEOUT"):
            OperatorContext.settings_from_env()
