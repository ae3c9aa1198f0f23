"""`skulk-kernel extensions list`: what was found in skulk.extensions, loaded or refused, and why.

It loads the extensions the way a node does (the profile's names, or all installed), in this
process, so what it prints is what a node started with the same profile would do.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .config import PLUGIN, ProvidersConfig


def _names(profile_ref: str | None) -> Any:
    if not profile_ref:
        return "all"
    from skulk_kernel.api import load_profile

    table = load_profile(profile_ref, compose=False).plugin_config.get(PLUGIN) or {}
    return ProvidersConfig.model_validate(table).extensions


def cmd_extensions(args: argparse.Namespace) -> int:
    from .extensions import load

    loaded = load(_names(args.profile))
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in loaded.records], indent=2))
        return 0
    if not loaded.records:
        print("no extensions installed (entry-point group skulk.extensions); docs/extensions.md says how to write one")
        return 0
    for record in loaded.records:
        print(record.line())
    sys.stdout.flush()
    return 0


def add_extensions_command(cli: Any) -> None:
    ext = cli.add_parser("extensions", help="extensions (skulk.extensions): found, loaded, refused and why")
    esub = ext.add_subparsers(dest="extensions_command", required=True)
    listing = esub.add_parser("list", help="load every extension as a node would and say what happened")
    listing.add_argument("--profile", default=None, help="use this profile's [plugins.providers] extensions names")
    listing.add_argument("--json", action="store_true", help="print the records as JSON")
    listing.set_defaults(func=cmd_extensions)
