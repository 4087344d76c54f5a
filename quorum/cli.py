"""The ``kraftkeeper`` command line (contract: ``docs/reference.md``).

Every subcommand exits 0 on success; on failure it prints exactly one line on stderr that
starts with the error code in capitals (``NOT_LEADER: ...``) and exits non-zero (1 for
NOT_FOUND as the interface asks of ``kv get``, 2 for usage errors, 1 otherwise).

Subcommands that belong to other packages (the operator, the Spark report, the demo) are
imported lazily so that the engine works without their extras installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from quorum.cliparse import ArgumentParser
from quorum.describe_text import format_describe_replication, format_describe_status
from quorum.security.cli import add_tls_parser
from quorum.types import ErrorCode, KraftError

T = TypeVar("T")


def _fail(err: KraftError) -> int:
    sys.stderr.write(f"{err.code.value}: {err.message}\n")
    return 1


def _run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    import asyncio  # not at the top: `format` and `start` (which runs its own loop) need none of it here

    async def wrapper() -> T:
        return await coro_fn()

    return asyncio.run(wrapper())


def _client(args: argparse.Namespace) -> Any:
    from quorum.client import QuorumClient
    from quorum.security.clientconfig import resolve

    # Connection refused on every bootstrap address for 1 s means nothing listens there:
    # UNAVAILABLE within 3 s instead of retrying until --timeout.
    return QuorumClient(
        args.bootstrap,
        timeout=args.timeout,
        client_config=resolve(args.client_config),
        refused_grace=1.0,
    )


# ---- format / start ---------------------------------------------------------------------
def _format_volume(
    directory: str,
    cluster_id: str,
    node_id: int,
    *,
    ignore_formatted: bool,
    storage_uuid: str | None,
    storage_uuid_from_cert: str | None,
    no_initial_controllers: bool,
) -> None:
    """``kraftkeeper format``'s work, shared with ``start --format-cluster-id`` (one process
    prepares the volume and then serves from it)."""
    from quorum.storage.meta import format_dir

    if storage_uuid_from_cert:
        from quorum.security.nodetls import storage_uuid_of_cert

        storage_uuid = storage_uuid_of_cert(storage_uuid_from_cert, cluster_id, node_id)
    meta = format_dir(
        directory,
        cluster_id,
        node_id,
        ignore_formatted=ignore_formatted,
        storage_uuid=storage_uuid,
        initial_bootstrap=not no_initial_controllers,
    )
    print(f"Formatted {directory} for cluster {meta.cluster_id} node {meta.node_id}")
    print(meta.storage_uuid)


def cmd_format(args: argparse.Namespace) -> int:
    _format_volume(
        args.dir,
        args.cluster_id,
        args.node_id,
        ignore_formatted=args.ignore_formatted,
        storage_uuid=args.storage_uuid,
        storage_uuid_from_cert=args.storage_uuid_from_cert,
        no_initial_controllers=args.no_initial_controllers,
    )
    return 0


TLS_START_OPTIONS = ("tls_dir", "cert", "key", "ca", "tokens", "spare_cert", "spare_key")


def cmd_start(args: argparse.Namespace) -> int:
    if args.format_cluster_id is not None:
        # As `kraftkeeper format --ignore-formatted` run just before: a formatted volume is kept
        # only when it names this cluster and node (otherwise the start fails here, before any
        # port is opened); an empty one gets its identity now. Saves a container its second
        # interpreter start and second import of the storage code.
        if args.format_node_id is None:
            raise KraftError(ErrorCode.INVALID_REQUEST, "--format-cluster-id needs --format-node-id")
        _format_volume(
            args.dir,
            args.format_cluster_id,
            args.format_node_id,
            ignore_formatted=True,
            storage_uuid=None,
            storage_uuid_from_cert=args.storage_uuid_from_cert,
            no_initial_controllers=args.no_initial_controllers,
        )
    elif args.format_node_id is not None or args.storage_uuid_from_cert or args.no_initial_controllers:
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            "--format-node-id, --storage-uuid-from-cert and --no-initial-controllers "
            "need --format-cluster-id",
        )
    from quorum.runtime.run import run_node

    return run_node(
        data_dir=args.dir,
        listen=args.listen,
        voters=args.voters,
        advertise=args.advertise,
        config_file=args.config,
        tls_options={k: getattr(args, k) for k in TLS_START_OPTIONS},
        insecure=args.insecure,
        kafka_listen=args.kafka_listen,
    )


# ---- quorum -------------------------------------------------------------------------------
def cmd_describe(args: argparse.Namespace) -> int:
    async def go() -> dict[str, Any]:
        async with _client(args) as c:
            d: dict[str, Any] = await c.describe()
            return d

    d = _run(go)
    if args.json:
        print(json.dumps(d, indent=2, sort_keys=False))
    elif args.replication:
        print(format_describe_replication(d))
    else:
        print(format_describe_status(d))
    return 0


def _check_uuid(u: str) -> str:
    from quorum.types import canonical_uuid

    try:
        return canonical_uuid(u)
    except ValueError:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"--uuid {u!r} is not a UUID") from None


def cmd_add_voter(args: argparse.Namespace) -> int:
    uuid = _check_uuid(args.uuid)

    async def go() -> dict[str, Any]:
        async with _client(args) as c:
            r: dict[str, Any] = await c.add_voter(args.id, uuid)
            return r

    r = _run(go)
    print(f"Added voter {args.id} ({uuid}); voters: {json.dumps(r.get('voters', r))}")
    return 0


def cmd_remove_voter(args: argparse.Namespace) -> int:
    uuid = _check_uuid(args.uuid)

    async def go() -> dict[str, Any]:
        async with _client(args) as c:
            r: dict[str, Any] = await c.remove_voter(args.id, uuid)
            return r

    r = _run(go)
    print(f"Removed voter {args.id} ({uuid}); voters: {json.dumps(r.get('voters', r))}")
    return 0


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"--voters {text!r}: expected ids like 1,2,3") from None
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"--voters {text!r}: need distinct non-negative ids")
    return ids


def cmd_reassign(args: argparse.Namespace) -> int:
    ids = None if args.cancel else _parse_ids(args.voters)

    async def go() -> dict[str, Any]:
        async with _client(args) as c:
            r: dict[str, Any] = await c.reassign(ids)
            return r

    r = _run(go)
    print(json.dumps(r))
    return 0


def cmd_recover_unclean(args: argparse.Namespace) -> int:
    from quorum.runtime.unclean import recover_unclean

    print(recover_unclean(args.dir))
    return 0


# ---- kv -----------------------------------------------------------------------------------
def cmd_kv(args: argparse.Namespace) -> int:
    async def go() -> int:
        async with _client(args) as c:
            if args.kv_cmd == "put":
                off = await c.put(args.key, args.value.encode())
                print(f"OK offset={off}")
            elif args.kv_cmd == "get":
                v = await c.get(args.key)
                if v is None:
                    sys.stderr.write(f"NOT_FOUND: key {args.key!r} does not exist\n")
                    return 1
                sys.stdout.buffer.write(v + b"\n")
            else:
                await c.delete(args.key)
                print("OK")
            return 0

    return _run(go)


# ---- other packages -------------------------------------------------------------------------
def _delegate(module: str, func: str, argv: Sequence[str], extra: str) -> int:
    import importlib

    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise KraftError(
            ErrorCode.UNSUPPORTED, f"{module} is not installed ({e}); install kraftkeeper[{extra}]"
        ) from None
    fn = getattr(mod, func)
    rc = fn(list(argv))
    return int(rc or 0)


def _add_start_parser(sub: Any) -> None:
    s = sub.add_parser("start", help="run a node in the foreground")
    s.add_argument("--dir", required=True)
    s.add_argument("--listen", required=True, help="HOST:PORT")
    s.add_argument("--voters", required=True, help='bootstrap voters "1@HOST:PORT,2@HOST:PORT,..."')
    s.add_argument("--advertise", help="HOST:PORT other nodes use to reach this one")
    s.add_argument("--config", help="JSON config file (timeouts, fsync, snapshot thresholds)")
    s.add_argument(
        "--tls-dir", help="TLS directory of `kraftkeeper tls`: ca.crt, node-N.crt/.key, tokens.json"
    )
    s.add_argument("--cert", help="this node's certificate (PEM), with --key and --ca")
    s.add_argument("--key", help="its private key (PEM)")
    s.add_argument("--ca", help="the cluster CA certificate (PEM)")
    s.add_argument("--tokens", help="hashed bearer tokens file (default: TLS-DIR/tokens.json if present)")
    s.add_argument(
        "--spare-cert",
        help="another certificate of this replica (with --spare-key), served instead of --cert when it "
        "names this node's disk (a volume formatted with --storage-uuid-from-cert of it)",
    )
    s.add_argument("--spare-key", help="the spare certificate's private key (PEM)")
    s.add_argument(
        "--kafka-listen",
        metavar="HOST:PORT",
        help="also answer Kafka's wire protocol here (kafka-metadata-quorum); loopback only, no TLS",
    )
    s.add_argument(
        "--insecure",
        action="store_true",
        help="allow plaintext HTTP without authentication on a non-loopback --listen",
    )
    prep = s.add_argument_group(
        "volume preparation", "format --dir first, as `kraftkeeper format --ignore-formatted` would"
    )
    prep.add_argument("--format-cluster-id", metavar="CLUSTER_ID", help="format --dir for this cluster")
    prep.add_argument("--format-node-id", metavar="ID", type=int, help="... and this node id")
    prep.add_argument("--storage-uuid-from-cert", metavar="CERT", help="as in `kraftkeeper format`")
    prep.add_argument("--no-initial-controllers", action="store_true", help="as in `kraftkeeper format`")
    s.set_defaults(fn=cmd_start)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="kraftkeeper",
                       description="KRaft-style quorum with automatic disk-failure recovery")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=ArgumentParser)

    f = sub.add_parser("format", help="write meta.properties with a new storage UUID (KIP-856)")
    f.add_argument("--dir", required=True)
    f.add_argument("--cluster-id", required=True)
    f.add_argument("--node-id", required=True, type=int)
    f.add_argument("--ignore-formatted", action="store_true")
    uu = f.add_mutually_exclusive_group()
    uu.add_argument("--storage-uuid", help="the new disk's storage UUID (default: a random one)")
    uu.add_argument(
        "--storage-uuid-from-cert",
        metavar="CERT",
        help="take the new disk's storage UUID from the node certificate CERT when it is bound to "
        "one (kraftkeeper://CLUSTER/replica/N?storage=UUID); an unbound certificate leaves it random",
    )
    f.add_argument(
        "--no-initial-controllers",
        "--replacement",
        action="store_true",
        help="format a replacement disk for an existing cluster: the node joins as an observer and "
        "never counts itself a bootstrap voter (as Kafka's format --no-initial-controllers)",
    )
    f.set_defaults(fn=cmd_format)

    _add_start_parser(sub)

    def bootstrap(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--bootstrap", "-b", required=True, help="HOST:PORT[,HOST:PORT...]")
        sp.add_argument("--timeout", type=float, default=float(os.environ.get("KRAFTKEEPER_TIMEOUT", "30")))
        sp.add_argument(
            "--client-config",
            help="client config JSON (CA, certificate or token); default $KRAFTKEEPER_CLIENT_CONFIG",
        )

    q = sub.add_parser("quorum", help="describe and change the voter set")
    qs = q.add_subparsers(dest="quorum_cmd", required=True, parser_class=ArgumentParser)
    d = qs.add_parser("describe")
    bootstrap(d)
    g = d.add_mutually_exclusive_group()
    g.add_argument("--status", action="store_true")
    g.add_argument("--replication", action="store_true")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_describe)
    for name, fn in (("add-voter", cmd_add_voter), ("remove-voter", cmd_remove_voter)):
        a = qs.add_parser(name)
        bootstrap(a)
        a.add_argument("--id", required=True, type=int)
        a.add_argument("--uuid", required=True)
        a.set_defaults(fn=fn)
    r = qs.add_parser("reassign", help="KIP-642: move the voter set to --voters, one change at a time")
    bootstrap(r)
    rg = r.add_mutually_exclusive_group(required=True)
    rg.add_argument("--voters")
    rg.add_argument("--cancel", action="store_true")
    r.set_defaults(fn=cmd_reassign)
    u = qs.add_parser("recover-unclean", help="KIP-704 style: make a stopped surviving node the sole voter")
    u.add_argument("--dir", required=True)
    u.set_defaults(fn=cmd_recover_unclean)

    kv = sub.add_parser("kv", help="put, get and delete keys")
    kvs = kv.add_subparsers(dest="kv_cmd", required=True, parser_class=ArgumentParser)
    for name in ("put", "get", "delete"):
        k = kvs.add_parser(name)
        bootstrap(k)
        k.add_argument("key")
        if name == "put":
            k.add_argument("value")
        k.set_defaults(fn=cmd_kv)

    add_tls_parser(sub, ArgumentParser)

    # These parse their own arguments: everything after the subcommand is passed through.
    for name, helptext in (
        ("operator", "the Kubernetes operator (run) or the local supervisor (local)"),
        ("cluster", "local cluster actions (replace-disk)"),
        ("report", "the Spark report over recovery event logs"),
        ("demo", "the main job: local quorum, disk replacements, report"),
    ):
        x = sub.add_parser(name, help=helptext, add_help=False)
        x.add_argument("rest", nargs=argparse.REMAINDER)
        x.set_defaults(fn=None, delegate=name)
    return p


_DELEGATES: dict[tuple[str, str | None], tuple[str, str, str]] = {
    ("operator", "run"): ("kraftkeeper_operator.k8s.kopf_main", "main", "operator"),
    ("operator", "local"): ("kraftkeeper_operator.local.operator", "local_main", "operator"),
    ("operator", "watch"): ("kraftkeeper_operator.kafka.watch", "watch_main", "operator"),
    ("cluster", "replace-disk"): ("kraftkeeper_operator.local.operator", "replace_disk_main", "operator"),
    ("report", None): ("kraftkeeper_reports.job", "main", "spark"),
    ("demo", None): ("kraftkeeper_demo.demo", "main", "spark"),
}


def _run_delegate(name: str, rest: list[str]) -> int:
    key: tuple[str, str | None] = (name, None)
    if name in ("operator", "cluster"):
        choices = "run | local | watch" if name == "operator" else "replace-disk"
        if not rest or (name, rest[0]) not in _DELEGATES:
            sys.stderr.write(f"INVALID_REQUEST: kraftkeeper {name} expects {choices}\n")
            return 2
        key = (name, rest[0])
        rest = rest[1:]
    module, func, extra = _DELEGATES[key]
    return _delegate(module, func, rest, extra)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        # Commands owned by other packages parse their own options (argparse's REMAINDER
        # cannot pass leading --options through a subparser).
        if args_list and args_list[0] in ("operator", "cluster", "report", "demo"):
            return _run_delegate(args_list[0], args_list[1:])
        args = build_parser().parse_args(args_list)
        rc: int = args.fn(args)
        return rc
    except KraftError as e:
        return _fail(e)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the contract is one CODE: line on stderr
        if os.environ.get("KRAFTKEEPER_DEBUG"):
            raise
        sys.stderr.write(f"{ErrorCode.UNKNOWN_SERVER_ERROR.value}: {type(e).__name__}: {e}\n")
        return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
