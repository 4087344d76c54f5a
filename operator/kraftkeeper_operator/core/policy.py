"""The recovery policy of a quorum (``spec.recovery`` / ``spec.uncleanRecovery`` of a KRaftQuorum,
or the options of ``kraftkeeper operator local``), validated with errors that name the field."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# ---------------------------------------------------------------------------------------------
# Policy


class Order(enum.StrEnum):
    ADD_THEN_REMOVE = "AddThenRemove"
    REMOVE_THEN_ADD = "RemoveThenAdd"


class PolicyError(ValueError):
    """An invalid recovery policy; the message names the field (``spec.recovery.<field>``)."""


@dataclass(frozen=True)
class RecoveryPolicy:
    """``spec.recovery`` of a KRaftQuorum (local mode uses the same defaults)."""

    enabled: bool = True
    order: Order = Order.ADD_THEN_REMOVE
    stabilization_seconds: float = 10.0  # a new replica must stay caught up this long
    max_lag: int = 100  # records behind the leader's log end still counted as caught up
    timeout_seconds: float = 600.0  # detection -> promotion must happen within this
    live_window_seconds: float = 5.0  # a replica that fetched within this is live
    unclean_allowed: bool = False  # KIP-704 unclean recovery when a majority is gone
    unclean_after_seconds: float = 300.0  # the CRD's uncleanRecovery.afterSeconds default

    # camelCase names used in the custom resource (crds/kraftquorums.kraftkeeper.io.yaml), mapped
    # to our fields. liveWindowSeconds is ours (local mode); the CRD does not expose it.
    _SPEC_NAMES = {
        "enabled": "enabled",
        "order": "order",
        "stabilizationSeconds": "stabilization_seconds",
        "maxLagRecords": "max_lag",
        "timeoutSeconds": "timeout_seconds",
        "liveWindowSeconds": "live_window_seconds",
    }

    @classmethod
    def from_spec(
        cls, spec: Mapping[str, Any] | None, unclean: Mapping[str, Any] | None = None
    ) -> RecoveryPolicy:
        """Build from ``spec.recovery`` and ``spec.uncleanRecovery``; raises :class:`PolicyError`
        naming the bad field. The API server validates the same rules (the CRD schema); checking
        again here covers objects written before the schema was tightened, and local mode."""
        kw: dict[str, Any] = {}
        if spec is not None:
            if not isinstance(spec, Mapping):
                raise PolicyError("spec.recovery: must be an object")
            for key in spec:
                if key not in cls._SPEC_NAMES:
                    raise PolicyError(
                        f"spec.recovery.{key}: unknown field (known: {', '.join(sorted(cls._SPEC_NAMES))})"
                    )
            if "enabled" in spec:
                kw["enabled"] = _bool(spec["enabled"], "spec.recovery.enabled")
            if "order" in spec:
                try:
                    kw["order"] = Order(spec["order"])
                except ValueError:
                    raise PolicyError(
                        f"spec.recovery.order: {spec['order']!r} is not one of AddThenRemove, RemoveThenAdd"
                    ) from None
            for name in ("stabilizationSeconds", "timeoutSeconds", "liveWindowSeconds"):
                if name in spec:
                    kw[cls._SPEC_NAMES[name]] = _number(spec[name], f"spec.recovery.{name}", minimum=0.0)
            if "maxLagRecords" in spec:
                value = spec["maxLagRecords"]
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise PolicyError(f"spec.recovery.maxLagRecords: must be an integer >= 0, got {value!r}")
                kw["max_lag"] = value
        if unclean is not None:
            if not isinstance(unclean, Mapping):
                raise PolicyError("spec.uncleanRecovery: must be an object")
            for key in unclean:
                if key not in ("enabled", "afterSeconds"):
                    raise PolicyError(
                        f"spec.uncleanRecovery.{key}: unknown field (known: afterSeconds, enabled)"
                    )
            if "enabled" in unclean:
                kw["unclean_allowed"] = _bool(unclean["enabled"], "spec.uncleanRecovery.enabled")
            if "afterSeconds" in unclean:
                kw["unclean_after_seconds"] = _number(
                    unclean["afterSeconds"], "spec.uncleanRecovery.afterSeconds", minimum=0.0
                )
        policy = cls(**kw)
        if policy.timeout_seconds <= policy.stabilization_seconds:
            raise PolicyError(
                f"spec.recovery.timeoutSeconds: {policy.timeout_seconds:g} must be greater than "
                f"stabilizationSeconds ({policy.stabilization_seconds:g}), or no recovery could finish"
            )
        if policy.live_window_seconds <= 0:
            raise PolicyError("spec.recovery.liveWindowSeconds: must be > 0")
        return policy


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"{where}: must be true or false, got {value!r}")
    return value


def _number(value: Any, where: str, *, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PolicyError(f"{where}: must be a number, got {value!r}")
    if value < minimum:
        raise PolicyError(f"{where}: must be >= {minimum:g}, got {value!r}")
    return float(value)
