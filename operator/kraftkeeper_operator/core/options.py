"""The recovery policy as command-line options, for every command that runs the controller
without a KRaftQuorum (``operator local``, ``operator watch``): one set of flags, whose defaults
are :class:`~kraftkeeper_operator.core.policy.RecoveryPolicy`'s, the same as a KRaftQuorum's
``spec.recovery`` defaults (one documented default per setting).

The one setting whose default differs by backend is ``--order``: Kafka 4.x keeps one directory
id per voter id and refuses AddRaftVoter for a second one (DUPLICATE_VOTER), so a Kafka quorum
can only be healed RemoveThenAdd; the caller passes its default.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from .policy import Order, RecoveryPolicy

__all__ = ["add_policy_arguments", "policy_from_args"]

_DEFAULTS = {f.name: f.default for f in fields(RecoveryPolicy)}


def add_policy_arguments(
    p: argparse.ArgumentParser, *, order: Order = RecoveryPolicy.order, unclean: bool = True
) -> None:
    """The policy flags, defaults from :class:`RecoveryPolicy` (``order`` excepted: module
    docstring). ``unclean=False`` leaves out ``--unclean-after-seconds`` (a backend that cannot
    perform KIP-704 unclean recovery)."""
    d = _DEFAULTS
    p.add_argument(
        "--stabilization-seconds",
        type=float,
        default=d["stabilization_seconds"],
        help=f"how long a new replica must stay caught up before it becomes a voter "
        f"(default {d['stabilization_seconds']:g})",
    )
    p.add_argument(
        "--max-lag",
        type=int,
        default=d["max_lag"],
        help=f"records behind still counted as caught up (default {d['max_lag']})",
    )
    p.add_argument(
        "--order", choices=[o.value for o in Order], default=order.value, help=f"default {order.value}"
    )
    p.add_argument(
        "--timeout-seconds",
        type=float,
        default=d["timeout_seconds"],
        help=f"detection to promotion must take at most this long (default {d['timeout_seconds']:g})",
    )
    p.add_argument(
        "--live-window-seconds",
        type=float,
        default=d["live_window_seconds"],
        help=f"a replica that fetched within this is live (default {d['live_window_seconds']:g})",
    )
    p.add_argument("--no-recovery", action="store_true", help="observe and report only; never change voters")
    if unclean:
        p.add_argument(
            "--unclean-after-seconds",
            type=float,
            default=None,
            help="allow KIP-704 unclean recovery after this long without a live majority (off by "
            "default: records committed only on the lost replicas are lost)",
        )


def policy_from_args(a: argparse.Namespace) -> RecoveryPolicy:
    """The policy of flags added by :func:`add_policy_arguments`; raises ``PolicyError`` naming
    the field, with the same rules as a KRaftQuorum's spec."""
    spec = {
        "enabled": not a.no_recovery,
        "order": a.order,
        "stabilizationSeconds": a.stabilization_seconds,
        "maxLagRecords": a.max_lag,
        "timeoutSeconds": a.timeout_seconds,
        "liveWindowSeconds": a.live_window_seconds,
    }
    after = getattr(a, "unclean_after_seconds", None)
    unclean = None if after is None else {"enabled": True, "afterSeconds": after}
    return RecoveryPolicy.from_spec(spec, unclean)
