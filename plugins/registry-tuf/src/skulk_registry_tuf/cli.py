"""`skulk-kernel registry init|sign`: create a signed card registry and publish card files into it.

    skulk-kernel registry init ./my-registry          keys/ (private: keep it) and repo/ (serve it)
    skulk-kernel registry sign ./cards ./my-registry  sign every cards/*.toml as the next version

Serve `./my-registry/repo` over HTTP(S) (any static file server) and give every node the
root.json that `init` printed (`[plugins.registry-tuf] root`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def cmd_init(args: argparse.Namespace) -> int:
    from .repository import RegistryError, init_registry

    try:
        root = init_registry(Path(args.directory), root_expires_in_s=args.root_expires_days * 86400)
    except RegistryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    directory = Path(args.directory)
    print(root)
    print(
        f"registry created: private keys in {directory / 'keys'} (never serve them), "
        f"serve {directory / 'repo'}; nodes trust {root} ([plugins.registry-tuf] root)",
        file=sys.stderr,
    )
    return 0


def cmd_sign(args: argparse.Namespace) -> int:
    from .cards import CardError
    from .repository import RegistryError, sign_cards

    lifetimes = {"timestamp": args.timestamp_expires_in_s}
    if args.targets_expires_days is not None:
        lifetimes["targets"] = args.targets_expires_days * 86400
    try:
        versions = sign_cards(Path(args.cards), Path(args.directory), expires_in_s=lifetimes)
    except (RegistryError, CardError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(versions))
    return 0


def add_registry_commands(cli: Any) -> None:
    registry = cli.add_parser("registry", help="a signed model-card registry (TUF): init, sign")
    sub = registry.add_subparsers(dest="registry_command", required=True)
    init = sub.add_parser("init", help="create keys (ed25519) and the root metadata in a new directory")
    init.add_argument("directory")
    init.add_argument("--root-expires-days", type=float, default=365.0)
    init.set_defaults(func=cmd_init)
    sign = sub.add_parser("sign", help="sign a directory of card files (*.toml) as the registry's next version")
    sign.add_argument("cards", help="a directory of card TOML files (the store's card format)")
    sign.add_argument("directory", help="the registry directory `init` created")
    sign.add_argument(
        "--timestamp-expires-in-s",
        type=float,
        default=7 * 86400.0,
        help="timestamp lifetime in seconds (default 7 days; negative signs an expired one, for drills)",
    )
    sign.add_argument("--targets-expires-days", type=float, default=None, help="default 90")
    sign.set_defaults(func=cmd_sign)
