"""`skulk-kernel service install|uninstall|status`: registered by this plugin (`register_cli_commands`).

Install prints the exact file it writes and its path (`--dry-run` prints without writing), so an
operator can read what will run at boot before it does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .service import (
    ServiceError,
    ServiceSpec,
    default_kind,
    enable_commands,
    install,
    node_command,
    render,
    service_path,
    status,
    uninstall,
)


def _home(args: argparse.Namespace) -> Path:
    return Path(args.home or os.environ.get("SKULK_HOME", "~/.skulk")).expanduser().resolve()


def _run(argv: list[str]) -> int:
    print("$ " + " ".join(argv))
    try:
        return subprocess.run(argv, check=False).returncode
    except FileNotFoundError:
        print(f"warning: {argv[0]} not found", file=sys.stderr)
        return 127


def cmd_install(args: argparse.Namespace) -> int:
    if args.system and sys.platform == "darwin":
        print("error: --system is for Linux; macOS gets a launchd agent of the signed-in user", file=sys.stderr)
        return 2
    if args.system and os.geteuid() != 0:
        print("error: --system writes /etc/systemd/system: run it as root (sudo)", file=sys.stderr)
        return 2
    kind = default_kind(args.system)
    extra: list[str] = ["--api-port", str(args.api_port)] if args.api_port else []
    extra += ["--offline"] if args.offline else []
    spec = ServiceSpec(
        kind=kind,
        profile=args.profile or os.environ.get("SKULK_PROFILE", "cpu-llamacpp"),
        home=_home(args),
        command=node_command(),
        extra_args=tuple(extra),
        run_as=args.run_as or (os.environ.get("SUDO_USER") if args.system else None),
    )
    path = service_path(kind)
    print(f"# {path}")
    print(render(spec), end="")
    if args.dry_run:
        print("# --dry-run: nothing written")
        return 0
    try:
        manifest = install(spec, path, enable=args.now, runner=_run)
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"# wrote {path}; what was written is listed in {_home(args) / 'service-manifest.json'}")
    if not args.now:
        print("# start it now and at every boot:")
        for argv in enable_commands(kind, path, on=True):
            print("  " + " ".join(argv))
    if kind == "systemd-user":
        print("# keep it running while you are logged out: loginctl enable-linger $USER")
    return 0 if manifest.enabled or not args.now else 1


def cmd_uninstall(args: argparse.Namespace) -> int:
    try:
        for line in uninstall(_home(args), force=args.force, runner=_run):
            print(line)
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    for line in status(_home(args)):
        print(line)
    return 0


def add_service_command(cli: Any) -> None:
    service = cli.add_parser("service", help="run this node as a systemd unit (Linux) or launchd agent (macOS)")
    ssub = service.add_subparsers(dest="service_command", required=True)
    inst = ssub.add_parser("install", help="write the unit / agent file and print it")
    inst.add_argument("--profile", default=None, help="profile the service runs (default: $SKULK_PROFILE)")
    inst.add_argument("--home", default=None, help="the node's data directory (default: $SKULK_HOME or ~/.skulk)")
    inst.add_argument("--api-port", type=int, default=None)
    inst.add_argument("--offline", action="store_true", help="the service runs with --offline")
    inst.add_argument("--system", action="store_true", help="a system unit in /etc/systemd/system (root)")
    inst.add_argument("--run-as", default=None, help="User= of a system unit (default: $SUDO_USER)")
    inst.add_argument("--now", action="store_true", help="also enable and start it (systemctl / launchctl)")
    inst.add_argument("--dry-run", action="store_true", help="print the file, write nothing")
    inst.set_defaults(func=cmd_install)
    uninst = ssub.add_parser("uninstall", help="remove only what install wrote")
    uninst.add_argument("--home", default=None)
    uninst.add_argument("--force", action="store_true", help="remove a written file even if edited since")
    uninst.set_defaults(func=cmd_uninstall)
    stat = ssub.add_parser("status", help="what is installed, and whether it is still as written")
    stat.add_argument("--home", default=None)
    stat.set_defaults(func=cmd_status)
