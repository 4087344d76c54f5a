"""What `kraftkeeper operator run` gives kopf: importing the handlers module (the one module
kopf is told to load) registers every handler and daemon, the Kafka membership daemon included.
That daemon lives in its own module; when a refactoring stopped importing it, Kafka quorums on
Kubernetes silently got no status at all."""

from __future__ import annotations

import importlib

import kopf


def test_the_handlers_module_registers_both_daemons() -> None:
    importlib.import_module("kraftkeeper_operator.k8s.handlers")
    registry = kopf.get_default_registry()
    ids = {h.id for h in registry._spawning.get_all_handlers()}
    assert "kafka_daemon" in ids and "recovery_daemon" in ids, ids
