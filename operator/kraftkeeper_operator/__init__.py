"""KRaftKeeper operator: automatic KIP-856 disk-failure recovery.

Layout, one floor per role (a test checks the import directions):

* ``core``: the pure decision core (policy, records, view, guards, recovery, status, rotation,
  survivor); imports only itself.
* ``api`` (the ``QuorumApi`` membership backend port), ``controller`` (the async executor of the
  core's decisions), ``steplog`` (each step to the event sink once, with its metrics),
  ``telemetry`` (event log, Events, metrics), ``failpoints``, ``statusserver``: shared by every
  run mode.
* run modes: ``k8s`` (the kopf operator, ``kraftkeeper operator run``), ``local`` (``kraftkeeper
  operator local``), ``kafka`` (the Kafka membership backend and ``kraftkeeper operator watch``).
  They import the floors above, never each other (``k8s`` may use the ``kafka`` backend).
* ``testing``: in-memory doubles for tests and benches; nothing else imports it.
"""

from .api import QuorumApi
from .controller import ControllerStatus, RecoveryController
from .core.recovery import Order, PolicyError, RecoveryBook, RecoveryPolicy

__all__ = [
    "ControllerStatus",
    "Order",
    "PolicyError",
    "QuorumApi",
    "RecoveryBook",
    "RecoveryController",
    "RecoveryPolicy",
]
