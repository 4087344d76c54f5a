"""``kraftkeeper tls``: make a cluster CA and issue node and client credentials by hand.

For users who run nodes themselves (``kraftkeeper start``); ``operator local`` and the
Kubernetes operator do the same through :mod:`quorum.security.pki`. Commands::

    kraftkeeper tls init-ca      --dir D --cluster-id C            D/ca.crt, D/ca.key
    kraftkeeper tls issue-node   --dir D --node-id N [--host H]... D/node-N.crt, D/node-N.key
    kraftkeeper tls issue-client --dir D --name NAME --role admin|readwrite|read [--token]
        a client certificate (D/NAME.crt, D/NAME.key), or with --token a bearer token
        (D/NAME.token, its SHA-256 added to D/tokens.json), and D/NAME.json: the client config
        for --client-config.

Each prints what it wrote; the last line of stdout is the main file (the CA certificate, the
node certificate, the client config). Keys and tokens are written 0600.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from quorum.security.roles import LEAF_DAYS, ROLES

# The X.509 side (quorum.security.pki, tokens) is imported by the commands that use it: every
# `kraftkeeper` command builds this parser, and a pod's `format` and `start` should not pay for
# loading an X.509 library they may not need.

__all__ = ["add_tls_parser"]


def cmd_init_ca(args: argparse.Namespace) -> int:
    from quorum.security.pki import init_ca

    ca = init_ca(args.dir, args.cluster_id)
    print(f"Created the CA of cluster {ca.cluster_id}: {ca.directory / 'ca.key'} (keep it secret)")
    print(ca.cert_file)
    return 0


def cmd_issue_node(args: argparse.Namespace) -> int:
    from quorum.security.pki import issue_node, load_ca

    ca = load_ca(args.dir)
    cert, key = issue_node(
        ca, args.node_id, args.host or None, days=args.days, storage_uuid=args.storage_uuid
    )
    print(f"Issued node {args.node_id} of cluster {ca.cluster_id}: {key}")
    print(cert)
    return 0


def cmd_issue_client(args: argparse.Namespace) -> int:
    from quorum.security.pki import issue_client, load_ca, write_private
    from quorum.security.tokens import TOKENS_FILE, TokenStore

    ca = load_ca(args.dir)
    d = Path(args.dir)
    config: dict[str, str] = {"ca_file": "ca.crt"}
    if args.token:
        store = TokenStore.load(d / TOKENS_FILE)
        token = store.add(args.name, args.role)
        write_private(d / f"{args.name}.token", (token + "\n").encode())
        store.save()
        config["token_file"] = f"{args.name}.token"
        print(f"Issued a bearer token (role {args.role}) for {args.name}: {d / (args.name + '.token')}")
    else:
        cert, key = issue_client(ca, args.name, args.role, days=args.days)
        config.update(cert_file=cert.name, key_file=key.name)
        print(f"Issued a certificate (role {args.role}) for {args.name}: {cert}")
    out = d / f"{args.name}.json"
    write_private(out, (json.dumps(config, indent=2) + "\n").encode())
    print(out)
    return 0


def add_tls_parser(sub: Any, parser_class: type) -> None:
    """Add ``tls`` and its subcommands to the ``kraftkeeper`` parser."""
    t = sub.add_parser("tls", help="create a cluster CA and issue node and client credentials")
    ts: argparse._SubParsersAction[argparse.ArgumentParser] = t.add_subparsers(
        dest="tls_cmd", required=True, parser_class=parser_class
    )
    a = ts.add_parser("init-ca", help="create DIR/ca.crt and DIR/ca.key for a cluster")
    a.add_argument("--dir", required=True)
    a.add_argument("--cluster-id", required=True)
    a.set_defaults(fn=cmd_init_ca)
    n = ts.add_parser("issue-node", help="issue DIR/node-N.crt binding the cluster and replica id")
    n.add_argument("--dir", required=True)
    n.add_argument("--node-id", required=True, type=int)
    n.add_argument(
        "--host",
        action="append",
        help="DNS name or IP the node is reached at (repeatable; default 127.0.0.1 and localhost)",
    )
    n.add_argument(
        "--storage-uuid",
        help="bind the certificate to this disk: the storage UUID (directory.id) in the node's "
        "meta.properties; a replaced disk then needs a new certificate, and the old one can only "
        "speak for the retired disk",
    )
    n.add_argument("--days", type=float, default=LEAF_DAYS)
    n.set_defaults(fn=cmd_issue_node)
    c = ts.add_parser("issue-client", help="issue a client certificate or token and DIR/NAME.json")
    c.add_argument("--dir", required=True)
    c.add_argument("--name", required=True)
    c.add_argument("--role", required=True, choices=ROLES)
    c.add_argument("--token", action="store_true", help="a bearer token instead of a certificate")
    c.add_argument("--days", type=float, default=LEAF_DAYS)
    c.set_defaults(fn=cmd_issue_client)
