"""KRaftKeeper operator: automatic KIP-856 disk-failure recovery, as a kopf Kubernetes operator
(``handlers``, run by ``kopf_main``) and as a local process supervisor (``local``). The decision
logic lives in ``recovery`` / ``guards`` (pure) and ``controller`` (async executor); both modes only
call those, through the ``QuorumApi`` protocol (``api``)."""

from .api import InMemoryQuorum, QuorumApi
from .controller import ControllerStatus, RecoveryController
from .recovery import Order, PolicyError, RecoveryBook, RecoveryPolicy

__all__ = [
    "ControllerStatus",
    "InMemoryQuorum",
    "Order",
    "PolicyError",
    "QuorumApi",
    "RecoveryBook",
    "RecoveryController",
    "RecoveryPolicy",
]
