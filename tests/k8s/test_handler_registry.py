"""What `kraftkeeper operator run` gives kopf: importing the handlers module (the one module
kopf is told to load) registers every handler and exactly one daemon per KRaftQuorum, which runs
our engine's passes or, for ``spec.kafka``, the Kafka membership passes (lifecycle.py). When the
Kafka daemon lived in its own module and a refactoring stopped importing it, Kafka quorums on
Kubernetes silently got no status at all; with two daemons per resource, each resource ran two
loops."""

from __future__ import annotations

import importlib

import kopf


def test_the_handlers_module_registers_one_daemon_per_resource() -> None:
    importlib.import_module("kraftkeeper_operator.k8s.handlers")
    registry = kopf.get_default_registry()
    ids = [h.id for h in registry._spawning.get_all_handlers()]
    assert ids == ["recovery_daemon"], ids
