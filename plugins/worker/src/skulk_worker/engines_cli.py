"""`skulk-kernel engines install NAME` / `engines status`: the environments engines live in.

The worker runs engines, so it owns the command that prepares them (a vLLM venv, a diffusers
overlay). Installers come from every installed, compatible plugin through
`register_engine_installers`, whatever the profile, so several engine plugins never clash.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from skulk_kernel.api import (
    GuardedHooks,
    PluginLoadError,
    Profile,
    build_plugin_manager,
    installed_plugins,
    kernel_version,
)


def engine_installers() -> dict[str, Any]:
    """Every installed, compatible plugin's installers (one that fails to import is skipped, said)."""
    found: dict[str, Any] = {}
    running = kernel_version()
    for name, info in sorted(installed_plugins().items()):
        if not info.kernel_compatible(running):
            continue
        try:
            pm = build_plugin_manager(Profile(name=f"engines:{name}", plugins=[name]))
        except PluginLoadError as exc:
            print(f"warning: {exc}", file=sys.stderr)
            continue
        GuardedHooks(pm).call("register_engine_installers", register=lambda i: found.setdefault(i.name, i))
    return found


def cmd_engines(args: argparse.Namespace) -> int:
    installers = engine_installers()
    if args.engines_command == "status":
        for name, installer in sorted(installers.items()):
            print(f"{name:<10} {installer.status()}")
        return 0
    installer = installers.get(args.engine)
    if installer is None:
        known = ", ".join(sorted(installers)) or "none (install an engine plugin first)"
        print(f"error: no installer for engine {args.engine!r}; installable: {known}", file=sys.stderr)
        return 2
    return int(installer.install(list(args.options)))


def add_engines_command(cli: Any) -> None:
    engines = cli.add_parser("engines", help="install engines that live in their own environment")
    esub = engines.add_subparsers(dest="engines_command", required=True)
    install = esub.add_parser("install", help="create an engine's environment: NAME [its own options]")
    install.add_argument("engine")
    install.add_argument("options", nargs=argparse.REMAINDER, help="passed to the engine's installer")
    install.set_defaults(func=cmd_engines)
    esub.add_parser("status", help="which engine environments exist").set_defaults(func=cmd_engines)
