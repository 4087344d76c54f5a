"""``kraftkeeper operator run [kopf options]``: runs kopf with the KRaftQuorum handlers.

Every option is kopf's own ``kopf run`` option (``--standalone``, ``--namespace NS`` /
``--all-namespaces``, ``--liveness URL``, ``--verbose`` / ``--debug`` / ``--quiet``, ...); the handler
module (``kraftkeeper_operator.k8s.handlers``) is added here. Without ``--namespace`` or
``--all-namespaces`` the operator watches all namespaces. Environment:

* ``KUBECONFIG`` / in-cluster service account: how to reach the API server;
* ``KRAFTKEEPER_METRICS_PORT`` (default 9090, 0 = off): the operator's Prometheus /metrics;
* ``KRAFTKEEPER_DEFAULT_IMAGE``: image of quorum pods whose spec has no ``image``;
* ``KRAFTKEEPER_RECONCILE_INTERVAL`` (seconds, default 2): pause between recovery passes;
* ``KRAFTKEEPER_ENDPOINT_OVERRIDES`` (test hook): ``ns/name/ordinal=HOST:PORT,...`` makes the
  controller reach replica ``ordinal`` of ``ns/name`` at HOST:PORT instead of its pod DNS name.

With ``--namespace`` (the chart's namespace-scoped RBAC) kopf's cluster scanning is turned off:
the operator has no right to list namespaces or watch CRDs there, and kopf would retry each
refused list for about half a minute before falling back, delaying every start.
"""

from __future__ import annotations

import sys
from typing import Any

import kopf
import kopf.cli


async def _no_cluster_scanning(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Named namespaces only: treat them as existing (no namespace list) and take the resources
    from API discovery once (no CRD watch; the chart installs the CRD before the operator)."""
    settings.scanning.disabled = True


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if (
        "-A" not in args
        and "--all-namespaces" not in args
        and not any(a == "-n" or a.startswith("--namespace") for a in args)
    ):
        args.append("--all-namespaces")
    if "-A" not in args and "--all-namespaces" not in args:
        kopf.on.startup()(_no_cluster_scanning)
    try:
        kopf.cli.main(["run", "-m", "kraftkeeper_operator.k8s.handlers", *args], standalone_mode=False)
    except SystemExit as e:  # click exits for --help and usage errors
        return int(e.code or 0)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
