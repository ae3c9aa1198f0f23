"""`skulk-kernel cluster token`: the join token another machine needs (`SKULK_JOIN_TOKEN=...`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from .secret import SecretError, resolve_secret


def cmd_cluster_token(args: argparse.Namespace) -> int:
    home = Path(args.home or os.environ.get("SKULK_HOME", "~/.skulk")).expanduser()
    try:
        cluster = resolve_secret(home, create=False)
    except SecretError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.quiet:
        print(cluster.token)
        return 0
    print(cluster.token)
    print(
        f"\n(cluster {cluster.cluster_id}, secret from {cluster.source}). On another machine:\n"
        f"  SKULK_JOIN_TOKEN={cluster.token} skulk-kernel run ...\n"
        f"or write the token into <its data dir>/join-token. Anyone with it can join: keep it private.",
        file=sys.stderr,
    )
    return 0


def add_cluster_commands(cli: Any) -> None:
    cluster = cli.add_parser("cluster", help="this node's cluster membership")
    sub = cluster.add_subparsers(dest="cluster_command", required=True)
    token = sub.add_parser("token", help="print the join token (the cluster secret: keep it private)")
    token.add_argument("--home", default=None, help="data directory (default: $SKULK_HOME or ~/.skulk)")
    token.add_argument("-q", "--quiet", action="store_true", help="print the token only")
    token.set_defaults(func=cmd_cluster_token)
